"""What `angpt compare` runs: arms x token budgets x seeds, plus a per-arm learning-rate sweep.

An arm is a named architecture with optional config overrides, written ``[LABEL=]NAME[KEY=VALUE,...]``:

    angpt                                   the built-in arm "angpt"
    angpt[nu_att=sqrt_pos]                  anGPT with one model field changed (label "angpt[nu_att=sqrt_pos]")
    sqrtpos=angpt[nu_att=sqrt_pos,alpha_init=0.01]   the same, labelled "sqrtpos"
    gpt+[train.weight_decay=0]              a train setting that does not touch the data (see ARM_TRAIN_KEYS)
    r=gpt+[tune.weight_decay=0:0.1,tune.warmup=0:0.01:0.05]
                                            GPT+ re-tuned: at every budget, LR x weight decay x warm-up
                                            fraction, the best setting chosen by validation loss (TUNE_KEYS)

Keys without a section are model fields (:class:`angpt.models.ModelConfig`); values are YAML scalars.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.errors import ConfigError, UserError
from angpt.models import registry
from angpt.train.config import load_yaml

# The built-in arms are the registry's architectures and named variants (models/registry.py).
DEFAULT_ARMS = ("gpt", "gpt+", "ngpt", "angpt")
DEFAULT_LR_GRID = (0.25, 0.5, 1.0, 2.0, 4.0)

# Train settings an arm (or --set) may change: they shape the optimisation, not the tokens seen. Everything that
# decides which tokens a run sees, or how it is evaluated (batch_tokens, seq_len, micro_batch, seed, max_steps,
# eval_batches), is a plan-level option, identical for every arm.
ARM_TRAIN_KEYS = frozenset(
    {"weight_decay", "warmup_steps", "min_lr_ratio", "beta1", "beta2", "grad_clip"}
    | {"schedule", "decay_fraction", "decay_shape"}  # the LR schedule's shape (cosine by default, or wsd)
)
SETTINGS_TRAIN_KEYS = ARM_TRAIN_KEYS | {"compile", "deterministic"}
# Train settings an arm may tune per budget (``tune.KEY=V:V:...``): "warmup" is a fraction of the run's steps (a
# step count cannot mean the same at every budget); the others are the train keys of the same name.
TUNE_KEYS = (ARM_TRAIN_KEYS - {"warmup_steps"}) | {"warmup"}
# docs/protocol.md#missing-controls (SPEC section 7): the re-tuned baseline's grid, swept with the LR.
RETUNE_GRID: dict[str, list[float]] = {"weight_decay": [0.0, 0.1], "warmup": [0.0, 0.01, 0.05]}
STATS = ("paired", "welch")  # the test that leads the verdict (both are reported)
_PLAN_FLAG = {
    "batch_tokens": "--batch-tokens",
    "seq_len": "--seq-len",
    "micro_batch": "--micro-batch",
    "seed": "--seeds",
    "max_steps": "--budgets",
    "eval_batches": "--eval-batches",
    "lr": "--lr / --lr-grid",
    "dtype": "--dtype",
    "device": "--device",
}


# ------------------------------------------------------------------------------------------------ tokens
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_tokens(text: str | int) -> int:
    """A token count: ``4096``, ``512K``, ``1.5M``, ``2G`` (powers of 1000) or ``64Ki``, ``1Mi`` (powers of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmg]i?)?\s*", str(text), flags=re.IGNORECASE)
        if not m:
            raise UserError(f"bad token count {text!r}; use e.g. 4096, 512K, 1M, 1Mi (=1048576) or 2G")
        value_f = float(m.group(1)) * _SUFFIX[(m.group(2) or "").lower()]
        if value_f != int(value_f):
            raise UserError(f"token count {text!r} is not a whole number of tokens")
        value = int(value_f)
    if value <= 0:
        raise UserError(f"token count {text!r} must be positive")
    return value


def format_tokens(n: float) -> str:
    """A compact exact name for a token count (1M, 64Ki, 12345); approximate (~1.3M) when not whole."""
    if n != int(n):
        for div, s in ((10**9, "G"), (10**6, "M"), (10**3, "K")):
            if n >= div:
                return f"~{n / div:.3g}{s}"
        return f"~{n:.0f}"
    n = int(n)
    for div, s in ((10**9, "G"), (2**30, "Gi"), (10**6, "M"), (2**20, "Mi"), (10**3, "K"), (2**10, "Ki")):
        if n >= div and n % div == 0:
            return f"{n // div}{s}"
    return str(n)


def format_lr(lr: float) -> str:
    """A learning rate as it appears in run directory names and tables (6 significant digits)."""
    return f"{lr:.6g}"


def round_lr(lr: float) -> float:
    """Round to the 6 significant digits of :func:`format_lr`, so a value and its directory name agree."""
    return float(format_lr(lr))


# -------------------------------------------------------------------------------------------------- arms
@dataclass
class Arm:
    """One contender: a built-in arm (architecture + overrides) with the user's extra overrides."""

    label: str
    base: str  # a registry architecture or variant name
    arch: str
    model: dict[str, Any] = field(default_factory=dict)  # model overrides (built-in ones first, then the user's)
    train: dict[str, Any] = field(default_factory=dict)  # train overrides (ARM_TRAIN_KEYS only)
    tune: dict[str, list[float]] = field(default_factory=dict)  # TUNE_KEYS swept at every budget with the LR

    @property
    def slug(self) -> str:
        """The label as a directory name: ``angpt[nu_att=sqrt_pos]`` -> ``angpt__nu_att-sqrt_pos``."""
        s = self.label.replace("[", "__").replace("]", "").replace(",", "__").replace("=", "-")
        return re.sub(r"[^A-Za-z0-9_.+-]", "_", s)

    def settings(self) -> list[Setting]:
        """Every combination of the tuned values (sorted keys), or the one empty setting of an untuned arm."""
        combos: list[Setting] = [()]
        for key in sorted(self.tune):
            combos = [c + ((key, float(v)),) for c in combos for v in self.tune[key]]
        return combos

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if not self.tune:  # plans written before arms could tune compare equal to ones without the key
            d.pop("tune")
        return d


# A tuned setting of one run: sorted (key, value) pairs of TUNE_KEYS; () for an untuned arm.
Setting = tuple[tuple[str, float], ...]


def format_setting(setting: Setting) -> str:
    """``weight_decay=0.1, warmup=5%`` (empty for no setting)."""
    return ", ".join(_setting_item(k, v) for k, v in setting)


def _setting_item(key: str, value: float) -> str:
    return f"{key}={value * 100:g}%" if key == "warmup" else f"{key}={value:g}"


def warmup_steps(fraction: float, steps: int) -> int:
    """Warm-up steps of a run of `steps` steps for a warm-up `fraction`: rounded, at least 1 when positive."""
    return 0 if fraction <= 0 else max(1, round(fraction * steps))


def split_arms(text: str) -> list[str]:
    """Split a comma-separated arm list, keeping commas inside ``[...]``: ``a,b[x=1,y=2]`` -> [a, b[x=1,y=2]]."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UserError(f"unbalanced ']' in arm list {text!r}")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if depth:
        raise UserError(f"unbalanced '[' in arm list {text!r}")
    out.append(cur.strip())
    return [a for a in out if a]


_ARM_RE = re.compile(r"(?:(?P<label>[A-Za-z0-9_.+-]+)=)?(?P<base>[A-Za-z0-9_+]+)(?:\[(?P<opts>.*)\])?")


def parse_arm(text: str) -> Arm:
    """Parse ``[LABEL=]NAME[KEY=VALUE,...]`` (see the module docstring) into an :class:`Arm`."""
    from angpt.models.config import ModelConfig

    m = _ARM_RE.fullmatch(text.strip())
    if not m:
        raise UserError(f"bad arm {text!r}; write NAME, NAME[key=value,...] or LABEL=NAME[key=value,...]")
    base = m.group("base")
    try:
        arch, model = registry.resolve_arm(base)
    except ConfigError as e:
        raise UserError(f"arm {text!r}: {e}") from None
    train: dict[str, Any] = {}
    tune: dict[str, list[float]] = {}
    model_keys = {f.name for f in dataclasses.fields(ModelConfig)} - {"arch", "extra"}
    for item in _split_opts(m.group("opts") or ""):
        if "=" not in item:
            raise UserError(f"arm {text!r}: option {item!r} must look like key=value")
        key, raw = (s.strip() for s in item.split("=", 1))
        section, _, name = key.rpartition(".")
        value = load_yaml(raw) if raw and section != "tune" else None
        if section in ("", "model"):
            if name not in model_keys:
                raise UserError(
                    f"arm {text!r}: unknown model key {name!r}; valid keys: {', '.join(sorted(model_keys))}"
                )
            model[name] = value
        elif section == "train":
            if name not in ARM_TRAIN_KEYS:
                hint = f" (a plan-level option: {_PLAN_FLAG[name]})" if name in _PLAN_FLAG else ""
                raise UserError(
                    f"arm {text!r}: train.{name} cannot differ between arms{hint}; "
                    f"per-arm train keys: {', '.join(sorted(ARM_TRAIN_KEYS))}"
                )
            train[name] = value
        elif section == "tune":
            tune[name] = _tune_values(text, name, raw)
        else:
            raise UserError(f"arm {text!r}: key {key!r} must be a model field, train.KEY or tune.KEY")
    clash = sorted(set(tune) & set(train))
    if "warmup" in tune and "warmup_steps" in train:
        clash.append("warmup_steps")
    if clash:
        raise UserError(f"arm {text!r}: {clash[0]} is both set (train.) and tuned (tune.); keep one")
    label = m.group("label") or text.strip()
    return Arm(label=label, base=base, arch=arch, model=model, train=train, tune=tune)


def _tune_values(text: str, name: str, raw: str) -> list[float]:
    """``tune.KEY=V:V:...`` -> sorted distinct floats (a warm-up fraction must lie in [0, 1))."""
    if name not in TUNE_KEYS:
        raise UserError(f"arm {text!r}: tune.{name} cannot be tuned; tunable: {', '.join(sorted(TUNE_KEYS))}")
    try:
        values = sorted({float(v) for v in raw.split(":") if v.strip()})
    except ValueError:
        raise UserError(f"arm {text!r}: tune.{name}={raw!r} must be numbers separated by ':'") from None
    if not values or not all(math.isfinite(v) and v >= 0 for v in values):
        raise UserError(f"arm {text!r}: tune.{name}={raw!r} must be non-negative numbers separated by ':'")
    if name == "warmup" and max(values) >= 1:
        raise UserError(f"arm {text!r}: tune.warmup values are fractions of the run's steps, in [0, 1)")
    return values


def retuned(arm: Arm) -> Arm:
    """`arm` re-tuned (SPEC section 7): LR x weight decay {0, 0.1} x warm-up {0, 1%, 5%} at every budget, labelled
    ``LABEL_retuned``. Its own weight decay and warm-up settings give way to the grid."""
    train = {k: v for k, v in arm.train.items() if k not in ("weight_decay", "warmup_steps")}
    tune = {**arm.tune, **{k: list(v) for k, v in RETUNE_GRID.items()}}
    return Arm(f"{arm.label}_retuned", arm.base, arm.arch, dict(arm.model), train, tune)


def _split_opts(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_settings(items: list[str]) -> dict[str, Any]:
    """``--set`` items (``model.KEY=V``, ``KEY=V`` meaning a model key, or ``train.KEY=V``) -> {dotted: value}."""
    from angpt.models.config import ModelConfig

    model_keys = {f.name for f in dataclasses.fields(ModelConfig)} - {"arch", "extra"}
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--set {item!r} must look like model.KEY=VALUE or train.KEY=VALUE")
        key, raw = (s.strip() for s in item.split("=", 1))
        value = load_yaml(raw) if raw else None
        section, _, name = key.rpartition(".")
        if section in ("", "model"):
            if name not in model_keys:
                raise UserError(f"--set {item!r}: unknown model key {name!r}; valid: {', '.join(sorted(model_keys))}")
            out[f"model.{name}"] = value
        elif section == "train":
            if name not in SETTINGS_TRAIN_KEYS:
                hint = f"; use {_PLAN_FLAG[name]}" if name in _PLAN_FLAG else ""
                raise UserError(
                    f"--set {item!r}: train.{name} is not settable here{hint}; "
                    f"settable: {', '.join(sorted(SETTINGS_TRAIN_KEYS))}"
                )
            out[f"train.{name}"] = value
        else:
            raise UserError(f"--set {item!r}: key must be model.KEY or train.KEY")
    return out


# -------------------------------------------------------------------------------------------------- plan
@dataclass
class Plan:
    """A whole comparison. Build with :func:`make_plan` (it validates and resolves defaults).

    The sweep runs every arm over its LR grid at the smallest budget with the first seed; the best LR (lowest
    final validation loss) is then used for every budget and seed. A best LR at an edge of the grid extends the
    grid by one step in that direction, at most `max_extensions` times per arm. An arm with tuned settings
    (``tune.KEY=...``) is swept over LR x settings at every budget instead, and uses each budget's best.
    """

    data: str
    arms: list[Arm]
    baseline: str
    budgets: list[int]
    seeds: list[int]
    preset: str = "demo"
    batch_tokens: int = 16384
    seq_len: int = 0  # resolved by make_plan (the preset's context length unless given)
    micro_batch: int = 0  # resolved by make_plan
    lr_grid: list[float] = field(default_factory=lambda: list(DEFAULT_LR_GRID))  # multipliers of the centre
    lr: dict[str, float] = field(default_factory=dict)  # centre LR per arm label (default: the recipe's at preset)
    # The centre each arm's sweep uses, recorded by make_plan (`lr`, else the recipe's rate at `preset`), so that a
    # stored plan keeps its centres when a recipe's default rate changes; it stands for `lr` in the identity.
    centres: dict[str, float] = field(default_factory=dict)
    lr_values: dict[str, list[float]] = field(default_factory=dict)  # an explicit absolute grid per arm label
    max_extensions: int = 2
    settings: dict[str, Any] = field(default_factory=dict)  # "model.KEY"/"train.KEY" -> value, every arm
    eval_batches: int = 20
    eval_points: int = 10  # validation evaluations per run (for the loss-vs-tokens plot), the last at the end
    dtype: str = "auto"
    # Not part of the plan's identity: they change where and how fast runs go, or only the analysis.
    device: str = "auto"
    extrapolate: bool = False
    stat: str = "paired"  # the test that leads the verdict (STATS); both are reported
    data_fingerprint: dict[str, Any] = field(default_factory=dict)
    # Selection apart from measurement (docs/protocol.md). Sweeps run on `tuning_seed`, which is not among the
    # reported seeds; losses are reported on `report_split` ("test": documents no choice has seen). Plans written
    # before these existed (None, "val") swept on their first seed, whose sweep run was also its reported run.
    tuning_seed: int | None = None
    report_split: str = "val"

    # ------------------------------------------------------------------------------------------- lookups
    def arm(self, label: str) -> Arm:
        for a in self.arms:
            if a.label == label:
                return a
        raise UserError(f"no arm {label!r} in this plan; arms: {', '.join(a.label for a in self.arms)}")

    def steps(self, budget: int) -> int:
        return budget // self.batch_tokens

    @property
    def sweep_budget(self) -> int:
        return self.budgets[0]

    @property
    def sweep_seed(self) -> int:
        """The seed the LR sweeps run on: the tuning seed, or for an older plan its first seed."""
        return self.tuning_seed if self.tuning_seed is not None else self.seeds[0]

    def tunes_at(self, arm: Arm, budget: int) -> bool:
        """Whether `arm` is swept at `budget`: every arm at the smallest budget, a tuned arm at every budget."""
        return budget == self.sweep_budget or bool(arm.tune)

    def centre_lr(self, arm: Arm) -> float:
        if arm.label in self.centres:
            return float(self.centres[arm.label])
        return float(self.lr.get(arm.label, registry.get(arm.arch).recipe.lr_for(self.preset)))

    def initial_grid(self, arm: Arm) -> list[float]:
        """The arm's LR grid before any extension, ascending."""
        if arm.label in self.lr_values:
            return sorted({round_lr(v) for v in self.lr_values[arm.label]})
        c = self.centre_lr(arm)
        return sorted({round_lr(c * m) for m in self.lr_grid})

    @staticmethod
    def extend(grid: list[float], direction: int) -> float:
        """The next LR beyond the low (-1) or high (+1) edge: the edge's neighbour ratio (x2 for one point)."""
        if len(grid) == 1:
            ratio = 2.0
        elif direction < 0:
            ratio = grid[1] / grid[0]
        else:
            ratio = grid[-1] / grid[-2]
        return round_lr(grid[0] / ratio) if direction < 0 else round_lr(grid[-1] * ratio)

    def run_dir(
        self, report_dir: str | Path, arm: Arm, budget: int, seed: int, lr: float, setting: Setting = ()
    ) -> Path:
        name = f"lr{format_lr(lr)}" + "".join(f"_{k}{format_lr(v)}" for k, v in setting)
        return Path(report_dir) / "runs" / arm.slug / str(budget) / f"seed{seed}" / name

    def eval_every(self, budget: int) -> int:
        return max(1, math.ceil(self.steps(budget) / self.eval_points))

    def save_every(self, budget: int) -> int:
        # Long runs checkpoint four times so an interruption loses little; short ones (cheap to redo) save only
        # their final step, which keeps small comparisons fast.
        steps = self.steps(budget)
        return steps // 4 if steps >= 40 else 0

    def run_overrides(
        self, arm: Arm, budget: int, seed: int, lr: float, out: str | Path, setting: Setting = ()
    ) -> list[tuple[str, Any]]:
        """The `load_run_config` overrides of one run. Data, tokens and evaluation are the same for every arm."""
        ov: list[tuple[str, Any]] = [
            ("arch", arm.arch),
            ("preset", self.preset),
            ("data", self.data),
            ("out", str(out)),
            ("resume", "auto"),
        ]
        model = {k.split(".", 1)[1]: v for k, v in self.settings.items() if k.startswith("model.")}
        model.update(arm.model)
        ov += [(f"model.{k}", v) for k, v in model.items()]
        ov += [(k, v) for k, v in self.settings.items() if k.startswith("train.")]
        ov += [(f"train.{k}", v) for k, v in arm.train.items()]
        for k, v in setting:  # a warm-up fraction becomes this budget's step count
            if k == "warmup":
                ov.append(("train.warmup_steps", warmup_steps(v, self.steps(budget))))
            else:
                ov.append((f"train.{k}", v))
        ov += [
            ("train.max_steps", self.steps(budget)),
            ("train.stop_at", None),  # no arm is stopped early
            ("train.batch_tokens", self.batch_tokens),
            ("train.seq_len", self.seq_len),
            ("train.micro_batch", self.micro_batch),
            ("train.seed", seed),  # the seed sets init and data order: the same for every arm
            ("train.lr", lr),
            ("train.dtype", self.dtype),
            ("train.device", self.device),
            ("train.eval_every", self.eval_every(budget)),
            ("train.eval_batches", self.eval_batches),
            ("train.log_every", 1),  # every step's step_time feeds the step-time comparison
            ("train.save_every", self.save_every(budget)),
            ("train.keep_last", 1),
            ("train.tensorboard", False),
            ("train.wandb", False),
        ]
        return ov

    # ------------------------------------------------------------------------------------------ identity
    def identity(self) -> dict[str, Any]:
        """Everything that decides what the runs compute: two plans with equal identities share a report dir."""
        d = self.to_dict()
        for k in NOT_IDENTITY:
            d.pop(k, None)
        return d

    @staticmethod
    def shared_identity(identity: dict[str, Any], labels: set[str]) -> dict[str, Any]:
        """What two plans extending one another must share: an identity without budgets and seeds, restricted
        to the arms `labels` both hold (sorted by label), and to their --lr / --lr-values entries.

        Finished runs are found by their directory, which names arm, budget, seed and LR, so arms may be added
        or dropped, budgets and seeds changed, and max_extensions raised (an unfinished sweep goes on) or lowered;
        anything else would change the runs the two plans share.
        """
        d = {k: v for k, v in identity.items() if k not in (*EXTENDABLE, *NOT_IDENTITY)}
        d["arms"] = sorted((a for a in d.get("arms", []) if a.get("label") in labels), key=lambda a: a["label"])
        for key in ("centres", "lr_values"):
            d[key] = {k: v for k, v in (d.get(key) or {}).items() if k in labels}
        return d

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["arms"] = [a.to_dict() for a in self.arms]
        return json.loads(json.dumps(d))  # normalise (tuples -> lists, int keys -> str)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        d = dict(d)
        d["arms"] = [Arm(**a) for a in d["arms"]]
        if "centres" not in d:  # stored before centres were recorded: its centres were `lr`, else the recipe's rate
            d["centres"] = _legacy_centres(d["arms"], d.get("lr") or {})
        return cls(**d)


# Plan fields a re-run may change: every finished run it shares with the stored plan computes the same.
EXTENDABLE = ("budgets", "seeds", "max_extensions")

# Plan fields that change neither which runs exist nor what they compute: where and how fast runs go, and the
# analysis of their results.
NOT_IDENTITY = ("data", "device", "extrapolate", "stat", "report_split", "lr")  # `lr`: its centres stand for it


def _legacy_centres(arms: list[Arm], lr: dict[str, float]) -> dict[str, float]:
    """The centres of a plan stored before 2026-11-26: `lr`, else the recipe's one rate at every preset (before
    Recipe.lr_at). An arm whose architecture is no longer registered keeps none (its identity differs anyway)."""
    centres = {}
    for arm in arms:
        try:
            centres[arm.label] = float(lr.get(arm.label, registry.get(arm.arch).recipe.lr))
        except ConfigError:
            continue
    return centres


def dataset_fingerprint(data: str | Path) -> dict[str, Any]:
    """What identifies a prepared dataset's content (not its path or preparation time)."""
    from angpt.data import load_meta

    meta = load_meta(data)
    splits = {
        name: {k: s.get(k) for k in ("tokens", "bytes", "documents")} for name, s in sorted(meta["splits"].items())
    }
    ident = {
        "tokenizer_hash": meta.get("tokenizer_hash"),
        "vocab_size": meta["vocab_size"],
        "splits": splits,
        "source": meta.get("source"),
    }
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return {**ident, "digest": digest}


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max(k for k in range(1, min(n, cap) + 1) if n % k == 0)


def make_plan(
    data: str | Path,
    *,
    arms: list[str | Arm] | None = None,
    baseline: str | None = None,
    budgets: list[int | str],
    seeds: list[int] | None = None,
    preset: str = "demo",
    batch_tokens: int | str = 16384,
    seq_len: int | None = None,
    micro_batch: int | None = None,
    lr_grid: list[float] | None = None,
    lr: dict[str, float] | None = None,
    lr_values: dict[str, list[float]] | None = None,
    max_extensions: int = 2,
    settings: dict[str, Any] | list[str] | None = None,
    eval_batches: int = 20,
    eval_points: int = 10,
    dtype: str = "auto",
    device: str = "auto",
    extrapolate: bool = False,
    retune: list[str] | None = None,
    stat: str = "paired",
    tuning_seed: int | None = 1000,
) -> Plan:
    """Build and validate a :class:`Plan`; every problem is a one-line :class:`UserError` before any run starts.

    Arms are strings in the ``[LABEL=]NAME[KEY=VALUE,...]`` syntax (default: gpt, gpt+, ngpt, angpt). The
    baseline defaults to gpt+ when present, else the first arm. Budgets are token counts (``4096``, ``1M``,
    ``1Mi``); each must be a whole number (>= 1) of `batch_tokens` steps. `lr` and `lr_values` are keyed by arm
    label; `settings` are ``model.KEY``/``train.KEY`` overrides applied to every arm. Each label in `retune`
    adds that arm re-tuned (:func:`retuned`: ``LABEL_retuned``). `stat` ("paired" or "welch") is the test that
    leads the verdicts. Learning rates (and tuned settings) are chosen on `tuning_seed` by validation loss; the
    reported losses are the other seeds' on the test split (the validation split for a dataset without one).
    `tuning_seed` None is the older design: the sweeps run on the first seed, whose sweep run is also its reported
    run (how plans written before 2026-11-25 read; kept for them and for tests of the run mechanics).
    """
    from angpt.data import check_compatible, load_meta
    from angpt.models.config import PRESETS
    from angpt.models.registry import make_config

    arm_objs = [a if isinstance(a, Arm) else parse_arm(a) for a in (arms if arms is not None else DEFAULT_ARMS)]
    if not arm_objs:
        raise UserError("no arms: give at least one, e.g. --arms gpt+,angpt")
    for label in retune or []:
        match = [a for a in arm_objs if a.label == label]
        if not match:
            raise UserError(f"--retune {label!r} is not one of the arms ({', '.join(a.label for a in arm_objs)})")
        arm_objs.append(retuned(match[0]))
    if stat not in STATS:
        raise UserError(f"unknown statistic {stat!r}; use one of: {', '.join(STATS)}")
    labels = [a.label for a in arm_objs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise UserError(f"arm {dup[0]!r} is given twice; give repeated arms distinct labels (LABEL=NAME[...])")
    slugs = [a.slug for a in arm_objs]
    if len(set(slugs)) != len(slugs):
        raise UserError(f"arm labels {labels} map to clashing directory names; choose other labels")
    if baseline is None:
        baseline = registry.BASELINE if registry.BASELINE in labels else labels[0]
    if baseline not in labels:
        raise UserError(f"baseline {baseline!r} is not one of the arms ({', '.join(labels)}); add it to --arms")
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; use one of: {', '.join(PRESETS)}")

    if not budgets:
        raise UserError("no token budgets: give at least one, e.g. --budgets 1M,2M,4M")
    budget_ints = sorted({parse_tokens(b) for b in budgets})
    bt = parse_tokens(batch_tokens)
    for b in budget_ints:
        if b < bt:
            raise UserError(f"budget {format_tokens(b)} ({b} tokens) is less than one step of {bt} batch tokens")
        if b % bt:
            lo, hi = (b // bt) * bt, (b // bt + 1) * bt
            raise UserError(
                f"budget {b} tokens is not a whole number of steps of {bt} batch tokens; use {lo} or {hi}, "
                "or a binary suffix (1Mi = 1048576)"
            )
    seeds = [0] if seeds is None else list(seeds)
    if not seeds:
        raise UserError("no seeds: give at least one, e.g. --seeds 0,1,2")
    if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise UserError(f"seeds {seeds} must be distinct non-negative integers")

    grid = list(DEFAULT_LR_GRID) if lr_grid is None else [float(m) for m in lr_grid]
    if not grid or any(not (math.isfinite(m) and m > 0) for m in grid):
        raise UserError(f"LR grid {lr_grid} must be a non-empty list of positive multipliers")
    grid = sorted(set(grid))
    lr = dict(lr or {})
    lr_values = {k: [float(v) for v in vs] for k, vs in (lr_values or {}).items()}
    for what, table in (("--lr", lr), ("--lr-values", lr_values)):
        unknown = sorted(set(table) - set(labels))
        if unknown:
            raise UserError(f"{what} names arm {unknown[0]!r}, which is not in the plan ({', '.join(labels)})")
    for k, v in lr.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise UserError(f"--lr {k}={v!r} must be a positive number")
    for k, vs in lr_values.items():
        if not vs or any(not (math.isfinite(v) and v > 0) for v in vs):
            raise UserError(f"--lr-values {k}: {vs} must be positive numbers")
    if not isinstance(max_extensions, int) or max_extensions < 0:
        raise UserError(f"max_extensions={max_extensions!r} must be a non-negative integer")
    for name, v in (("eval_batches", eval_batches), ("eval_points", eval_points)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"{name}={v!r} must be a positive integer")
    if dtype not in ("auto", "bf16", "fp32"):
        raise UserError(f"dtype={dtype!r}; use auto, bf16 or fp32")
    if isinstance(settings, list):
        settings = parse_settings(settings)
    settings = dict(settings or {})

    # The context length (and so seq_len) comes from the preset and the common settings, never from an arm,
    # so every arm reads the same windows.
    common_model = {k.split(".", 1)[1]: v for k, v in settings.items() if k.startswith("model.")}
    base_cfg = make_config(arm_objs[0].arch, preset, **common_model)
    T = seq_len or base_cfg.context_length
    if not isinstance(T, int) or T <= 0:
        raise UserError(f"seq_len={seq_len!r} must be a positive integer")
    if bt % T:
        raise UserError(f"batch tokens {bt} must be a multiple of seq_len {T}")
    seqs = bt // T
    mb = micro_batch or _largest_divisor_at_most(seqs, 16)
    if seqs % mb:
        raise UserError(f"micro_batch {mb} must divide the {seqs} sequences of one step ({bt} tokens / {T})")

    meta = load_meta(data)
    if tuning_seed is not None and tuning_seed in seeds:
        raise UserError(
            f"the tuning seed {tuning_seed} is among the reported seeds {seeds}: selection and measurement must use "
            "different seeds (docs/protocol.md); pick another --tuning-seed or other --seeds"
        )
    test = meta.get("splits", {}).get("test", {})
    plan = Plan(
        data=str(Path(data).resolve()),
        arms=arm_objs,
        baseline=baseline,
        budgets=budget_ints,
        seeds=seeds,
        preset=preset,
        batch_tokens=bt,
        seq_len=T,
        micro_batch=mb,
        lr_grid=grid,
        lr=lr,
        lr_values=lr_values,
        max_extensions=max_extensions,
        settings=settings,
        eval_batches=eval_batches,
        eval_points=eval_points,
        dtype=dtype,
        device=device,
        extrapolate=extrapolate,
        stat=stat,
        tuning_seed=tuning_seed,
        report_split="test" if test.get("tokens") else "val",
    )
    plan.centres = {a.label: plan.centre_lr(a) for a in arm_objs}

    # Resolve every arm's run config against the dataset now, so a bad key or a too-small vocabulary fails in
    # one line before anything is trained or written.
    from angpt.train.config import load_run_config
    from angpt.train.loop import resolve_model_config

    plan.data_fingerprint = dataset_fingerprint(data)
    for arm in arm_objs:
        for setting in arm.settings()[1:]:  # a tuned value the trainer refuses fails here, naming the arm
            try:
                load_run_config(None, plan.run_overrides(arm, budget_ints[0], seeds[0], 1e-3, "unused", setting))
            except UserError as e:
                raise type(e)(f"arm {arm.label!r}: {e}") from e
        cfg = load_run_config(
            None, plan.run_overrides(arm, budget_ints[0], seeds[0], plan.centre_lr(arm), out="unused")
        )
        try:
            mcfg = resolve_model_config(cfg, meta)
            check_compatible(meta, mcfg.vocab_size)
        except UserError as e:
            raise type(e)(f"arm {arm.label!r}: {e}") from e
        if T > mcfg.context_length:
            raise ConfigError(f"arm {arm.label!r}: seq_len {T} exceeds its context length {mcfg.context_length}")
    return plan
