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
    """The study's losses per arm and batch (mean over seeds) and each arm's critical batch; None without a study."""
    from angpt.study.stored import Unfinished, settle_sweeps

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
            lr = sweeps[a.label][plan.sweep_budget].best_lr
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
