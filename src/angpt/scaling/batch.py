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

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.compare.plan import (
    DEFAULT_LR_GRID,
    Arm,
    Plan,
    format_tokens,
    make_plan,
    parse_arm,
    parse_settings,
    parse_tokens,
)
from angpt.compare.store import RunSpec
from angpt.errors import UserError
from angpt.invocation import command_line
from angpt.models import registry
from angpt.scaling.dial import DEFAULT_ASPECT, DEFAULT_HEAD_DIM, SHAPE_KEYS, Shape, dial_shapes

BATCH_FILE = "batch.json"
DEFAULT_TOLERANCE = 0.01


def critical_batch(batches: list[int], losses: list[float], tolerance: float = DEFAULT_TOLERANCE) -> dict[str, Any]:
    """The largest batch whose loss is at most (1 + tolerance) x the best loss over `batches`.

    Diverged runs (inf or NaN) never qualify. ``at_largest`` says the critical batch is the largest tried, so the
    true one may be larger (a lower bound).
    """
    pairs = [(b, x) for b, x in zip(batches, losses) if x is not None and math.isfinite(x)]
    if not pairs:
        return {"critical": None, "best_batch": None, "best_loss": None, "threshold": None, "at_largest": False}
    best_batch, best = min(pairs, key=lambda p: (p[1], p[0]))
    threshold = best * (1 + tolerance)
    critical = max(b for b, x in pairs if x <= threshold)
    return {
        "critical": critical,
        "best_batch": best_batch,
        "best_loss": best,
        "threshold": threshold,
        "at_largest": critical == max(batches),
    }


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
        options = {k: v for k, v in self.compare.items() if k != "settings"}
        try:
            return make_plan(
                self.data,
                arms=self.arms,
                baseline=self.baseline,
                budgets=[self.tokens],
                seeds=self.seeds,
                batch_tokens=batch,
                settings=settings,
                device=self.device,
                **{"tuning_seed": None, **options},  # as a ladder: the sweeps are the data (scaling/plan.py)
            )
        except UserError as e:
            raise type(e)(f"batch {format_tokens(batch)}: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["arms"] = [a.to_dict() for a in self.arms]
        return json.loads(json.dumps(d))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchStudy:
        d = dict(d)
        d["arms"] = [Arm(**a) for a in d["arms"]]
        return cls(**d)

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
    preset: str = "demo",
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
) -> BatchStudy:
    """Build and validate a batch-size study; every problem is a one-line UserError before anything runs.

    Batch sizes (tokens per step) must be at least two, each twice the previous; `tokens` must be a whole number
    of steps of each. The model is the preset's shape, or the ladder dial's at `depth`.
    """
    arm_objs = [a if isinstance(a, Arm) else parse_arm(a) for a in (arms if arms is not None else ["gpt+", "angpt"])]
    if not arm_objs:
        raise UserError("no arms: give at least one, e.g. --arms gpt+,angpt")
    labels = [a.label for a in arm_objs]
    if baseline is None:
        baseline = registry.BASELINE if registry.BASELINE in labels else labels[0]
    if baseline not in labels:
        raise UserError(f"baseline {baseline!r} is not in the study's arms ({', '.join(labels)}); add it to --arms")
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
    settings = parse_settings(settings) if isinstance(settings, list) else dict(settings or {})
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
        compare={
            "preset": preset,
            "seq_len": seq_len,
            "micro_batch": micro_batch,
            "lr_grid": sorted({float(m) for m in lr_grid}) if lr_grid else list(DEFAULT_LR_GRID),
            "lr": dict(lr or {}),
            "lr_values": {k: list(v) for k, v in (lr_values or {}).items()},
            "max_extensions": max_extensions,
            "settings": settings,
            "eval_batches": eval_batches,
            "eval_points": eval_points,
            "dtype": dtype,
        },
        device=device,
    )
    for b in sizes:  # every batch's plan validates now: geometry, arms, data
        study.data_fingerprint = study.plan_for(b).data_fingerprint
    return study


def run_batch_study(
    study: BatchStudy,
    out: str | Path,
    *,
    jobs: int = 1,
    threads: int | None = None,
    dry_run: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> tuple[str, dict[str, Any], dict[str, Path]]:
    """Run (or resume) every batch size's comparison, then rewrite the scaling report in `out`.

    Returns (dry-run text or "", the report, its files). `dry_run` writes nothing."""
    from angpt.compare import run_comparison
    from angpt.compare.runner import cpu_cores
    from angpt.compare.store import check_store, write_json
    from angpt.scaling.report import write_scaling_report
    from angpt.scaling.runner import check_out_dir, scaling_lock

    if not isinstance(jobs, int) or jobs < 1:
        raise UserError(f"jobs={jobs!r} must be a positive integer")
    threads = threads or max(1, cpu_cores() // jobs)
    out = Path(out)
    command = command if command is not None else command_line()
    exists = check_out_dir(out, BATCH_FILE, study.identity(), "batch-size study")
    for b in study.batch_sizes:  # every store before the first trains (compare checks each again on reaching it)
        check_store(study.plan_for(b), batch_dir(out, b))
    if dry_run:
        from angpt.scaling.estimate import describe_batch

        return describe_batch(study, out, jobs=jobs, threads=threads), {}, {}
    out.mkdir(parents=True, exist_ok=True)
    with scaling_lock(out):
        if not exists:
            write_json(out / BATCH_FILE, study.to_dict())
        try:
            for b in study.batch_sizes:
                run_comparison(
                    study.plan_for(b),
                    batch_dir(out, b),
                    jobs=jobs,
                    threads=threads,
                    progress=progress,
                    command=f"{command}  # batch {format_tokens(b)}",
                )
        except KeyboardInterrupt:
            print(f"batch-size study interrupted: re-run the same command to resume ({out})", file=sys.stderr)
            raise
        report, files = write_scaling_report(out, command=command)
    return "", report, files


def analyse_batch(out: Path) -> dict[str, Any] | None:
    """The study's losses per arm and batch (mean over seeds) and each arm's critical batch; None without a study."""
    from angpt.compare.stored import Unfinished, settle_sweeps
    from angpt.scaling.plan import chosen_lr

    path = Path(out) / BATCH_FILE
    if not path.is_file():
        return None
    study = BatchStudy.from_dict(json.loads(path.read_text()))
    arms: dict[str, Any] = {}
    unfinished = []
    for a in study.arms:
        arms[a.label] = {"batches": [], "lr": {}, "loss": {}, "per_seed": {}}
    for b in study.batch_sizes:
        try:
            plan, sweeps, runs = settle_sweeps(batch_dir(out, b))
        except Unfinished as e:
            unfinished.append(f"batch {format_tokens(b)}: {e}")
            continue
        for a in study.arms:
            lr = chosen_lr(sweeps[a.label][plan.sweep_budget])
            if lr is None:
                arms[a.label]["loss"][b] = math.inf
                continue
            vals = []
            for s in study.seeds:
                rec = runs.known(RunSpec(a.label, study.tokens, s, lr))
                if rec is None:
                    continue
                ok = rec["status"] == "finished" and rec.get("val_loss") is not None
                vals.append(float(rec["val_loss"]) if ok else math.inf)
            if vals:
                arms[a.label]["per_seed"][b] = vals
                arms[a.label]["loss"][b] = sum(vals) / len(vals)
                arms[a.label]["lr"][b] = lr
    for a in study.arms:
        entry = arms[a.label]
        bs = sorted(entry["loss"])
        entry["batches"] = bs
        entry["critical"] = critical_batch(bs, [entry["loss"][b] for b in bs], study.tolerance)
    return {
        "tokens": study.tokens,
        "batch_sizes": study.batch_sizes,
        "tolerance": study.tolerance,
        "seeds": study.seeds,
        "shape": study.shape,
        "preset": study.compare["preset"],
        "arms": arms,
        "unfinished": unfinished,
    }
