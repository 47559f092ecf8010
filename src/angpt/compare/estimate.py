"""The dry run: the planned runs with their status, and a time estimate from step times measured here."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from angpt.compare.plan import Arm, Plan, format_lr, format_tokens
from angpt.compare.store import RunSpec, load_record


def measure_step_times(plan: Plan, threads: int, steps: int = 3) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per training step of each arm, timed here: 1 warm-up step, then the median of `steps` steps.

    A step is the real thing (the plan's batch, micro-batches, optimizer, constraint) on the plan's data; the
    run configs are those of the smallest budget. Also returns each arm's set-up time (model and optimizer
    construction), a per-run cost that dominates short runs.
    """
    import torch

    from angpt.data import TokenLoader, load_meta
    from angpt.models import model_from_config
    from angpt.train.config import load_run_config
    from angpt.train.loop import resolve_model_config
    from angpt.train.optim import make_optimizer
    from angpt.train.step import TrainStep, resolve_dtype, synchronize

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    meta = load_meta(plan.data)
    out: dict[str, float] = {}
    setup: dict[str, float] = {}
    device = torch.device("cuda" if plan.device == "auto" and torch.cuda.is_available() else "cpu")
    if plan.device not in ("auto", "cpu"):
        device = torch.device(plan.device)
    try:
        # An untimed first build pays the process's one-off costs (lazy imports, optimizer set-up), which a
        # comparison pays once, not per run.
        cfg0 = load_run_config(None, plan.run_overrides(plan.arms[0], plan.budgets[0], plan.seeds[0], 1e-3, "-"))
        warm = model_from_config(resolve_model_config(cfg0, meta)).to(device)
        make_optimizer(warm, cfg0.arch, 1e-3, max_steps=100)
        del warm
        for arm in plan.arms:
            t_setup = time.perf_counter()
            cfg = load_run_config(None, plan.run_overrides(arm, plan.budgets[0], plan.seeds[0], 1e-3, "unused"))
            mcfg = resolve_model_config(cfg, meta)
            torch.manual_seed(0)
            model = model_from_config(mcfg).to(device)
            opt, sched = make_optimizer(model, cfg.arch, cfg.lr, max_steps=100, warmup_steps=0)
            loader = TokenLoader(plan.data, "train", plan.micro_batch, plan.seq_len, seed=0)
            accum = plan.batch_tokens // (plan.seq_len * plan.micro_batch)
            step = TrainStep(model, opt, sched, device=device, dtype=resolve_dtype(plan.dtype, device), accum=accum)
            setup[arm.label] = time.perf_counter() - t_setup
            times = []
            for i in range(steps + 1):
                t0 = time.perf_counter()
                step(loader.next_batch)
                synchronize(device)
                if i:  # the first step pays one-off costs (allocations, kernel selection)
                    times.append(time.perf_counter() - t0)
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


def describe_dry_run(plan: Plan, report_dir: Path, *, jobs: int, threads: int, measure: bool = True) -> DryRun:
    """The planned runs with their status, and a time estimate from step times measured on this machine."""
    dr = DryRun(max_extensions=plan.max_extensions * sum(len(plan.initial_grid(a)) > 1 for a in plan.arms))
    dr.jobs, dr.threads = jobs, threads

    def done(arm: Arm, budget: int, seed: int, lr: float) -> bool:
        return load_record(plan.run_dir(report_dir, arm, budget, seed, lr), plan.steps(budget)) is not None

    lines = [
        f"plan: {len(plan.arms)} arms x {len(plan.budgets)} budgets x {len(plan.seeds)} seeds, baseline "
        f"{plan.baseline}; batch {plan.batch_tokens} tokens (seq_len {plan.seq_len}, micro-batch "
        f"{plan.micro_batch}); preset {plan.preset}; data {plan.data}"
    ]
    lines.append(f"LR sweep at {format_tokens(plan.sweep_budget)} tokens, seed {plan.sweep_seed}:")
    for a in plan.arms:
        grid = plan.initial_grid(a)
        flags = [done(a, plan.sweep_budget, plan.sweep_seed, lr) for lr in grid]
        dr.sweep += [(RunSpec(a.label, plan.sweep_budget, plan.sweep_seed, lr), f) for lr, f in zip(grid, flags)]
        fixed = " (fixed: not tuned)" if len(grid) == 1 else ""
        lines.append(
            f"  {a.label:<24} lr {', '.join(format_lr(x) for x in grid)}{fixed}  [{sum(flags)}/{len(grid)} done]"
        )
    if dr.max_extensions:
        lines.append(f"  + up to {dr.max_extensions} grid extension run(s) if a best LR sits at a grid edge")
    lines.append("runs at each arm's best LR (the sweep's own run counts for the smallest budget and first seed):")
    for a in plan.arms:
        for b in plan.budgets:
            shared = " (one is the sweep's run)" if b == plan.sweep_budget else ""
            lines.append(
                f"  {a.label:<24} {format_tokens(b):>8} tokens = {plan.steps(b):>6} steps x {len(plan.seeds)} "
                f"seed(s){shared}"
            )
            dr.main += [(a.label, b, s) for s in plan.seeds if not (b == plan.sweep_budget and s == plan.sweep_seed)]
    if measure:
        dr.step_times, dr.setup_times = measure_step_times(plan, threads)

        def est(label: str, budget: int) -> float:
            return estimate_run_seconds(plan, dr.step_times[label], budget, dr.setup_times[label])

        seq = sum(est(spec.arm, spec.budget) for spec, is_done in dr.sweep if not is_done)
        # Main runs are counted as not done: their LR is only known once the sweep has finished.
        seq += sum(est(label, b) for label, b, _s in dr.main)
        ext = sum(
            plan.max_extensions * est(a.label, plan.sweep_budget) for a in plan.arms if len(plan.initial_grid(a)) > 1
        )
        dr.seconds = seq / jobs
        dr.seconds_max = (seq + ext) / jobs
        lines.append(
            "step time (measured here: 1 warm-up step, then the median of 3 real training steps per arm, "
            f"{threads} thread(s) per job):"
        )
        for label, t in dr.step_times.items():
            lines.append(f"  {label:<24} {t:.3f} s/step, {dr.setup_times[label]:.2f} s set-up per run")
        lines.append(
            f"estimated time: {_hms(dr.seconds)} with {jobs} job(s), up to {_hms(dr.seconds_max)} if every sweep "
            "extension runs (set-up + steps x step time + validation passes per run; finished sweep runs excluded; "
            "parallel jobs assumed to scale perfectly)"
        )
    dr.text = "\n".join(lines)
    return dr


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
