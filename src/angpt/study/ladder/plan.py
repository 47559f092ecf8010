"""What `angpt scaling` runs: a ladder of model sizes from one dial, each size an `angpt compare` plan.

Size i of the ladder is an ordinary comparison (compare.Plan) of the same arms, with the dial's shape set for every
arm, budgets of its own (fixed token counts, or multiples of the size's parameter count), and the comparison's LR
sweep. Its runs live in ``OUT/sizes/<size>/``, a compare report directory, so the run store, resume, parallel
workers and the per-size compare report all come from the study engine (angpt.study).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.errors import UserError
from angpt.models import registry
from angpt.study.arms import Arm, check_arms, find_arm, parse_arms, study_dict, with_arms
from angpt.study.dial import DEFAULT_ASPECT, DEFAULT_HEAD_DIM, SHAPE_KEYS, Shape, dial_shapes
from angpt.study.plan import Plan, PlanOptions, make_plan, recipe_lr
from angpt.study.store import LADDER_FILE  # noqa: F401 - the study's file in its folder
from angpt.study.sweep import SweepResult
from angpt.units import format_tokens, parse_tokens

MIN_SIZES = 3  # a law with two exponents needs at least three sizes and three budgets per size
MIN_BUDGETS = 3
DEFAULT_TOKENS_PER_PARAM = (5.0, 10.0, 20.0)  # SPEC section 8: about 5-40 tokens per parameter
PARAM_COUNTS = ("non_embedding", "total")
SCHEDULE_KEYS = frozenset({"schedule", "decay_fraction", "decay_shape"})


@dataclass
class Size:
    """One rung: its shape, each arm's parameter count N, and its token budgets D (the same for every arm)."""

    shape: Shape
    params: dict[str, int]
    budgets: list[int]

    @property
    def name(self) -> str:
        return self.shape.name

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape.to_dict(), "params": self.params, "budgets": self.budgets}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Size:
        return cls(shape=Shape(**d["shape"]), params=dict(d["params"]), budgets=list(d["budgets"]))


@dataclass
class Ladder:
    """A whole scaling study. Build with :func:`make_ladder`, which validates everything against the dataset.

    `compare` holds the options every size's compare plan shares (preset, batch, LR grid, settings, ...): the
    :class:`angpt.study.plan.PlanOptions`, as stored (``PlanOptions.stored``: without the device).
    """

    data: str
    arms: list[Arm]
    baseline: str
    sizes: list[Size]
    dial: dict[str, Any]
    seeds: list[int]
    tokens_per_param: list[float] | None = None
    budgets: list[int] | None = None
    param_count: str = "non_embedding"
    schedule: str = "cosine"
    decay_fraction: float = 0.2
    decay_shape: str = "1-sqrt"
    lr_transfer: bool = False
    compare: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"  # not part of the identity
    data_fingerprint: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------ compare plans
    def arm(self, label: str) -> Arm:
        return find_arm(self.arms, label, "this ladder")

    def steps(self, budget: int) -> int:
        return budget // int(self.compare["batch_tokens"])

    def _arms_at(self, size: Size) -> list[Arm]:
        """The arms as the size's plan runs them. WSD fixes each arm's warm-up in steps (the recipe's warm-up of
        the smallest budget), so that every budget of the size shares one stable phase."""
        arms = copy.deepcopy(self.arms)
        if self.schedule != "wsd" or "train.warmup_steps" in self.compare.get("settings", {}):
            return arms
        first = self.steps(size.budgets[0])
        for a in arms:
            a.train.setdefault("warmup_steps", registry.get(a.arch).recipe.warmup_steps(first))
        return arms

    def _settings_at(self, size: Size) -> dict[str, Any]:
        settings = {**self.compare.get("settings", {}), **size.shape.model_settings()}
        if self.schedule == "wsd":
            settings.update(
                {
                    "train.schedule": "wsd",
                    "train.decay_fraction": self.decay_fraction,
                    "train.decay_shape": self.decay_shape,
                }
            )
        return settings

    def size_plan(self, i: int, transferred: dict[str, float] | None = None) -> Plan:
        """Size i's compare plan. `transferred` (arm label -> LR) fixes those arms' LRs instead of a sweep."""
        return self.plan_for(self.sizes[i], transferred)

    def plan_for(self, size: Size, transferred: dict[str, float] | None = None) -> Plan:
        """The compare plan of `size` (validated against the dataset by compare.make_plan)."""
        lr_values = {**self.compare.get("lr_values", {}), **{k: [v] for k, v in (transferred or {}).items()}}
        # The sizes come from the dial, not the preset (its vocabulary and context only): every sweep is centred on
        # the recipe's small-model rate (Recipe.lr), never a larger preset's (Recipe.lr_at), unless --lr gives one.
        lr = {a.label: recipe_lr(a.arch, None) for a in self.arms} | (self.compare.get("lr") or {})
        options = PlanOptions(**{**self.compare, "settings": self._settings_at(size), "lr_values": lr_values, "lr": lr})
        return make_plan(
            self.data,
            arms=self._arms_at(size),
            baseline=self.baseline,
            budgets=size.budgets,
            seeds=self.seeds,
            options=dataclasses.replace(options, device=self.device),
            # a ladder's sweeps are its data (each size's best run is its point): it keeps the older design, one
            # seed that selects and is reported (docs/scaling.md)
            tuning_seed=None,
        )

    def check_plan(self) -> Plan:
        """The LR-transfer check: the second size's sweep (its smallest budget, first seed) with the full grid."""
        plan = self.size_plan(1)
        plan.budgets, plan.seeds = plan.budgets[:1], plan.seeds[:1]
        return plan

    # ---------------------------------------------------------------------------------------------- identity
    def to_dict(self) -> dict[str, Any]:
        return study_dict(self, sizes=[s.to_dict() for s in self.sizes])

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ladder:
        return cls(**with_arms(d) | {"sizes": [Size.from_dict(s) for s in d["sizes"]]})

    def identity(self) -> dict[str, Any]:
        """Everything that decides what the runs compute: two ladders with equal identities share an OUT."""
        d = self.to_dict()
        for k in ("data", "device"):
            d.pop(k)
        return d

    @staticmethod
    def shared_identity(identity: dict[str, Any]) -> dict[str, Any]:
        """What a ladder and one it extends must share: an identity without its sizes (nor the dial's list of them).

        Each size's runs live in a store of their own (OUT/sizes/<size>), so sizes may be added, and compare's
        max_extensions may change (raised, it lets an unfinished sweep go on); every other key (arms, seeds,
        budgets, the dial's aspect and head dim, ...) decides what every size's runs compute.
        """
        d = {k: v for k, v in identity.items() if k != "sizes"}
        d["compare"] = {k: v for k, v in (d.get("compare") or {}).items() if k != "max_extensions"}
        dial = dict(d.get("dial") or {})
        d["dial"] = {k: v for k, v in dial.items() if k not in ("depths", "widths")}
        d["dial"]["by"] = "--depths" if "depths" in dial else "--widths"
        return d


def grid_step(grid: list[float]) -> float | None:
    """The grid's ratio between neighbours (the largest, for an uneven grid); None for a single point."""
    if len(grid) < 2:
        return None
    return max(b / a for a, b in zip(grid, grid[1:]))


def transfer_check(small: SweepResult, large: SweepResult) -> dict[str, Any]:
    """Whether one arm's best LR at the smallest size matches the next size's within one step of the LR grid.

    The claim "tune on the smallest size, reuse it" holds at this resolution when the two best LRs are at most one
    grid step apart; a best LR at an edge of its grid, or every run diverged, leaves the check open.
    """
    lr_small, lr_large = small.best_lr, large.best_lr
    out: dict[str, Any] = {"small_lr": lr_small, "large_lr": lr_large, "holds": None, "steps_apart": None}
    step = grid_step(large.grid) or grid_step(small.grid)
    if lr_small is None or lr_large is None:
        out["note"] = "every LR diverged at one of the sizes"
        return out
    if step is None:
        out["note"] = "the LR was fixed, not tuned (a one-point grid)"
        return out
    apart = abs(math.log(lr_large / lr_small)) / math.log(step)
    out["steps_apart"] = apart
    out["grid_step"] = step
    out["holds"] = apart <= 1 + 1e-9
    if small.at_edge or large.at_edge:
        out["note"] = "a best LR sits at an edge of its grid (sweep unfinished)"
    return out


# -------------------------------------------------------------------------------------------------- build
def count_params(plan: Plan, arm: Arm, which: str) -> int:
    """N of `arm` as `plan` builds it: every parameter but the input embedding table ("non_embedding": the weights
    that multiply activations, the N of C = 6 N D, LM head included, as Porian et al. 2024, arXiv 2406.19146, argue
    for small models) or all of them ("total", as Hoffmann et al. 2022 count). Built on the meta device."""
    import torch

    from angpt.data import load_meta
    from angpt.models import model_from_config
    from angpt.models.registry import describe_constants
    from angpt.train.config import load_run_config, resolve_model_config

    cfg = load_run_config(None, plan.run_overrides(arm, plan.budgets[0], plan.seeds[0], plan.centre_lr(arm), "unused"))
    mcfg = resolve_model_config(cfg, load_meta(plan.data))
    describe_constants(mcfg)  # Monte Carlo constants are computed on the CPU: meta tensors hold no values
    with torch.device("meta"):
        model = model_from_config(mcfg)
    return model.num_params(embeddings=which == "total")


def _check_keys(arms: list[Arm], settings: dict[str, Any]) -> None:
    for a in arms:
        bad = sorted(set(a.model) & SHAPE_KEYS)
        if bad:
            raise UserError(
                f"arm {a.label!r} sets model.{bad[0]}, which the size dial decides; drop it (use --depths, "
                "--aspect, --head-dim, --ffn-mult)"
            )
        bad = sorted(set(a.train) & SCHEDULE_KEYS)
        if bad:
            raise UserError(f"arm {a.label!r} sets train.{bad[0]}; a ladder has one schedule: use --schedule")
    for key in settings:
        section, _, name = key.partition(".")
        if section == "model" and name in SHAPE_KEYS:
            raise UserError(f"--set {key} is decided by the size dial; use --depths, --aspect, --head-dim, --ffn-mult")
        if section == "train" and name in SCHEDULE_KEYS:
            raise UserError(f"--set {key}: use --schedule, --decay-fraction and --decay-shape")


def _budgets_for(
    n_ref: int, batch: int, tokens_per_param: list[float] | None, budgets: list[int] | None, name: str
) -> list[int]:
    if budgets is not None:
        return list(budgets)
    assert tokens_per_param is not None
    out = [max(1, round(k * n_ref / batch)) * batch for k in tokens_per_param]
    if len(set(out)) != len(out):
        raise UserError(
            f"size {name} (N = {n_ref}): tokens per parameter {tokens_per_param} round to budgets "
            f"{[format_tokens(b) for b in out]} with repeats at {batch} tokens per step; use multiples further apart "
            "or a smaller --batch-tokens"
        )
    return out


def make_ladder(
    data: str | Path,
    *,
    arms: list[str | Arm] | None = None,
    baseline: str | None = None,
    depths: list[int] | None = None,
    widths: list[int] | None = None,
    aspect: int = DEFAULT_ASPECT,
    head_dim: int = DEFAULT_HEAD_DIM,
    ffn_mult: float | None = None,
    tokens_per_param: list[float] | None = None,
    budgets: list[int | str] | None = None,
    param_count: str = "non_embedding",
    schedule: str = "cosine",
    decay_fraction: float = 0.2,
    decay_shape: str = "1-sqrt",
    lr_transfer: bool = False,
    seeds: list[int] | None = None,
    options: PlanOptions | None = None,
    **option_fields: Any,
) -> Ladder:
    """Build and validate a :class:`Ladder`: every problem is a one-line UserError before anything is trained.

    Sizes come from `depths` (width = depth x `aspect`) or `widths`; heads = width / `head_dim`. Budgets are
    either the same token counts at every size (`budgets`) or multiples of each size's parameter count
    (`tokens_per_param`, default 5, 10, 20; N is the baseline's, so every arm of a size gets the same tokens),
    rounded to whole steps. `schedule` "wsd" makes each size's budgets branches of one run (see
    angpt.study.ladder.wsd). `lr_transfer` tunes each arm's LR on the smallest size only and reuses it. Arms and
    baseline are those of :func:`angpt.study.make_plan`; `options` (:class:`PlanOptions`, or its fields as keywords)
    are what every size's plan shares.
    """
    opts = PlanOptions.of(options, **option_fields)
    arm_objs = parse_arms(arms, ["gpt+", "angpt"])
    baseline = check_arms(arm_objs, baseline, "the ladder's arms")
    compare = opts.stored()
    settings, bt = compare["settings"], compare["batch_tokens"]
    _check_keys(arm_objs, settings)
    shapes = dial_shapes(depths=depths, widths=widths, aspect=aspect, head_dim=head_dim, ffn_mult=ffn_mult)
    if len(shapes) < MIN_SIZES:
        raise UserError(
            f"a scaling fit needs at least {MIN_SIZES} sizes; got {len(shapes)} ({', '.join(s.name for s in shapes)}): "
            "add sizes, e.g. --depths 2,3,4,5,6"
        )
    if budgets is not None and tokens_per_param is not None:
        raise UserError("give budgets one way: --budgets (tokens) or --tokens-per-param (multiples of N), not both")
    if budgets is None:
        tokens_per_param = sorted(float(k) for k in (tokens_per_param or DEFAULT_TOKENS_PER_PARAM))
        if any(not (math.isfinite(k) and k > 0) for k in tokens_per_param):
            raise UserError(f"--tokens-per-param {tokens_per_param} must be positive numbers")
        count = len(set(tokens_per_param))
    else:
        budget_ints = sorted({parse_tokens(b) for b in budgets})
        count = len(budget_ints)
    if count < MIN_BUDGETS:
        raise UserError(
            f"a scaling fit needs at least {MIN_BUDGETS} token budgets per size; got {count}: "
            "give e.g. --tokens-per-param 5,10,20"
        )
    if param_count not in PARAM_COUNTS:
        raise UserError(f"--count-params {param_count!r}; use one of: {', '.join(PARAM_COUNTS)}")
    if schedule not in ("cosine", "wsd"):
        raise UserError(f"--schedule {schedule!r}; use cosine or wsd")
    if not 0 < decay_fraction <= 1:
        raise UserError(f"--decay-fraction {decay_fraction!r} must be in (0, 1], e.g. 0.2")
    if decay_shape not in ("linear", "1-sqrt"):
        raise UserError(f"--decay-shape {decay_shape!r}; use linear or 1-sqrt")
    ladder = Ladder(
        data=str(Path(data).resolve()),
        arms=arm_objs,
        baseline=baseline,
        sizes=[],
        dial={
            "depths" if depths is not None else "widths": [s.depth if depths is not None else s.width for s in shapes],
            "aspect": aspect,
            "head_dim": head_dim,
            "ffn_mult": ffn_mult,
        },
        seeds=[0] if seeds is None else list(seeds),
        tokens_per_param=tokens_per_param if budgets is None else None,
        budgets=budget_ints if budgets is not None else None,
        param_count=param_count,
        schedule=schedule,
        decay_fraction=float(decay_fraction),
        decay_shape=decay_shape,
        lr_transfer=bool(lr_transfer),
        compare=compare,
        device=opts.device,
    )
    # Each size: a provisional one-step plan validates the arms at that shape and gives their N; then the budgets.
    for shape in shapes:
        size = Size(shape=shape, params={}, budgets=[bt])
        plan = _size_checked(ladder, size)
        size.params = {a.label: count_params(plan, a, param_count) for a in plan.arms}
        size.budgets = _budgets_for(size.params[baseline], bt, ladder.tokens_per_param, ladder.budgets, shape.name)
        _check_decay(ladder, size)
        ladder.data_fingerprint = _size_checked(ladder, size).data_fingerprint  # budgets and geometry too
        ladder.sizes.append(size)
    return ladder


def _size_checked(ladder: Ladder, size: Size) -> Plan:
    try:
        return ladder.plan_for(size)
    except UserError as e:
        raise type(e)(f"size {size.name}: {e}") from e


def _check_decay(ladder: Ladder, size: Size) -> None:
    """WSD: every budget needs a decay of at least one step that starts after the warm-up."""
    if ladder.schedule != "wsd":
        return
    from angpt.train.optim import Schedule

    for a in ladder._arms_at(size):
        for b in size.budgets:
            steps = ladder.steps(b)
            warmup = a.train.get("warmup_steps", ladder.compare["settings"].get("train.warmup_steps", 0)) or 0
            start = Schedule(steps, kind="wsd", decay_fraction=ladder.decay_fraction).decay_start
            if warmup > start:
                raise UserError(
                    f"size {size.name}, arm {a.label!r}: {format_tokens(b)} tokens are {steps} steps, whose WSD decay "
                    f"would start at step {start}, inside the {warmup}-step warm-up; use larger budgets or a smaller "
                    "--batch-tokens"
                )
