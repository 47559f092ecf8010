"""The batch-size study's dry run: its plans and a time estimate from step times measured here."""

from __future__ import annotations

from pathlib import Path

from angpt.study.estimate import estimate_run_seconds, measure_step_times
from angpt.study.store import load_record
from angpt.units import format_lr, format_tokens, hms


def describe_batch(study, out: Path, *, jobs: int, threads: int, measure: bool = True) -> str:
    """The planned batch-size study and a measured time estimate."""
    from angpt.study.batch.plan import batch_dir

    labels = [a.label for a in study.arms]
    shape = (
        f"depth {study.shape['depth']} width {study.shape['width']}"
        if study.shape
        else f"preset {study.compare['preset']}"
    )
    lines = [
        f"batch-size study: {len(labels)} arms x {len(study.batch_sizes)} batch sizes x {len(study.seeds)} seed(s) at "
        f"{format_tokens(study.tokens)} tokens ({shape}); critical batch within {study.tolerance:.0%} of the best",
    ]
    total = 0.0
    runs = 0
    for b in study.batch_sizes:
        plan = study.plan_for(b)
        step_t, setup = measure_step_times(plan, threads) if measure else ({}, {})
        cells = []
        for a in plan.arms:
            grid = plan.initial_grid(a)
            n = len(grid) + len(plan.seeds) - 1
            runs += n
            done = sum(
                load_record(plan.run_dir(batch_dir(out, b), a, plan.sweep_budget, plan.sweep_seed, lr), plan.steps(b))
                is not None
                for lr in grid
            )
            if measure:
                total += (n - done) * estimate_run_seconds(plan, step_t[a.label], study.tokens, setup[a.label])
                cells.append(f"{a.label} {step_t[a.label]:.3f} s/step")
            else:
                cells.append(f"{a.label} lr {', '.join(format_lr(x) for x in grid)}")
        lines.append(f"  batch {format_tokens(b):>6}: {plan.steps(study.tokens)} steps; " + ", ".join(cells))
    lines.append(f"runs: {runs} (LR sweep per batch, then the other seeds at the best LR)")
    if measure:
        lines.append(f"estimated time: {hms(total / jobs)} with {jobs} job(s) (sweep extensions not included)")
    return "\n".join(lines)
