"""The dry run of a ladder or batch-size study: sizes, budgets, run counts and a time estimate from step times
measured here (angpt.compare.estimate: one warm-up and three real training steps per arm and size)."""

from __future__ import annotations

from pathlib import Path

from angpt.compare.estimate import estimate_run_seconds, measure_step_times
from angpt.compare.plan import Plan, format_lr, format_tokens
from angpt.compare.store import load_record
from angpt.scaling.collect import size_dir
from angpt.scaling.plan import Ladder


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _si(x: float) -> str:
    for div, s in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if x >= div:
            return f"{x / div:.3g}{s}"
    return f"{x:.3g}"


def _main_cost(plan: Plan, ladder: Ladder, t: float, setup: float) -> tuple[float, int]:
    """Seconds and tokens of one arm's main runs at one size (every seed), the sweep's own run excluded.

    Cosine: every budget is a run. WSD: the longest run in full, each shorter budget only its decay (the first
    seed's smallest budget is the sweep's run, already counted)."""
    seconds, tokens = 0.0, 0
    budgets = plan.budgets
    for k in range(len(plan.seeds)):
        for i, b in enumerate(budgets):
            if k == 0 and i == 0:
                continue
            full = estimate_run_seconds(plan, t, b, setup)
            if ladder.schedule == "wsd" and b != budgets[-1]:
                frac = ladder.decay_fraction
                seconds += setup + (full - setup) * frac
                tokens += int(b * frac)
            else:
                seconds += full
                tokens += b
    return seconds, tokens


def describe_ladder(ladder: Ladder, out: Path, *, jobs: int, threads: int, measure: bool = True) -> str:
    """The planned ladder with parameter counts, budgets, run counts and a measured time estimate."""
    labels = [a.label for a in ladder.arms]
    lr_mode = "tuned on the smallest size and reused (--lr-transfer)" if ladder.lr_transfer else "tuned per size"
    sched = (
        f"wsd (decay over the last {ladder.decay_fraction:g}, {ladder.decay_shape}; shorter budgets branch off the "
        "longest run)"
        if ladder.schedule == "wsd"
        else "cosine (every budget its own run)"
    )
    lines = [
        f"ladder: {len(ladder.sizes)} sizes x {len(ladder.sizes[0].budgets)} budgets x {len(labels)} arms x "
        f"{len(ladder.seeds)} seed(s); baseline {ladder.baseline}; batch "
        f"{format_tokens(ladder.compare['batch_tokens'])} tokens; preset {ladder.compare['preset']}; "
        f"data {ladder.data}",
        f"schedule {sched}; LR {lr_mode}",
        f"{'size':<12} {'depth':>5} {'width':>5} {'heads':>5} "
        + " ".join(f"{'N ' + lab:>12}" for lab in labels)
        + "  budgets (tokens = steps, tokens per N)",
    ]
    for size in ladder.sizes:
        s = size.shape
        n0 = size.params[ladder.baseline]
        budgets = ", ".join(f"{format_tokens(b)} = {ladder.steps(b)} ({b / n0:.3g})" for b in size.budgets)
        lines.append(
            f"{size.name:<12} {s.depth:>5} {s.width:>5} {s.heads:>5} "
            + " ".join(f"{_si(size.params[lab]):>12}" for lab in labels)
            + f"  {budgets}"
        )
    total_s = total_max = 0.0
    runs = sweep_runs = ext_runs = 0
    tokens = 0
    timing = []
    for i, size in enumerate(ladder.sizes):
        transferred = {a.label: 1.0 for a in ladder.arms} if ladder.lr_transfer and i > 0 else None
        plan = ladder.size_plan(i, transferred)
        step_t, setup = measure_step_times(plan, threads) if measure else ({}, {})
        timing.append((size.name, step_t, setup))
        for a in plan.arms:
            grid = plan.initial_grid(a)
            t, su = step_t.get(a.label, 0.0), setup.get(a.label, 0.0)
            done = sum(
                load_record(
                    plan.run_dir(size_dir(out, size.name), a, plan.sweep_budget, plan.sweep_seed, lr),
                    plan.steps(plan.sweep_budget),
                )
                is not None
                for lr in grid
            )
            sweep_runs += len(grid) if len(grid) > 1 else 0
            runs += len(grid)
            tokens += len(grid) * plan.sweep_budget
            total_s += (len(grid) - done) * estimate_run_seconds(plan, t, plan.sweep_budget, su)
            if len(grid) > 1:
                ext_runs += plan.max_extensions
                total_max += plan.max_extensions * estimate_run_seconds(plan, t, plan.sweep_budget, su)
            sec, tok = _main_cost(plan, ladder, t, su)
            total_s += sec
            tokens += tok
            runs += len(plan.budgets) * len(plan.seeds) - 1
            if i == 1 and ladder.lr_transfer:  # the transfer check's sweep at the second size
                check = ladder.check_plan()
                sweep_runs += len(check.initial_grid(a))
                runs += len(check.initial_grid(a))
                tokens += len(check.initial_grid(a)) * check.sweep_budget
                total_s += len(check.initial_grid(a)) * estimate_run_seconds(check, t, check.sweep_budget, su)
    total_max += total_s
    lines.append(
        f"runs: {runs} ({sweep_runs} in LR sweeps, the rest at each arm's best LR), + up to {ext_runs} sweep "
        f"extension(s); {_si(tokens)} tokens trained in all"
        + (" (WSD branches count their decay only)" if ladder.schedule == "wsd" else "")
    )
    if measure:
        lines.append(
            f"step time (measured here: 1 warm-up, then the median of 3 training steps per arm, {threads} thread(s) "
            "per job):"
        )
        for name, step_t, setup in timing:
            lines.append(
                f"  {name:<12} "
                + ", ".join(f"{lab} {step_t[lab]:.3f} s/step (+{setup[lab]:.1f} s set-up)" for lab in labels)
            )
        lines.append(
            f"estimated time: {_hms(total_s / jobs)} with {jobs} job(s), up to {_hms(total_max / jobs)} if every "
            "sweep extension runs (set-up + steps x step time + validation passes; finished sweep runs excluded)"
        )
    return "\n".join(lines)


def describe_batch(study, out: Path, *, jobs: int, threads: int, measure: bool = True) -> str:
    """The planned batch-size study and a measured time estimate."""
    from angpt.scaling.batch import batch_dir

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
        lines.append(f"estimated time: {_hms(total / jobs)} with {jobs} job(s) (sweep extensions not included)")
    return "\n".join(lines)
