"""Training-step and inference timing of several architectures, side by side in one process.

Repetitions are interleaved (arch A, B, C, A, B, C, ...) so that drift in the machine's speed hits every arm
alike; each figure is a median, and ratios are taken against the first architecture (GPT+ by default).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from angpt.models import build_model, fold_for_inference
from angpt.train.optim import make_optimizer
from angpt.train.step import TrainStep, autocast, synchronize


@dataclass
class StepTiming:
    arch: str
    params: int
    train_ms: float
    infer_ms: float
    train_ratio: float = 1.0
    infer_ratio: float = 1.0


def bench_step(
    archs: list[str],
    preset: str = "demo",
    *,
    batch_size: int = 8,
    seq_len: int | None = None,
    dtype: str = "fp32",
    compile: bool = False,
    warmup: int = 3,
    reps: int = 10,
    device: str | None = None,
    seed: int = 0,
) -> list[StepTiming]:
    """Median ms per training step (forward, backward, optimizer step, constraint) and per folded inference
    forward, for each architecture; ratios against `archs[0]`."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    runs = []
    for arch in archs:
        torch.manual_seed(seed)
        model = build_model(arch, preset).to(dev)
        T = seq_len or model.config.context_length
        opt, sched = make_optimizer(model, lr=1e-4, max_steps=10_000)
        infer = fold_for_inference(model).to(dev)
        step = TrainStep(model, opt, sched, device=dev, dtype=dtype, forward=torch.compile(model) if compile else model)
        infer_fn = torch.compile(infer) if compile else infer
        x = torch.randint(0, model.config.vocab_size, (batch_size, T + 1), device=dev)
        runs.append((arch, model, step, infer_fn, x))

    def train_step(run):
        _, _, step, _, x = run
        step(lambda: (x[:, :-1], x[:, 1:]))

    @torch.no_grad()
    def infer_step(run):
        _, _, _, fn, x = run
        with autocast(dev, dtype):
            fn(x[:, :-1])

    # Training steps first, then inference, each interleaved across architectures: a training step between two
    # inference forwards would evict their caches and blur the inference comparison.
    times = {arch: ([], []) for arch in archs}
    for kind, step in ((0, train_step), (1, infer_step)):
        for rep in range(warmup + reps):
            for run in runs:
                synchronize(dev)
                t0 = time.perf_counter()
                step(run)
                synchronize(dev)
                if rep >= warmup:
                    times[run[0]][kind].append(time.perf_counter() - t0)
    out = [
        StepTiming(a, m.num_params(), 1e3 * statistics.median(times[a][0]), 1e3 * statistics.median(times[a][1]))
        for a, m, *_ in runs
    ]
    for t in out:
        t.train_ratio = t.train_ms / out[0].train_ms
        t.infer_ratio = t.infer_ms / out[0].infer_ms
    return out


def format_table(rows: list[StepTiming]) -> str:
    lines = [
        "| arch | params | train ms/step | train ratio | folded infer ms | infer ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.arch} | {r.params / 1e6:.2f}M | {r.train_ms:.1f} | {r.train_ratio:.3f} | "
            f"{r.infer_ms:.1f} | {r.infer_ratio:.3f} |"
        )
    return "\n".join(lines)
