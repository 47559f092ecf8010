"""The engine's plan: arms x token budgets x seeds, with each arm's learning-rate sweep (docs/protocol.md).

Every kind of study runs plans: a comparison is one, a scaling ladder one per size, a batch-size study one per
batch size. A plan says which runs exist and what each computes (:meth:`Plan.run_overrides`); its identity decides
whether a folder holds it. :class:`PlanOptions` are the settings every plan of a study shares.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.errors import ConfigError, UserError
from angpt.study.arms import (
    DEFAULT_ARMS,
    Arm,
    Setting,
    check_arms,
    find_arm,
    parse_arms,
    parse_settings,
    retuned,
    study_dict,
    warmup_steps,
    with_arms,
)
from angpt.units import format_lr, format_tokens, parse_tokens, round_lr

DEFAULT_LR_GRID = (0.25, 0.5, 1.0, 2.0, 4.0)
# A sweep extends its grid while its best rate sits at an edge (docs/protocol.md#learning-rate-grids): a rate too
# low learns too little and one too high diverges, so the best comes inside within a few steps. This many steps
# beyond the initial grid (x64 at a factor of 2 a step) stops one that never does (a model that diverges at every
# rate, say); the report then says the sweep is unfinished.
DEFAULT_MAX_EXTENSIONS = 6
STATS = ("paired", "welch")  # the test that leads the verdict (both are reported)


@dataclass
class Plan:
    """A whole comparison. Build with :func:`make_plan` (it validates and resolves defaults).

    The sweep runs every arm over its LR grid at one budget (`tune_budget`, by default the smallest) on the tuning
    seed; the best LR (lowest final validation loss) is then used for every budget and seed. A best LR at an edge
    of the grid extends the grid by one step in that direction until it lies inside (at most `max_extensions`
    times per arm). An arm with tuned settings (``tune.KEY=...``) is swept over LR x settings at every budget
    instead, and uses each budget's best.
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
    max_extensions: int = DEFAULT_MAX_EXTENSIONS
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
    # The budget the sweeps run at (one of `budgets`); None: the smallest. Tuning at the largest costs more and needs
    # no LR check there (a GPU race tunes each arm on full runs).
    tune_budget: int | None = None

    # ------------------------------------------------------------------------------------------- lookups
    def arm(self, label: str) -> Arm:
        return find_arm(self.arms, label, "this plan")

    def steps(self, budget: int) -> int:
        return budget // self.batch_tokens

    @property
    def sweep_budget(self) -> int:
        """The budget every arm is swept at: `tune_budget`, else the smallest."""
        return self.tune_budget if self.tune_budget is not None else self.budgets[0]

    @property
    def sweep_seed(self) -> int:
        """The seed the LR sweeps run on: the tuning seed, or for an older plan its first seed."""
        return self.tuning_seed if self.tuning_seed is not None else self.seeds[0]

    def tunes_at(self, arm: Arm, budget: int) -> bool:
        """Whether `arm` is swept at `budget`: every arm at the smallest budget, a tuned arm at every budget."""
        return budget == self.sweep_budget or bool(arm.tune)

    def checks_lr(self, arm: Arm) -> bool:
        """Whether `arm`'s LR, chosen at a smaller budget than the largest, is checked there (docs/protocol.md):
        plans with a tuning seed apart from the reported ones, arms swept only at the smallest budget, and a real
        grid (sweep.check_specs runs the check)."""
        return (
            self.tuning_seed is not None
            and len(self.budgets) > 1
            and not self.tunes_at(arm, self.budgets[-1])
            and len(self.initial_grid(arm)) > 1
        )

    def centre_lr(self, arm: Arm) -> float:
        if arm.label in self.centres:
            return float(self.centres[arm.label])
        return float(self.lr.get(arm.label, recipe_lr(arm.arch, self.preset)))

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
            ("train.loss_curve", False),  # the report draws every run's curve (0.3 s a run on a CPU: a loan's time)
            ("train.progress", False),  # the study has one progress bar over the whole plan
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
        return study_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        d = with_arms(d)
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
            centres[arm.label] = float(lr.get(arm.label, recipe_lr(arm.arch, None)))
        except ConfigError:
            continue
    return centres


def recipe_lr(arch: str, preset: str | None) -> float:
    """The rate a study centres an arm's sweep on where --lr leaves it: the one a run of the arm takes with train.lr
    unset (train/setup.py's recipe_rate: its recipe's at `preset`; None: at the small presets, what a ladder's
    dial-made sizes and plans stored before Recipe.lr_at take); a one-line ConfigError for an unregistered one."""
    from angpt.train.setup import recipe_rate

    return recipe_rate(arch, preset)


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


@dataclass
class PlanOptions:
    """The settings every plan of a study shares, whatever its kind: the model preset, the batch, the LR sweep, the
    evaluation, the dtype and the device. :func:`make_plan`, a scaling ladder and a batch-size study take one of
    these (or its fields as keywords); a ladder and a batch study store it as their "compare" entry."""

    preset: str = "demo"
    batch_tokens: int | str = 16384
    seq_len: int | None = None
    micro_batch: int | None = None
    lr_grid: list[float] | None = None  # multipliers of each arm's centre LR (None: DEFAULT_LR_GRID)
    lr: dict[str, float] = field(default_factory=dict)  # centre LR per arm label (default: the recipe's at preset)
    lr_values: dict[str, list[float]] = field(default_factory=dict)  # an explicit absolute grid per arm label
    max_extensions: int = DEFAULT_MAX_EXTENSIONS
    settings: dict[str, Any] | list[str] = field(default_factory=dict)  # "model.KEY"/"train.KEY" -> value
    eval_batches: int = 20
    eval_points: int = 10
    dtype: str = "auto"
    device: str = "auto"  # where runs go: not part of any identity

    def stored(self, *, batch_tokens: bool = True) -> dict[str, Any]:
        """The options as a ladder or batch study stores them ("compare"): normalised, without the device (and
        without the batch for a batch study, whose plans each set their own)."""
        out = {
            "preset": self.preset,
            "batch_tokens": parse_tokens(self.batch_tokens),
            "seq_len": self.seq_len,
            "micro_batch": self.micro_batch,
            "lr_grid": sorted({float(m) for m in self.lr_grid}) if self.lr_grid else list(DEFAULT_LR_GRID),
            "lr": dict(self.lr or {}),
            "lr_values": {k: list(v) for k, v in (self.lr_values or {}).items()},
            "max_extensions": self.max_extensions,
            "settings": parse_settings(self.settings) if isinstance(self.settings, list) else dict(self.settings or {}),
            "eval_batches": self.eval_batches,
            "eval_points": self.eval_points,
            "dtype": self.dtype,
        }
        if not batch_tokens:
            del out["batch_tokens"]
        return out

    @classmethod
    def of(cls, options: PlanOptions | None = None, **fields: Any) -> PlanOptions:
        """`options` with `fields` replaced (keywords a caller passes one by one), or new options of `fields`."""
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"unknown plan option(s): {', '.join(unknown)}")
        return dataclasses.replace(options or cls(), **fields)


def make_plan(
    data: str | Path,
    *,
    arms: list[str | Arm] | None = None,
    baseline: str | None = None,
    budgets: list[int | str],
    seeds: list[int] | None = None,
    options: PlanOptions | None = None,
    extrapolate: bool = False,
    retune: list[str] | None = None,
    stat: str = "paired",
    tuning_seed: int | None = 1000,
    tune_budget: int | str | None = None,
    **option_fields: Any,
) -> Plan:
    """Build and validate a :class:`Plan`; every problem is a one-line :class:`UserError` before any run starts.

    Arms are strings in the ``[LABEL=]NAME[KEY=VALUE,...]`` syntax (default: gpt, gpt+, ngpt, angpt). The
    baseline defaults to gpt+ when present, else the first arm. Budgets are token counts (``4096``, ``1M``,
    ``1Mi``); each must be a whole number (>= 1) of `batch_tokens` steps. `options` (:class:`PlanOptions`, or its
    fields as keywords) are the preset, batch, LR sweep, evaluation and dtype; their `lr` and `lr_values` are keyed
    by arm label, their `settings` are ``model.KEY``/``train.KEY`` overrides applied to every arm. Each label in
    `retune` adds that arm re-tuned (:func:`retuned`: ``LABEL_retuned``). `stat` ("paired" or "welch") is the test
    that leads the verdicts. Learning rates (and tuned settings) are chosen on `tuning_seed` by validation loss; the
    reported losses are the other seeds' on the test split (the validation split for a dataset without one).
    `tuning_seed` None is the older design: the sweeps run on the first seed, whose sweep run is also its reported
    run (how plans written before 2026-11-25 read; kept for them and for tests of the run mechanics).
    """
    opts = PlanOptions.of(options, **option_fields)
    preset, batch_tokens, seq_len, micro_batch = opts.preset, opts.batch_tokens, opts.seq_len, opts.micro_batch
    lr_grid, lr, lr_values, max_extensions = opts.lr_grid, opts.lr, opts.lr_values, opts.max_extensions
    settings, eval_batches, eval_points = opts.settings, opts.eval_batches, opts.eval_points
    dtype, device = opts.dtype, opts.device
    from angpt.data import load_meta
    from angpt.models.config import PRESETS

    arm_objs, baseline = _arms(arms, retune, baseline)
    labels = [a.label for a in arm_objs]
    if stat not in STATS:
        raise UserError(f"unknown statistic {stat!r}; use one of: {', '.join(STATS)}")
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; use one of: {', '.join(PRESETS)}")

    bt = parse_tokens(batch_tokens)
    budget_ints, seeds = _budgets_and_seeds(budgets, bt, seeds, tuning_seed)
    tune_at = _tune_budget(tune_budget, budget_ints)
    grid, lr, lr_values = _rates(lr_grid, lr, lr_values, labels)
    _check_options(max_extensions, eval_batches, eval_points, dtype)
    settings = dict(parse_settings(settings) if isinstance(settings, list) else settings or {})
    T, mb = _geometry(arm_objs[0], preset, settings, bt, seq_len, micro_batch)

    meta = load_meta(data)
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
        tune_budget=tune_at,
    )
    plan.centres = {a.label: plan.centre_lr(a) for a in arm_objs}

    plan.data_fingerprint = dataset_fingerprint(data)
    _check_runs(plan, meta)
    return plan


def _arms(arms: list[str | Arm] | None, retune: list[str] | None, baseline: str | None) -> tuple[list[Arm], str]:
    """The plan's arms (each label in `retune` adds that arm re-tuned) and its baseline, checked."""
    arm_objs = parse_arms(arms, DEFAULT_ARMS)
    for label in retune or []:
        match = [a for a in arm_objs if a.label == label]
        if not match:
            raise UserError(f"--retune {label!r} is not one of the arms ({', '.join(a.label for a in arm_objs)})")
        arm_objs.append(retuned(match[0]))
    return arm_objs, check_arms(arm_objs, baseline)


def _check_options(max_extensions, eval_batches, eval_points, dtype) -> None:
    if not isinstance(max_extensions, int) or max_extensions < 0:
        raise UserError(f"max_extensions={max_extensions!r} must be a non-negative integer")
    for name, v in (("eval_batches", eval_batches), ("eval_points", eval_points)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"{name}={v!r} must be a positive integer")
    if dtype not in ("auto", "bf16", "fp32"):
        raise UserError(f"dtype={dtype!r}; use auto, bf16 or fp32")


def _geometry(first: Arm, preset: str, settings: dict, bt: int, seq_len, micro_batch) -> tuple[int, int]:
    """(seq_len, micro_batch) of every run: the context length comes from the preset and the common settings, never
    from an arm, so every arm reads the same windows; the micro-batch divides a step's sequences."""
    from angpt.models.registry import make_config

    common_model = {k.split(".", 1)[1]: v for k, v in settings.items() if k.startswith("model.")}
    T = seq_len or make_config(first.arch, preset, **common_model).context_length
    if not isinstance(T, int) or T <= 0:
        raise UserError(f"seq_len={seq_len!r} must be a positive integer")
    if bt % T:
        raise UserError(f"batch tokens {bt} must be a multiple of seq_len {T}")
    seqs = bt // T
    mb = micro_batch or _largest_divisor_at_most(seqs, 16)
    if seqs % mb:
        raise UserError(f"micro_batch {mb} must divide the {seqs} sequences of one step ({bt} tokens / {T})")
    return T, mb


def _budgets_and_seeds(
    budgets: list[int | str], bt: int, seeds: list[int] | None, tuning_seed: int | None
) -> tuple[list[int], list[int]]:
    """The budgets as token counts, ascending, each a whole number of steps of `bt` tokens; the seeds, distinct
    and non-negative (seed 0 where none are given), the tuning seed not among them."""
    if not budgets:
        raise UserError("no token budgets: give at least one, e.g. --budgets 1M,2M,4M")
    budget_ints = sorted({parse_tokens(b) for b in budgets})
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
    if tuning_seed is not None and tuning_seed in seeds:
        raise UserError(
            f"the tuning seed {tuning_seed} is among the reported seeds {seeds}: selection and measurement must use "
            "different seeds (docs/protocol.md); pick another --tuning-seed or other --seeds"
        )
    return budget_ints, seeds


def _tune_budget(given: int | str | None, budgets: list[int]) -> int | None:
    """The budget the sweeps run at: None for the smallest (the default), else one of `budgets` ("largest" names
    the largest); a one-line UserError for any other."""
    if given is None:
        return None
    value = budgets[-1] if given == "largest" else parse_tokens(given)
    if value not in budgets:
        raise UserError(f"--tune-budget {given} is not one of the budgets ({', '.join(map(format_tokens, budgets))})")
    return None if value == budgets[0] else value


def _rates(lr_grid, lr, lr_values, labels: list[str]) -> tuple[list[float], dict, dict]:
    """The LR grid's multipliers (sorted, positive), and the per-arm rates and grids, naming arms of the plan."""
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
    return grid, lr, lr_values


def _check_runs(plan: Plan, meta: dict) -> None:
    """Every arm's run config resolved against the dataset now, so that a bad key or a too-small vocabulary fails in
    one line, naming the arm, before anything is trained or written."""
    from angpt.data import check_compatible
    from angpt.train.config import load_run_config, resolve_model_config

    budget_ints, seeds, T = plan.budgets, plan.seeds, plan.seq_len
    for arm in plan.arms:
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
