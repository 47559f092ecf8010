"""What `angpt train` says before its first step, and once its first steps are timed.

At `gpt2-small` a CPU step takes most of a minute, and the bar shows nothing until the first one ends. So before
step 1 the run says in five lines what it is about to do (its parameters, device and dtype, the rate and where it
comes from, the tokens per step and in all, how often it reads its data) and the least it can take: its FLOPs at
the device's peak (on a CPU, the matmul peak the loop measures for MFU anyway). The first steps allocate memory and
pick kernels, so the measured time follows after step TIMED_AFTER, from the steps after the first.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from angpt.units import count, duration

TIMED_AFTER = 3  # steps of this process; the first is left out of the estimate (memory, kernels)


@dataclass
class RunSummary:
    """The numbers the summary prints, gathered by the trainer once it is built and restored."""

    arch: str
    preset: str
    params: int
    params_non_embedding: int | None  # None where the model has no separate embedding table
    device: str  # "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)", with "x N processes" for several
    dtype: str
    lr: float
    lr_from: str  # " (the angpt recipe's at tiny; train.lr unset)", " (train.lr)": ResolvedRun.lr_from's words
    batch_tokens: int
    micro_batch: int
    seq_len: int
    accum: int
    world_size: int
    max_steps: int
    step: int  # where this process starts: 0, or the resumed checkpoint's step
    train_tokens: int  # what one pass over the training split reads (whole windows), as the epochs warning counts
    flops_per_token: float  # training FLOPs per token (6N + attention)
    peak: float | None  # FLOP/s of one device (measured on a CPU), None where unknown
    mfu: float | None = None  # the dry run's estimate of the step's utilisation (a CPU run), None: not estimated
    cpu_note: str = ""  # that the machine is busy (hardware.CpuShare.note)

    @property
    def tokens(self) -> int:
        return self.max_steps * self.batch_tokens


def startup_lines(s: RunSummary) -> list[str]:
    """The summary printed before step 1 (rank 0)."""
    params = f"{s.params:,} parameters ({count(s.params)})"
    if s.params_non_embedding is not None:
        params += f", {s.params_non_embedding:,} non-embedding"
    geometry = f"micro_batch {s.micro_batch} x {s.seq_len} tokens x {s.accum} accumulation step(s)"
    if s.world_size > 1:
        geometry = f"{s.world_size} processes x {geometry}"
    run = f"{s.max_steps:,} steps x {s.batch_tokens:,} = {s.tokens:,} tokens ({count(s.tokens)})"
    if s.step:
        run = f"resuming at step {s.step:,} of {s.max_steps:,}; {run}"
    passes = s.tokens / max(s.train_tokens, 1)
    return [
        f"training {s.arch} at preset {s.preset}: {params}; {s.device}, {s.dtype}",
        f"  lr     {s.lr:g}{s.lr_from}",
        f"  batch  {s.batch_tokens:,} tokens/step = {geometry}",
        f"  run    {run}, {passes:.3g} passes over the {s.train_tokens:,} training tokens",
        f"  time   {_estimate(s)}measured after {TIMED_AFTER} steps",
        *([f"  cpu    {s.cpu_note}"] if s.cpu_note else []),
    ]


def _estimate(s: RunSummary) -> str:
    """The dry run's estimate of the steps (their FLOPs at the measured peak and the MFU measured on one block of
    the model), where the trainer made one; else the least they can take."""
    if not s.peak or not s.mfu:
        return _bound(s)
    step = s.flops_per_token * s.batch_tokens / (s.world_size * s.peak * s.mfu)
    left = (s.max_steps - s.step) * step
    return (
        f"~{step:.3g} s/step, ~{duration(left)} to go (estimated as --dry-run does: MFU {s.mfu:.2g} of the measured "
        f"{s.peak / 1e9:,.4g} GFLOP/s); "
    )


def _bound(s: RunSummary) -> str:
    """The least the steps can take: their FLOPs at the device's peak (every FLOP at full speed)."""
    if not s.peak:
        return ""
    step = s.flops_per_token * s.batch_tokens / (s.world_size * s.peak)
    left = (s.max_steps - s.step) * step
    return f"at least {step:.3g} s/step, {duration(left)} to go (its FLOPs at {s.peak / 1e9:,.4g} GFLOP/s); "


def timed_line(s: RunSummary, done: int, step_times: list[float]) -> str | None:
    """After this process's TIMED_AFTER-th step (`done` steps in all): the time per step measured on the steps
    after the first, and what it makes the run take; None at any other step, or with no step left."""
    if len(step_times) != TIMED_AFTER or done >= s.max_steps:
        return None
    per_step = statistics.median(step_times[1:])
    return (
        f"after step {done}: ~{per_step:.3g} s/step ({s.batch_tokens / per_step:,.0f} tokens/s), "
        f"~{duration(s.max_steps * per_step)} for the run, {duration((s.max_steps - done) * per_step)} to go "
        "(steps only: evaluation and checkpoints add theirs)"
    )


EPOCHS_WARNING = 4  # a run that reads its data more often than this is warned that it will overfit


def epochs_note(tc, per_epoch: int) -> str | None:
    """How many times a run (its TrainConfig `tc`) reads training data of `per_epoch` tokens a pass, when that is
    more than a few (it will overfit): said by the trainer at its start and by the dry run alike."""
    epochs = tc.max_steps * tc.batch_tokens / max(per_epoch, 1)
    if epochs <= EPOCHS_WARNING:
        return None
    best = " (train.keep_best keeps the checkpoint of the lowest validation loss)" if tc.keep_best else ""
    return (
        f"train.max_steps={tc.max_steps} x train.batch_tokens={tc.batch_tokens:,} reads the {per_epoch:,} training "
        f"tokens {epochs:.1f} times ({epochs:.1f} epochs): validation loss usually stops improving after a few; use "
        f"more data or fewer steps{best}"
    )
