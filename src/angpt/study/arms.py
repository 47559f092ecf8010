"""Arms: the contenders of a study, each a named architecture with optional config overrides, written
``[LABEL=]NAME[KEY=VALUE,...]``:

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
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from angpt.errors import ConfigError, UserError, did_you_mean
from angpt.models import registry
from angpt.train.config import load_yaml

# The built-in arms are the registry's architectures and named variants (models/registry.py).
DEFAULT_ARMS = ("gpt", "gpt+", "ngpt", "angpt")
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
                    f"arm {text!r}: unknown model key {name!r}{did_you_mean(name, model_keys)}; "
                    f"valid keys: {', '.join(sorted(model_keys))}"
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
                raise UserError(
                    f"--set {item!r}: unknown model key {name!r}{did_you_mean(name, model_keys)}; "
                    f"valid: {', '.join(sorted(model_keys))}"
                )
            out[f"model.{name}"] = value
        elif section == "train":
            if name not in SETTINGS_TRAIN_KEYS:
                hint = f"; use {_PLAN_FLAG[name]}" if name in _PLAN_FLAG else ""
                hint = hint or did_you_mean(name, SETTINGS_TRAIN_KEYS)
                raise UserError(
                    f"--set {item!r}: train.{name} is not settable here{hint}; "
                    f"settable: {', '.join(sorted(SETTINGS_TRAIN_KEYS))}"
                )
            out[f"train.{name}"] = value
        else:
            raise UserError(f"--set {item!r}: key must be model.KEY or train.KEY")
    return out


def parse_arms(arms: list[str | Arm] | None, default: list[str]) -> list[Arm]:
    """A study's arms, parsed (`default` where none are given); a one-line UserError for none at all."""
    parsed = [a if isinstance(a, Arm) else parse_arm(a) for a in (arms if arms is not None else default)]
    if not parsed:
        raise UserError("no arms: give at least one, e.g. --arms gpt+,angpt")
    return parsed


def check_arms(arms: list[Arm], baseline: str | None, where: str = "the arms") -> str:
    """The baseline of a study's `arms` (gpt+ where it is one, else the first), after the checks every kind of
    study makes: labels given once, directory names that do not clash, a baseline among the arms (`where` names
    them in the message)."""
    labels = [a.label for a in arms]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise UserError(f"arm {dup[0]!r} is given twice; give repeated arms distinct labels (LABEL=NAME[...])")
    slugs = [a.slug for a in arms]
    if len(set(slugs)) != len(slugs):
        raise UserError(f"arm labels {labels} map to clashing directory names; choose other labels")
    if baseline is None:
        baseline = registry.BASELINE if registry.BASELINE in labels else labels[0]
    if baseline not in labels:
        raise UserError(f"baseline {baseline!r} is not one of {where} ({', '.join(labels)}); add it to --arms")
    return baseline


def find_arm(arms: list[Arm], label: str, where: str) -> Arm:
    """The arm labelled `label`; a one-line UserError naming `where` (this plan, this ladder) and its arms."""
    for a in arms:
        if a.label == label:
            return a
    raise UserError(f"no arm {label!r} in {where}; arms: {', '.join(a.label for a in arms)}")


def study_dict(study: Any, **more: Any) -> dict[str, Any]:
    """A study's dataclass (a plan, a ladder, a batch-size study) as JSON data: its arms as dicts, `more` over its
    fields, normalised as stored (tuples -> lists, int keys -> str)."""
    return json.loads(json.dumps({**dataclasses.asdict(study), "arms": [a.to_dict() for a in study.arms], **more}))


def with_arms(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored study's fields with its arms read back as Arms (study_dict's inverse, for its class's keywords)."""
    return {**stored, "arms": [Arm(**a) for a in stored["arms"]]}
