"""The dry run: the planned runs with their status, and a time estimate from step times measured here."""

from __future__ import annotations

import math
import time

from angpt.study.arms import Arm
from angpt.study.plan import Plan


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
