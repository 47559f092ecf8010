"""``--jobs auto``: choose parallel jobs x torch threads by measuring, not guessing.

On a small machine, two single-threaded runs side by side can beat one two-threaded run (tiny matmuls scale
badly across threads) or lose to it (memory bandwidth, a shared GPU). So each candidate split of the cores
(1 x cores, 2 x cores/2, ...) runs that many worker processes at once, each timing a few real training steps of
the baseline arm at the plan's shape after one warm-up step; the split with the most tokens per second overall
wins. The processes start together (each waits after its warm-up until all are ready), so they overlap fully.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from angpt.errors import UserError
from angpt.study.plan import Plan


def candidates(cores: int, max_jobs: int) -> list[tuple[int, int]]:
    """(jobs, threads) splits of `cores`: jobs 1, 2, 4, ... up to min(cores, max_jobs), threads cores // jobs."""
    out, j = [], 1
    while j <= max(1, min(cores, max_jobs)):
        out.append((j, max(1, cores // j)))
        j *= 2
    return out


def parallel_runs(plan: Plan) -> int:
    """How many runs the plan can have going at once: its first sweeps, or every arm x seed at one budget."""
    return max(sum(len(plan.initial_grid(a)) * len(a.settings()) for a in plan.arms), len(plan.arms) * len(plan.seeds))


def measure(plan: Plan, jobs: int, threads: int, steps: int) -> float:
    """Tokens per second of `jobs` worker processes with `threads` torch threads each, training side by side."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "angpt.study.worker", "measure", str(threads), str(steps)]
    procs = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        for _ in range(jobs)
    ]
    try:
        plan_line = json.dumps(plan.to_dict()) + "\n"
        for p in procs:
            p.stdin.write(plan_line)  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        for p in procs:  # each prints "ready" after its warm-up step
            if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
                raise UserError(f"--jobs auto: a measuring process failed: {_tail(p)}")
        for p in procs:
            p.stdin.write("go\n")  # type: ignore[union-attr]
            p.stdin.close()  # type: ignore[union-attr]
        total = 0.0
        for p in procs:
            line = p.stdout.readline()  # type: ignore[union-attr]
            if p.wait() != 0 or not line.strip():
                raise UserError(f"--jobs auto: a measuring process failed: {_tail(p)}")
            total += json.loads(line)["tokens_per_s"]
        return total
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _tail(p: subprocess.Popen) -> str:
    try:
        p.kill()
        err = p.stderr.read() if p.stderr else ""  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - best effort for the message
        err = ""
    lines = [x for x in (err or "").strip().splitlines() if x.strip()]
    return lines[-1] if lines else f"exit {p.poll()}"


def choose_jobs(
    plan: Plan,
    cores: int,
    *,
    steps: int = 3,
    measure_fn: Callable[[Plan, int, int, int], float] | None = None,
) -> dict[str, Any]:
    """Measure every candidate split of `cores` (with :func:`measure` unless `measure_fn`) and pick the fastest
    (ties: fewer jobs); returns the record kept in the report directory: {"jobs", "threads", "candidates":
    [{"jobs", "threads", "tokens_per_s"}], ...}."""
    measure_fn = measure_fn or measure
    results = []
    for jobs, threads in candidates(cores, parallel_runs(plan)):
        tps = measure_fn(plan, jobs, threads, steps)
        results.append({"jobs": jobs, "threads": threads, "tokens_per_s": tps})
    best = max(results, key=lambda r: (r["tokens_per_s"], -r["jobs"]))
    return {
        "jobs": best["jobs"],
        "threads": best["threads"],
        "candidates": results,
        "arm": plan.baseline,
        "steps": steps,
        "cores": cores,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def describe(record: dict[str, Any]) -> str:
    """One line: what was measured and chosen."""
    cands = ", ".join(f"{c['jobs']}x{c['threads']} {c['tokens_per_s']:,.0f} tok/s" for c in record["candidates"])
    return (
        f"--jobs auto: jobs x threads measured on {record['arm']} ({record['steps']} steps each): {cands}; "
        f"chose {record['jobs']} job(s) x {record['threads']} thread(s)"
    )


def measure_worker(threads: int, steps: int) -> int:
    """In a worker process (``_worker measure``): the plan on stdin's first line; warm up one step, print "ready",
    wait for a line, time `steps` steps, print {"tokens_per_s": ...}."""
    import torch

    from angpt.study.estimate import plan_device, train_step_for
    from angpt.train.step import synchronize

    torch.set_num_threads(threads)
    plan = Plan.from_dict(json.loads(sys.stdin.readline()))
    device = plan_device(plan)
    step, next_batch = train_step_for(plan, plan.arm(plan.baseline), device)
    step(next_batch)
    synchronize(device)
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(next_batch)
    synchronize(device)
    print(json.dumps({"tokens_per_s": steps * plan.batch_tokens / (time.perf_counter() - t0)}), flush=True)
    return 0
