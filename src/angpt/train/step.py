"""The training step, written once: `angpt train`, `compare`'s time estimate and `bench step` all run this.

One step is: forward and backward over the micro-batches of one global batch (gradient sync only on the last under
DDP), the mean loss across ranks, gradient clipping, the optimizer step (whose post-step hook applies the weight
constraint of nGPT and anGPT), the learning-rate schedule, and zeroing the gradients.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from angpt.errors import ConfigError
from angpt.train import hardware
from angpt.train.dist import DistInfo, all_reduce_mean, no_grad_sync

Batch = tuple[torch.Tensor, torch.Tensor]


def resolve_dtype(requested: str, device: torch.device) -> str:
    """ "auto" -> "bf16" where it pays: CUDA devices with bf16, and CPUs whose bf16 matmuls are measured at
    >= 1.5x fp32's (hardware.cpu_prefers_bf16: AMX, AVX512-BF16 on EPYC; not a Xeon with AMX hidden)."""
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if hardware.cpu_prefers_bf16() else "fp32"


def autocast(device: torch.device, dtype: str):
    """bf16 autocast for compute ("bf16"), or nothing ("fp32"); parameters stay fp32 either way."""
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if dtype == "fp32":
        return contextlib.nullcontext()
    raise ValueError(f"unknown dtype {dtype!r}; use fp32 or bf16")


def resolve_compile(requested: bool | str, device: torch.device) -> bool:
    """`train.compile` as a run uses it: "auto" compiles on CUDA where triton is installed (the step there takes
    half the eager time: 46.6 against 92.2 ms for GPT+ at gpt2-small on an H200, benchmarks/RESULTS.md) and not on
    CPUs (10-45 s of compiling for a small gain there)."""
    if requested == "auto":
        if device.type != "cuda" or importlib.util.find_spec("triton") is None:
            return False
        return torch.cuda.get_device_capability(device) >= (7, 0)  # triton's oldest GPUs (Volta)
    return bool(requested)


def check_compute(dtype: str, device: torch.device, compile: bool) -> list[str]:
    """Refuse what cannot run here (one-line ConfigError); return warnings for what runs but badly."""
    warnings = []
    if dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"train.dtype=bf16 but {torch.cuda.get_device_name(device)} has no bf16; use fp32")
    if dtype == "bf16" and device.type == "cpu" and not hardware.cpu_prefers_bf16():
        speedup = hardware.cpu_bf16_speedup()
        if speedup == 0.0:
            slow = "a CPU without bf16 instructions (AMX / AVX512-BF16): bf16 matmuls run ~100x slower than fp32"
        else:
            slow = f"this CPU: its bf16 matmuls run at {speedup:.2f}x the speed of fp32 ones (measured)"
        warnings.append(f"train.dtype=bf16 on {slow}; use --train.dtype fp32 (or auto)")
    if compile:
        if device.type == "cuda" and importlib.util.find_spec("triton") is None:
            raise ConfigError("train.compile=true needs triton on CUDA (pip install triton), or --train.compile false")
        if device.type == "cpu" and not any(shutil.which(c) for c in (os.environ.get("CXX"), "g++", "c++") if c):
            raise ConfigError(
                "train.compile=true needs a C++ compiler on CPU (inductor generates C++): install g++, "
                "or pass --train.compile false"
            )
    return warnings


@dataclass
class StepStats:
    loss: float  # mean over the global batch (all ranks)
    grad_norm: float  # before clipping
    data_time: float  # seconds spent fetching batches


def compile_for_training(model: nn.Module, optimizer: torch.optim.Optimizer, *, fresh: bool = False, **kwargs):
    """torch.compile(model, **kwargs) as a training forward, with the weight constraint the optimizer runs after
    each step compiled too (`ConstraintHook.compile`); what `train.compile` does. `fresh`: reset Dynamo first, for
    one run of many in a process (a study, the GPU kit): our models share one forward code object, and the earlier
    runs' graphs would count against Dynamo's recompile limit (past it, a forward runs eagerly without a word) and
    make it compile the next size with dynamic shapes."""
    if fresh:
        torch._dynamo.reset()
    hook = getattr(optimizer, "weight_constraint", None)
    if hook is not None:
        hook.compile()
    return torch.compile(model, **kwargs)


class TrainStep:
    """One optimizer step over `accum` micro-batches.

    `forward` is what computes `(logits, loss)` (the model, or its compiled form); `model` is the module whose
    parameters are clipped. Call it as a whole (`step(next_batch)`), or in parts when something must look at the
    loss or the gradient norm before the weights change: `accumulate(next_batch)`, `clip()`, then `apply()`.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        *,
        device: torch.device,
        dtype: str,
        accum: int = 1,
        grad_clip: float = 1.0,
        forward: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
        dist: DistInfo | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.device, self.dtype, self.accum, self.grad_clip = device, dtype, accum, grad_clip
        self.forward = forward if forward is not None else model  # not `or`: a compiled module has no bool
        self.dist = dist
        self.data_time = 0.0

    def accumulate(self, next_batch: Callable[[], Batch]) -> torch.Tensor:
        """Forward and backward over the micro-batches; returns the mean loss over the global batch (a tensor)."""
        loss_sum = torch.zeros((), device=self.device)
        sync_off = self.dist is not None and self.dist.enabled
        self.data_time = 0.0
        for micro in range(self.accum):
            t0 = time.perf_counter()
            x, y = next_batch()
            self.data_time += time.perf_counter() - t0
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with no_grad_sync(self.model, sync_off and micro < self.accum - 1), autocast(self.device, self.dtype):
                _, loss = self.forward(x, y)
            (loss / self.accum).backward()
            loss_sum += loss.detach().float()
        mean = loss_sum / self.accum
        return all_reduce_mean(mean, self.dist) if self.dist is not None else mean

    def clip(self) -> torch.Tensor:
        """The gradient norm before clipping (the grads are clipped to `grad_clip` when it is > 0)."""
        if self.grad_clip > 0:
            return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))

    def apply(self) -> None:
        """Step (the weight constraint runs in the optimizer's post-step hook), schedule, zero the grads."""
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def update(self) -> torch.Tensor:
        """`clip()` then `apply()`; returns the gradient norm before clipping."""
        grad_norm = self.clip()
        self.apply()
        return grad_norm

    def __call__(self, next_batch: Callable[[], Batch]) -> StepStats:
        loss = self.accumulate(next_batch)
        grad_norm = self.update()
        return StepStats(float(loss), float(grad_norm), self.data_time)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall-clock times measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
