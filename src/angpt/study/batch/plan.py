"""The batch-size study: each arm's final loss at a fixed token count over batch sizes a factor of two apart, and
its critical batch.

Each batch size is an ordinary comparison (compare.Plan with that ``batch_tokens`` and one budget, the fixed token
count, so halving the batch doubles the steps) in ``OUT/batch/<batch>/``, with its own LR sweep: the best LR
moves with the batch, and a batch judged at another batch's LR would be judged by its tuning. The critical batch
is the largest batch whose loss is within `tolerance` (default 1%) of the arm's best loss over the batches tried:
beyond it, larger batches cost loss at equal tokens (McCandlish et al. 2018, arXiv 1812.06162, in its
loss-at-fixed-tokens form). The anGPT paper claims anGPT tolerates larger batches than GPT+.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.errors import UserError
from angpt.study.arms import Arm, check_arms, parse_arms, study_dict, with_arms
from angpt.study.dial import DEFAULT_ASPECT, DEFAULT_HEAD_DIM, SHAPE_KEYS, Shape, dial_shapes
from angpt.study.plan import Plan, PlanOptions, make_plan
from angpt.study.store import BATCH_FILE  # noqa: F401 - the study's file in its folder
from angpt.units import format_tokens, parse_tokens

DEFAULT_TOLERANCE = 0.01


@dataclass
class BatchStudy:
    """Arms x batch sizes at one token count and one model shape. Build with :func:`make_batch_study`."""

    data: str
    arms: list[Arm]
    baseline: str
    tokens: int
    batch_sizes: list[int]
    seeds: list[int]
    shape: dict[str, Any] | None  # a dial shape (Shape.to_dict) or None for the preset's own
    tolerance: float = DEFAULT_TOLERANCE
    compare: dict[str, Any] = field(default_factory=dict)  # make_plan options shared by every batch size
    device: str = "auto"
    data_fingerprint: dict[str, Any] = field(default_factory=dict)

    def plan_for(self, batch: int) -> Plan:
        settings = dict(self.compare.get("settings", {}))
        if self.shape is not None:
            settings.update(Shape(**self.shape).model_settings())
        options = PlanOptions(**{**self.compare, "settings": settings}, batch_tokens=batch, device=self.device)
        try:
            return make_plan(
                self.data,
                arms=self.arms,
                baseline=self.baseline,
                budgets=[self.tokens],
                seeds=self.seeds,
                options=options,
                tuning_seed=None,  # as a ladder: the sweeps are the data (ladder/plan.py)
            )
        except UserError as e:
            raise type(e)(f"batch {format_tokens(batch)}: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        return study_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchStudy:
        return cls(**with_arms(d))

    def identity(self) -> dict[str, Any]:
        d = self.to_dict()
        for k in ("data", "device"):
            d.pop(k)
        return d


def batch_dir(out: Path, batch: int) -> Path:
    return Path(out) / "batch" / str(batch)


def make_batch_study(
    data: str | Path,
    *,
    arms: list[str | Arm] | None = None,
    baseline: str | None = None,
    tokens: int | str,
    batch_sizes: list[int | str],
    depth: int | None = None,
    aspect: int = DEFAULT_ASPECT,
    head_dim: int = DEFAULT_HEAD_DIM,
    ffn_mult: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    seeds: list[int] | None = None,
    options: PlanOptions | None = None,
    **option_fields: Any,
) -> BatchStudy:
    """Build and validate a batch-size study; every problem is a one-line UserError before anything runs.

    Batch sizes (tokens per step) must be at least two, each twice the previous; `tokens` must be a whole number
    of steps of each. The model is the preset's shape, or the ladder dial's at `depth`. `options`
    (:class:`PlanOptions`, or its fields as keywords) are what every batch's plan shares; their batch_tokens is
    each plan's own.
    """
    opts = PlanOptions.of(options, **option_fields)
    arm_objs = parse_arms(arms, ["gpt+", "angpt"])
    baseline = check_arms(arm_objs, baseline, "the study's arms")
    sizes = sorted({parse_tokens(b) for b in batch_sizes})
    if len(sizes) < 2:
        raise UserError("a batch-size study needs at least two batch sizes, e.g. --batch-sizes 4Ki,8Ki,16Ki,32Ki")
    for a, b in zip(sizes, sizes[1:]):
        if b != 2 * a:
            doubling = ",".join(format_tokens(sizes[0] << i) for i in range(len(sizes)))
            raise UserError(
                f"batch sizes must be two apart (each twice the previous): {format_tokens(a)} is followed by "
                f"{format_tokens(b)}; e.g. --batch-sizes {doubling}"
            )
    n_tokens = parse_tokens(tokens)
    if n_tokens % sizes[-1]:
        raise UserError(
            f"--tokens {format_tokens(n_tokens)} is not a whole number of steps of the largest batch "
            f"{format_tokens(sizes[-1])}; use a multiple of it"
        )
    if not 0 < tolerance < 1:
        raise UserError(f"--tolerance {tolerance!r} must be in (0, 1), e.g. 0.01 for 1%")
    compare = opts.stored(batch_tokens=False)
    shape = None
    if depth is not None:
        shape = dial_shapes(depths=[depth], aspect=aspect, head_dim=head_dim, ffn_mult=ffn_mult)[0].to_dict()
        for a in arm_objs:
            bad = sorted(set(a.model) & SHAPE_KEYS)
            if bad:
                raise UserError(f"arm {a.label!r} sets model.{bad[0]}, which --depth decides; drop it")
    study = BatchStudy(
        data=str(Path(data).resolve()),
        arms=arm_objs,
        baseline=baseline,
        tokens=n_tokens,
        batch_sizes=sizes,
        seeds=[0] if seeds is None else list(seeds),
        shape=shape,
        tolerance=float(tolerance),
        compare=compare,
        device=opts.device,
    )
    for b in sizes:  # every batch's plan validates now: geometry, arms, data
        study.data_fingerprint = study.plan_for(b).data_fingerprint
    return study
