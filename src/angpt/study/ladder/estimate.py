"""The dry run of a ladder or batch-size study: sizes, budgets, run counts and a time estimate from step times
measured here (angpt.study.estimate: one warm-up and three real training steps per arm and size)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from angpt.study.arms import Arm
from angpt.study.estimate import estimate_run_seconds, measure_step_times
from angpt.study.ladder.collect import check_dir, size_dir, size_plans
from angpt.study.ladder.plan import Ladder
from angpt.study.plan import Plan
from angpt.study.store import check_store, load_record
from angpt.study.stored import Unfinished, settle_sweeps
from angpt.study.sweep import main_specs
from angpt.units import format_tokens, hms, si


def _main_cost(
    plan: Plan, ladder: Ladder, t: float, setup: float, done: set[tuple[int, int]] | frozenset = frozenset()
) -> tuple[float, int]:
    """Seconds and tokens of one arm's main runs at one size (every seed), the sweep's own run excluded: the seconds
    of the runs not `done` ((budget, seed) pairs finished already), the tokens of all of them.

    Cosine: every budget is a run. WSD: the longest run in full, each shorter budget only its decay (the first
    seed's smallest budget is the sweep's run, already counted)."""
    seconds, tokens = 0.0, 0
    budgets = plan.budgets
    for k, seed in enumerate(plan.seeds):
        for i, b in enumerate(budgets):
            if k == 0 and i == 0:
                continue
            full = estimate_run_seconds(plan, t, b, setup)
            if ladder.schedule == "wsd" and b != budgets[-1]:
                frac = ladder.decay_fraction
                run_s, run_tokens = setup + (full - setup) * frac, int(b * frac)
            else:
                run_s, run_tokens = full, b
            seconds += 0.0 if (b, seed) in done else run_s
            tokens += run_tokens
    return seconds, tokens


@dataclass
class _Stored:
    """What a size's store (a compare report directory) holds already."""

    runs: int = 0  # finished runs, sweeps' and main
    mains: dict[str, set[tuple[int, int]]] = field(default_factory=dict)  # arm -> finished main (budget, seed)
    settled: bool = False  # every sweep finished (the main runs are known)
    done: bool = False  # every run finished: nothing left to train


def _stored(plan: Plan, plan_dir: Path) -> _Stored | None:
    """What the store in `plan_dir` holds for `plan`, read by compare's own sweep rule; None when it has not started.

    The store is checked as the run checks it (check_store: UserError when it holds another plan or runs of a model
    its arm no longer makes), and read with `plan`, which may extend the stored one (more budgets or seeds: not
    done)."""
    if check_store(plan, plan_dir) is None:
        return None
    try:
        plan, sweeps, runs = settle_sweeps(plan_dir, plan)
    except Unfinished:
        return _Stored()
    mains = main_specs(plan, sweeps)
    state = _Stored(settled=True)
    state.runs = sum(runs.known(s) is not None for s in {*runs.asked, *mains})
    for s in mains:
        if runs.known(s) is not None:
            state.mains.setdefault(s.arm, set()).add((s.budget, s.seed))
    state.done = all(runs.known(s) is not None for s in mains)
    return state


def _sweep_left(plan: Plan, plan_dir: Path, arm: Arm) -> int:
    """How many runs of `arm`'s initial LR grid have no finished record in `plan_dir`."""
    steps = plan.steps(plan.sweep_budget)
    return sum(
        load_record(plan.run_dir(plan_dir, arm, plan.sweep_budget, plan.sweep_seed, lr), steps) is None
        for lr in plan.initial_grid(arm)
    )


def describe_ladder(
    ladder: Ladder,
    out: Path,
    *,
    jobs: int,
    threads: int,
    measure: bool = True,
    plans: tuple[list[Plan], bool] | None = None,
) -> str:
    """The planned ladder with parameter counts, budgets, run counts and a measured time estimate of the work left.

    Every size's store is checked as the run checks it (runner.size_plans, whose `plans` may be given): a store
    holding another plan is the run's one-line UserError. Sizes whose store holds every run are marked done and cost
    nothing (their step times are not measured); a started size costs its unfinished runs. A larger size's store
    holding transferred LRs the smallest size has not settled yet is costed as reused, and marked so."""
    plans, known = plans or size_plans(ladder, out)
    stored = {size.name: _stored(plan, size_dir(out, size.name)) for size, plan in zip(ladder.sizes, plans)}
    lines = _size_table(ladder, stored, known)
    cost = _cost(ladder, plans, stored, out, threads, measure)
    lines.append(
        f"runs: {cost.runs} ({cost.sweep_runs} in LR sweeps, the rest at each arm's best LR)"
        + (f", {cost.finished} of them finished already" if cost.finished else "")
        + f", + up to {cost.ext_runs} sweep extension(s); {si(cost.tokens)} tokens trained in all"
        + (" (WSD branches count their decay only)" if ladder.schedule == "wsd" else "")
    )
    if measure:
        lines += _timing_lines(ladder, cost, jobs, threads)
    return "\n".join(lines)


def _size_table(ladder: Ladder, stored: dict, known: bool) -> list[str]:
    """The ladder's line, its schedule and LRs, and each size's shape, parameters, budgets and what is stored."""
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
        st = stored[size.name]
        state = "" if st is None else "  [done: reused]" if st.done else "  [started: finished runs reused]"
        if st is not None and not known and size != ladder.sizes[0]:
            state = f"  [{state[3:-1]} if the smallest size's sweep picks the LR(s) stored here]"
        lines.append(
            f"{size.name:<12} {s.depth:>5} {s.width:>5} {s.heads:>5} "
            + " ".join(f"{si(size.params[lab]):>12}" for lab in labels)
            + f"  {budgets}{state}"
        )
    return lines


@dataclass
class _Cost:
    """What a ladder's runs left cost: seconds (without and with every sweep extension), counts and tokens, and each
    size's measured step and set-up times (None where nothing is left)."""

    total_s: float = 0.0
    total_max: float = 0.0
    runs: int = 0
    sweep_runs: int = 0
    ext_runs: int = 0
    finished: int = 0
    tokens: int = 0
    timing: list = field(default_factory=list)


def _cost(ladder: Ladder, plans: list[Plan], stored: dict, out: Path, threads: int, measure: bool) -> _Cost:
    lr_check = ladder.check_plan() if ladder.lr_transfer else None  # the transfer check's sweep, at the second size
    lr_check_st = (_stored(lr_check, check_dir(out, ladder.sizes[1].name)) or _Stored()) if lr_check else None
    c = _Cost()
    for i, (size, plan) in enumerate(zip(ladder.sizes, plans)):
        here = size_dir(out, size.name)
        st = stored[size.name] or _Stored()
        check, check_st = (lr_check, lr_check_st) if i == 1 else (None, None)
        left = not st.done or (check_st is not None and not check_st.done)
        step_t, setup = measure_step_times(plan, threads) if measure and left else ({}, {})
        c.timing.append((size.name, step_t if left else None, setup))
        planned = 0
        for a in plan.arms:
            grid = plan.initial_grid(a)
            t, su = step_t.get(a.label, 0.0), setup.get(a.label, 0.0)
            c.sweep_runs += len(grid) if len(grid) > 1 else 0
            planned += len(grid) + len(plan.budgets) * len(plan.seeds) - 1
            c.tokens += len(grid) * plan.sweep_budget
            c.total_s += _sweep_left(plan, here, a) * estimate_run_seconds(plan, t, plan.sweep_budget, su)
            if len(grid) > 1 and not st.settled:  # a settled sweep extends no more
                c.ext_runs += plan.max_extensions
                c.total_max += plan.max_extensions * estimate_run_seconds(plan, t, plan.sweep_budget, su)
            sec, tok = _main_cost(plan, ladder, t, su, st.mains.get(a.label, frozenset()))
            c.total_s += sec
            c.tokens += tok
            if check is not None:
                n = len(check.initial_grid(a))
                c.sweep_runs += n
                planned += n
                c.tokens += n * check.sweep_budget
                left_check = _sweep_left(check, check_dir(out, size.name), a)
                c.total_s += left_check * estimate_run_seconds(check, t, check.sweep_budget, su)
        done_here = st.runs + (check_st.runs if check_st is not None else 0)
        c.runs += max(planned, done_here)
        c.finished += done_here
    c.total_max += c.total_s
    return c


def _timing_lines(ladder: Ladder, c: _Cost, jobs: int, threads: int) -> list[str]:
    labels = [a.label for a in ladder.arms]
    lines = [
        f"step time (measured here: 1 warm-up, then the median of 3 training steps per arm, {threads} thread(s) "
        "per job):"
    ]
    for name, step_t, setup in c.timing:
        if step_t is None:
            lines.append(f"  {name:<12} done: nothing left to train, not measured")
            continue
        lines.append(
            f"  {name:<12} "
            + ", ".join(f"{lab} {step_t[lab]:.3f} s/step (+{setup[lab]:.1f} s set-up)" for lab in labels)
        )
    lines.append(
        f"estimated time: {hms(c.total_s / jobs)} with {jobs} job(s), up to {hms(c.total_max / jobs)} if every "
        "sweep extension runs (set-up + steps x step time + validation passes; finished runs excluded)"
    )
    return lines
