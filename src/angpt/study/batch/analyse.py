"""The batch-size study's analysis: each arm's loss over the batch sizes and its critical batch (McCandlish et al.
2018, arXiv 1812.06162, in its loss-at-fixed-tokens form)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from angpt.study.batch.plan import BATCH_FILE, DEFAULT_TOLERANCE, BatchStudy, batch_dir
from angpt.study.store import RunSpec
from angpt.units import format_tokens


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


def analyse_batch(out: Path) -> dict[str, Any] | None:
    """The study's losses per arm and batch (mean over seeds) and each arm's critical batch; None without a study.

    A batch where a seed diverged (or failed) has an infinite mean, so it is never the critical batch, and is listed
    under the arm's ``diverged`` ({batch: [seeds]}); a batch whose every sweep LR diverged is in ``sweep_diverged``.
    Seeds not finished yet are in ``missing`` ({batch: [seeds]}) and the study's ``unfinished``."""
    from angpt.study.stored import Unfinished, settle_sweeps

    path = Path(out) / BATCH_FILE
    if not path.is_file():
        return None
    study = BatchStudy.from_dict(json.loads(path.read_text()))
    arms: dict[str, Any] = {a.label: _empty_entry() for a in study.arms}
    unfinished = []
    for b in study.batch_sizes:
        try:
            plan, sweeps, runs = settle_sweeps(batch_dir(out, b))
        except Unfinished as e:
            unfinished.append(f"batch {format_tokens(b)}: {e}")
            continue
        for a in study.arms:
            lr = sweeps[a.label][plan.sweep_budget].best_lr
            missing = _add_batch(arms[a.label], study, a.label, b, lr, runs)
            if missing:
                seeds = ", ".join(map(str, missing))
                unfinished.append(f"batch {format_tokens(b)}: {a.label} seed(s) {seeds} not finished")
    for entry in arms.values():
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


def _empty_entry() -> dict[str, Any]:
    return {"batches": [], "lr": {}, "loss": {}, "per_seed": {}, "diverged": {}, "sweep_diverged": [], "missing": {}}


def _add_batch(entry: dict[str, Any], study: BatchStudy, label: str, b: int, lr: float | None, runs) -> list[int]:
    """One arm's batch b into `entry`: each seed's loss, their mean (inf where a seed diverged: the batch counts as
    diverged, never as the mean of the seeds that trained), the seeds that diverged; returns the seeds not done."""
    if lr is None:  # every LR of the batch's sweep diverged: no seed trained there
        entry["loss"][b] = math.inf
        entry["sweep_diverged"].append(b)
        return []
    losses, missing = _seed_losses(study, runs, label, lr)
    if missing:
        entry["missing"][b] = missing
    if not losses:
        return missing
    diverged = [s for s, x in losses.items() if not math.isfinite(x)]
    if diverged:
        entry["diverged"][b] = diverged
    entry["per_seed"][b] = losses
    entry["loss"][b] = math.inf if diverged else sum(losses.values()) / len(losses)
    entry["lr"][b] = lr
    return missing


def _seed_losses(study: BatchStudy, runs, label: str, lr: float) -> tuple[dict[int, float], list[int]]:
    """Each seed's final loss at the batch's chosen LR (inf: the run diverged or failed) and the seeds with no
    record yet. A diverged seed is kept as inf, never left out: a mean over the others would pass for the batch's."""
    losses: dict[int, float] = {}
    missing = []
    for s in study.seeds:
        rec = runs.known(RunSpec(label, study.tokens, s, lr))
        if rec is None:
            missing.append(s)
            continue
        loss = rec.get("val_loss") if rec["status"] == "finished" else None
        losses[s] = float(loss) if loss is not None and math.isfinite(float(loss)) else math.inf
    return losses, missing


def batch_warnings(batch: dict[str, Any]) -> list[str]:
    """The study's warnings: a critical batch that is only a lower bound, and every batch where a seed diverged."""
    out = []
    for label, e in batch["arms"].items():
        c = e["critical"]
        if c["critical"] is not None and c["at_largest"]:
            out.append(f"{label}: the critical batch is the largest batch tried; add larger batches to find it")
        for b, seeds in sorted(e["diverged"].items()):
            out.append(
                f"{label}: seed(s) {', '.join(map(str, seeds))} of {len(batch['seeds'])} diverged at batch "
                f"{format_tokens(b)}: the batch counts as diverged (never the critical batch)"
            )
        for b in e["sweep_diverged"]:
            out.append(f"{label}: every LR of its sweep diverged at batch {format_tokens(b)}")
    return out
