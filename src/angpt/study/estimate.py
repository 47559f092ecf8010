"""The dry run of a plan: its runs with their status, a time estimate from step times measured here, and its cost
on GPUs (what a Slurm dry run and the in-process executor's deadline read)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from angpt.study.arms import Arm
from angpt.study.plan import Plan
from angpt.study.store import RunSpec, load_record
from angpt.units import format_lr, format_tokens, hms


def plan_device(plan: Plan):
    """The torch device the plan's runs use (auto: CUDA when present)."""
    import torch

    if plan.device not in ("auto", "cpu"):
        return torch.device(plan.device)
    return torch.device("cuda" if plan.device == "auto" and torch.cuda.is_available() else "cpu")


def train_step_for(plan: Plan, arm: Arm, device, meta: dict | None = None):
    """A real training step of `arm` as its runs at the smallest budget take it: the run of the plan's smallest
    budget, resolved and built as `angpt train` builds it (train/setup.py: batch, micro-batches, optimizer and
    constraint, on the plan's data, compiled where its runs compile): returns (step, loader.next_batch); call
    ``step(next_batch)``. ``step.forward is not step.model`` when it compiles."""
    from angpt.data import load_meta
    from angpt.train.config import load_run_config
    from angpt.train.dist import DistInfo
    from angpt.train.hardware import keep_freed_memory
    from angpt.train.setup import build, resolve

    cfg = load_run_config(None, plan.run_overrides(arm, plan.budgets[0], plan.seeds[0], 1e-3, "unused"))
    cfg.out = None  # a fresh run: no folder to read
    run = resolve(cfg, device=device, meta=meta if meta is not None else load_meta(plan.data))
    if device.type == "cpu":
        keep_freed_memory()  # as the trainer sets up its process
    built = build(run, DistInfo(device=device))
    return built.step, built.loader.next_batch


def measure_step_times(plan: Plan, threads: int, steps: int = 3) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per training step of each arm, timed here: 1 warm-up step, then the median of `steps` steps.

    A step is the real thing (:func:`train_step_for`); the run configs are those of the smallest budget. Also
    returns each arm's set-up time (model and optimizer construction, and where the runs compile, the first step's
    compiling, which each run pays afresh), a per-run cost that dominates short runs.
    """
    import torch

    from angpt.data import load_meta
    from angpt.train.step import synchronize

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    meta = load_meta(plan.data)
    out: dict[str, float] = {}
    setup: dict[str, float] = {}
    device = plan_device(plan)
    try:
        # An untimed first build pays the process's one-off costs (lazy imports, optimizer set-up), which a
        # comparison pays once, not per run.
        train_step_for(plan, plan.arms[0], device, meta)
        for arm in plan.arms:
            t_setup = time.perf_counter()
            step, next_batch = train_step_for(plan, arm, device, meta)
            setup[arm.label] = time.perf_counter() - t_setup
            times = []
            for _ in range(steps + 1):
                t0 = time.perf_counter()
                step(next_batch)
                synchronize(device)
                times.append(time.perf_counter() - t0)
            first, times = times[0], times[1:]  # the first step pays one-off costs (allocations, kernel selection)
            if step.forward is not step.model:
                setup[arm.label] += first  # ... and, compiled, the compiling: every run compiles afresh
            out[arm.label] = sorted(times)[len(times) // 2]
    finally:
        torch.set_num_threads(old)
    return out, setup


def estimate_run_seconds(plan: Plan, step_time: float, budget: int, setup: float = 0.0) -> float:
    """Set-up, training steps and validation passes (a forward is ~1/3 of a micro-batch's forward+backward)."""
    steps = plan.steps(budget)
    accum = plan.batch_tokens // (plan.seq_len * plan.micro_batch)
    evals = math.ceil(steps / plan.eval_every(budget))
    return setup + steps * step_time + evals * plan.eval_batches * step_time / (3 * accum)


@dataclass
class DryRun:
    """What a dry run found: the planned runs, which are done, and the time estimate."""

    sweep: list[tuple[RunSpec, bool]] = field(default_factory=list)  # (run, done)
    main: list[tuple[str, int, int]] = field(default_factory=list)  # (arm, budget, seed); LR chosen later
    max_extensions: int = 0
    step_times: dict[str, float] = field(default_factory=dict)
    setup_times: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    seconds_max: float = 0.0
    jobs: int = 1
    threads: int = 1
    text: str = ""


def describe_dry_run(
    plan: Plan, report_dir: Path, *, jobs: int, threads: int, measure: bool = True, horizon_line: str | None = None
) -> DryRun:
    """The planned runs with their status, and a time estimate from step times measured on this machine.

    Runs go budget by budget (sweep.run_plan): the sweeps due at a budget (every arm's at the smallest, a tuned
    arm's at each), then every arm x seed there. `horizon_line` (horizon.Horizon.message) is printed first.
    """
    dr = DryRun()
    dr.jobs, dr.threads = jobs, threads
    swept = [(a, b) for b in plan.budgets for a in plan.arms if plan.tunes_at(a, b)]
    dr.max_extensions = plan.max_extensions * sum(len(plan.initial_grid(a)) > 1 for a, _ in swept)

    def done(spec: RunSpec) -> bool:
        return load_record(spec.run_dir(plan, report_dir), plan.steps(spec.budget)) is not None

    lines = [horizon_line] if horizon_line else []
    lines.append(
        f"plan: {len(plan.arms)} arms x {len(plan.budgets)} budgets x {len(plan.seeds)} seeds, baseline "
        f"{plan.baseline}; batch {plan.batch_tokens} tokens (seq_len {plan.seq_len}, micro-batch "
        f"{plan.micro_batch}); preset {plan.preset}; data {plan.data}"
    )
    lines.append(
        f"runs go budget by budget: at each, the sweeps due there (seed {plan.sweep_seed}), then every arm x seed"
    )
    for b in plan.budgets:
        lines.append(f"{format_tokens(b)} tokens = {plan.steps(b)} steps:")
        for a in plan.arms:
            if plan.tunes_at(a, b):
                grid_lrs = plan.initial_grid(a)
                specs = [RunSpec(a.label, b, plan.sweep_seed, lr, st) for st in a.settings() for lr in grid_lrs]
                flags = [done(sp) for sp in specs]
                dr.sweep += list(zip(specs, flags))
                grid = ", ".join(format_lr(x) for x in plan.initial_grid(a))
                fixed = " (fixed: not tuned)" if len(plan.initial_grid(a)) == 1 else ""
                tuned = f" x {len(a.settings())} settings ({_grid_text(a)})" if a.tune else ""
                lines.append(f"  {a.label:<24} sweep lr {grid}{fixed}{tuned}  [{sum(flags)}/{len(specs)} done]")
            seeds = [s for s in plan.seeds if not (plan.tunes_at(a, b) and s == plan.sweep_seed)]
            dr.main += [(a.label, b, s) for s in seeds]
            lines.append(
                f"  {a.label:<24} {len(plan.seeds)} seed(s) at its chosen LR"
                + (" (one is the sweep's best run)" if len(seeds) < len(plan.seeds) else "")
            )
    checked = [a for a in plan.arms if plan.checks_lr(a)]
    if checked:
        lines.append(
            f"then the LR check: {', '.join(a.label for a in checked)} on seed {plan.sweep_seed} at "
            f"{format_tokens(plan.budgets[-1])} at the chosen LR and its two grid neighbours"
        )
    if dr.max_extensions:
        lines.append(f"+ up to {dr.max_extensions} grid extension run(s) if a best LR sits at a grid edge")
    if measure:
        dr.step_times, dr.setup_times = measure_step_times(plan, threads)

        def est(label: str, budget: int) -> float:
            return estimate_run_seconds(plan, dr.step_times[label], budget, dr.setup_times[label])

        seq = sum(est(spec.arm, spec.budget) for spec, is_done in dr.sweep if not is_done)
        # Main runs are counted as not done: their LR is only known once the sweep has finished.
        seq += sum(est(label, b) for label, b, _s in dr.main)
        seq += sum(3 * est(a.label, plan.budgets[-1]) for a in checked)
        ext = sum(plan.max_extensions * est(a.label, b) for a, b in swept if len(plan.initial_grid(a)) > 1)
        dr.seconds = seq / jobs
        dr.seconds_max = (seq + ext) / jobs
        lines.append(
            "step time (measured here: 1 warm-up step, then the median of 3 real training steps per arm, "
            f"{threads} thread(s) per job; a compiled run's compiling counts as its set-up):"
        )
        for label, t in dr.step_times.items():
            lines.append(f"  {label:<24} {t:.3f} s/step, {dr.setup_times[label]:.2f} s set-up per run")
        lines.append(
            f"estimated time: {hms(dr.seconds)} with {jobs} job(s), up to {hms(dr.seconds_max)} if every sweep "
            "extension runs (set-up + steps x step time + validation passes per run; finished sweep runs excluded; "
            "parallel jobs assumed to scale perfectly)"
        )
    dr.text = "\n".join(lines)
    return dr


def _grid_text(arm: Arm) -> str:
    return " x ".join(f"{k} {'/'.join(f'{v:g}' for v in vs)}" for k, vs in sorted(arm.tune.items()))


LONG_PLAN_S = 3600.0  # a plan longer than this on this machine says so before it starts
CHECKPOINT_BYTES_PER_PARAM = 16  # a run's last checkpoint (fp32 weights, Adam m and v) and its best (weights)


def plan_cost(plan: Plan, report_dir: Path, *, mfu: float | None = None) -> tuple[float, float, int]:
    """(seconds on this machine, bytes of checkpoints, runs) of the runs a plan has left: each arm's step as
    `angpt train --dry-run` estimates it on this machine (its FLOPs at the measured peak over the MFU measured on one
    block; `mfu` given: that one, measuring nothing), times the steps of its runs, sweeps, main runs and LR checks.
    Jobs share the machine's cores, so their count does not shorten it."""
    dr = describe_dry_run(plan, report_dir, jobs=1, threads=1, measure=False)
    reports = planned_steps(plan, gpus=1, gpu="cpu" if plan_device(plan).type == "cpu" else None, mfu=mfu)
    step_s = {label: r.step_time for label, r in reports.items()}
    params = {label: r.params for label, r in reports.items()}
    runs = [(spec.arm, spec.budget) for spec, done in dr.sweep if not done] + [(a, b) for a, b, _ in dr.main]
    runs += [(a.label, plan.budgets[-1]) for a in plan.arms if plan.checks_lr(a) for _ in range(3)]
    seconds = sum(plan.steps(b) * step_s[a] for a, b in runs)
    return seconds, sum(CHECKPOINT_BYTES_PER_PARAM * params[a] for a, _ in runs), len(runs)


def planned_steps(plan: Plan, *, gpus: int, gpu: str | None, mfu: float | None = None) -> dict:
    """Each arm's step as `angpt train --dry-run` plans it (train/dryrun.py's plan_run: on `gpus` x `gpu`, None for
    this machine's, at `mfu`), as a fresh run at the largest budget: {arm label: DryRunReport}."""
    from angpt.train.config import load_run_config
    from angpt.train.dryrun import plan_run

    out = {}
    for arm in plan.arms:
        cfg = load_run_config(None, plan.run_overrides(arm, plan.budgets[-1], plan.seeds[0], 1e-3, "unused"))
        cfg.out = None  # planned as a fresh run: nothing to read
        out[arm.label] = plan_run(cfg, gpus=gpus, gpu=gpu, mfu=mfu)
    return out


def long_plan_warning(plan: Plan, report_dir: Path) -> str | None:
    """The line a plan that takes more than an hour on this machine prints before it starts, with its time and disk
    use; None for a shorter one (judged first at an MFU of 1, which measures nothing: a plan that would not take an
    hour even at the peak is not measured)."""

    if plan_cost(plan, report_dir, mfu=1.0)[0] * 10 < LONG_PLAN_S:  # not an hour even at 10% of the peak
        return None
    seconds, disk, n = plan_cost(plan, report_dir)
    if seconds < LONG_PLAN_S:
        return None
    return (
        f"this plan is {n} run(s): ~{hms(seconds)} of training on this machine (each arm's step as `angpt train "
        f"--dry-run` estimates it here) and ~{disk / 1e9:.1f} GB of checkpoints in {report_dir}; Ctrl-C stops it "
        "and the same command resumes it (--dry-run plans it, --budgets and --seeds shrink it)"
    )
