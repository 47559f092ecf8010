"""The first steps of one arm at one learning rate, instrumented step by step.

What the GPU kit's LR sweep at the paper's batch (benchmarks/gpu) and the stability checks of anGPT at
`gpt2-small` (docs/open_choices.md) measure: after every optimizer step the training loss, the gradient norm
before clipping, and every layer's residual-stream norm on a fixed held-out batch. A run that diverges stops at
once, so a sweep spends its time on the rates that train. The step is the trainer's (`TrainStep`, with the
architecture's recipe: optimizer, schedule, warm-up, clipping and weight constraint), under the same autocast.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from angpt.models import inspect_norms, make_config
from angpt.train.config import load_run_config
from angpt.train.dist import DistInfo
from angpt.train.setup import ResolvedRun, build, resolve
from angpt.train.step import Batch, autocast, synchronize

# The issue-22 stability criteria: after step 5 the training loss never exceeds 1.3x its running minimum, and no
# pre-clip gradient norm exceeds 100x the run's median.
SPIKE_AFTER, LOSS_FACTOR, GRAD_FACTOR = 5, 1.3, 100.0


@dataclass
class FirstSteps:
    """One run: its settings, a record per optimizer step, and how it ended."""

    arm: str
    lr: float
    steps: int  # planned
    batch_tokens: int
    status: str = "running"  # finished | diverged | out of time
    records: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    params: int = 0

    @property
    def step_time(self) -> float | None:
        """Median seconds per optimizer step (the first, which warms up kernels and allocators, left out)."""
        times = [r["step_time"] for r in self.records[1:]] or [r["step_time"] for r in self.records]
        return statistics.median(times) if times else None

    def final_loss(self, last: int = 10) -> float | None:
        """Mean training loss of the last `last` steps (each step's tokens are new to the model), or None."""
        losses = [r["loss"] for r in self.records[-last:]]
        return sum(losses) / len(losses) if losses and all(map(math.isfinite, losses)) else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(step_time=self.step_time, final_loss=self.final_loss(), stability=stability(self.records))
        return out


def stability(
    records: list[dict[str, Any]],
    *,
    after: int = SPIKE_AFTER,
    loss_factor: float = LOSS_FACTOR,
    grad_factor: float = GRAD_FACTOR,
    smooth: int = 1,
) -> dict[str, Any]:
    """Whether a run trained without a spike: after step `after` the loss never exceeds `loss_factor` times its
    running minimum, and no pre-clip gradient norm exceeds `grad_factor` times the run's median. A non-finite
    loss is a spike. Returns {"stable", "loss_ratio" (the worst), "grad_ratio" (the worst), "first_spike"}.

    `smooth` > 1 reads the loss as its mean over the last `smooth` steps: at batches of a few thousand tokens one
    batch's content moves its loss by 20-40% (every arm alike, at the same step), which is not the model's doing.
    """
    if smooth > 1:
        raw = [r["loss"] for r in records]
        windows = [raw[max(0, i + 1 - smooth) : i + 1] for i in range(len(raw))]
        records = [{**r, "loss": sum(w) / len(w)} for r, w in zip(records, windows)]
    grads = [r["grad_norm"] for r in records if math.isfinite(r["grad_norm"])]
    median = statistics.median(grads) if grads else math.nan
    worst_loss, worst_grad, first = 0.0, 0.0, None
    running = math.inf  # the lowest finite loss so far
    for r in records:
        loss, grad = r["loss"], r["grad_norm"]
        loss_ratio = math.inf if not math.isfinite(loss) else (loss / running if running < math.inf else 1.0)
        grad_ratio = grad / median if math.isfinite(grad) and median > 0 else math.inf
        spiked = grad_ratio > grad_factor
        if r["step"] > after:
            worst_loss = max(worst_loss, loss_ratio)
            spiked = spiked or loss_ratio > loss_factor
        worst_grad = max(worst_grad, grad_ratio)
        if spiked and first is None:
            first = r["step"]
        if math.isfinite(loss):
            running = min(running, loss)
    stable = bool(records) and first is None
    return {"stable": stable, "loss_ratio": worst_loss, "grad_ratio": worst_grad, "first_spike": first}


def zipf_batches(vocab: int, batch: int, seq_len: int, *, exponent: float = 1.0, seed: int = 0):
    """Micro-batches of i.i.d. tokens with p(k) proportional to 1 / (k + 1)^exponent: a unigram distribution to
    learn and no context. The cheapest trigger of anGPT's early blow-up (docs/open_choices.md); uniform tokens,
    which teach nothing, do not trigger it."""
    p = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** exponent
    p /= p.sum()
    rng = np.random.default_rng(seed)

    def next_batch() -> Batch:
        ids = torch.from_numpy(rng.choice(vocab, size=(batch, seq_len + 1), p=p).astype(np.int64))
        return ids[:, :-1], ids[:, 1:]

    return next_batch


def _clean(x: float) -> float:
    """A float for JSON: 5 significant digits; inf and nan as they are (json writes Infinity/NaN)."""
    return float(f"{x:.5g}") if math.isfinite(x) else x


def _graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process so far (its own counter, which a reset does not clear)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _side(side_batches: Callable[[int], list[torch.Tensor]] | None, arm: str, dev: torch.device):
    """The hook's batches on `dev`, or an error naming what is missing when the caller gave none."""

    def batches(n: int) -> list[torch.Tensor]:
        if side_batches is None:
            raise ValueError(f"arm {arm!r} measures on training batches before a step: pass side_batches")
        return [x.to(dev) for x in side_batches(n)]

    return batches


def _resolved(arm, preset, lr, max_steps, batch_tokens, accum, dtype, seed, compile, device, model) -> ResolvedRun:
    """`arm`'s run as `angpt train` resolves it, at rate `lr` over a `max_steps` schedule, `accum` micro-batches a
    step. The caller feeds the batches: the geometry stands at the model's context (the step reads its batches as
    they come), with the micro-batch that makes `batch_tokens`."""
    from angpt.study.arms import parse_arm

    parsed = parse_arm(arm)
    T = make_config(parsed.arch, preset, **{**model, **parsed.model}).context_length
    micro = max(1, batch_tokens // (accum * T))
    overrides = {
        "arch": parsed.arch, "preset": preset, **{f"model.{k}": v for k, v in {**model, **parsed.model}.items()},
        **{f"train.{k}": v for k, v in parsed.train.items()}, "train.lr": lr, "train.max_steps": max_steps,
        "train.seq_len": T, "train.micro_batch": micro, "train.batch_tokens": micro * accum * T,
        "train.dtype": dtype, "train.seed": seed, "train.compile": compile,
    }  # fmt: skip
    return resolve(load_run_config(None, overrides), device=device)


def first_steps(
    arm: str,
    preset: str,
    lr: float,
    steps: int,
    next_batch: Callable[[], Batch],
    probe: torch.Tensor,
    *,
    batch_tokens: int,
    accum: int = 1,
    device: str | torch.device = "cpu",
    dtype: str = "fp32",
    seed: int = 0,
    stop_factor: float = 3.0,
    deadline: float | None = None,
    max_steps: int | None = None,
    on_step: Callable[[FirstSteps], None] | None = None,
    side_batches: Callable[[int], list[torch.Tensor]] | None = None,
    compile: bool = False,
    **model: Any,
) -> FirstSteps:
    """Train `arm` (as `angpt compare` writes arms: ``angpt``, ``angpt[s_z_init=16]``, with train keys such as
    ``gpt+[warmup_steps=0]``) at `preset` plus `model` overrides, for `steps` optimizer steps of `accum`
    micro-batches from `next_batch`, at peak rate `lr` on the recipe's schedule over `max_steps` (default `steps`).

    After each step the run records loss, pre-clip gradient norm, LR, step time, the per-layer residual norms
    ``||h||`` on `probe` (token ids [B, T], in eval mode) and the largest |logit| there. It stops as
    "diverged" at a non-finite loss or gradient norm, or a loss above `stop_factor` times the first step's, and as
    "out of time" past `deadline` (time.time()). `on_step` is called after every step (to write results as they
    come).

    `compile`: the forward runs through torch.compile, as `train.compile` does (the first step's time includes the
    compiling; the step time reported is the median). Each record then carries `graphs`, how many graphs Dynamo
    compiled during that step: more than none after the first is a recompile, a step timed with its compiling.

    The architecture's hook runs before every step as in the trainer (``nu_att: calibrated`` measures there, on
    `side_batches(n)`: n training token-id batches apart from `next_batch`'s stream); its note goes in the record.
    """
    dev = torch.device(device)
    resolved = _resolved(arm, preset, lr, max_steps or steps, batch_tokens, accum, dtype, seed, compile, dev, model)
    built = build(resolved, DistInfo(device=dev))
    net, sched, step_fn = built.base, built.scheduler, built.step
    run = FirstSteps(arm=arm, lr=lr, steps=steps, batch_tokens=batch_tokens, params=net.num_params())
    probe = probe.to(dev)
    before_step, side = resolved.spec.before_step, _side(side_batches, arm, dev)
    start = time.time()
    first_loss = None
    graphs = _graphs_compiled()
    for step in range(1, steps + 1):
        note = before_step(net, step - 1, max_steps or steps, side) if before_step else None
        synchronize(dev)
        t0 = time.perf_counter()
        loss = float(step_fn.accumulate(next_batch))
        grad = float(step_fn.clip()) if math.isfinite(loss) else math.nan
        healthy = math.isfinite(loss) and math.isfinite(grad)
        if healthy:
            step_fn.apply()
        synchronize(dev)
        dt = time.perf_counter() - t0
        record: dict[str, Any] = {"step": step, "loss": _clean(loss), "grad_norm": _clean(grad)}
        record.update(lr=_clean(sched.get_last_lr()[0]), step_time=_clean(dt), **({"note": note} if note else {}))
        if compile:
            now = _graphs_compiled()
            record["graphs"], graphs = now - graphs, now
        if healthy:
            with torch.no_grad(), autocast(dev, dtype):
                norms = inspect_norms(net.eval(), probe)
            net.train()
            record["residual_norms"] = [_clean(float(norms[f"layer{i}.h"])) for i in range(len(net.blocks))]
            record["max_logit"] = _clean(float(norms["head.max_logit"]))  # where a blow-up is, with the norms
        run.records.append(record)
        first_loss = first_loss if first_loss is not None else loss
        if not healthy or loss > stop_factor * first_loss:
            run.status = "diverged"
        elif deadline is not None and time.time() > deadline and step < steps:
            run.status = "out of time"
        run.seconds = time.time() - start
        if on_step is not None:
            on_step(run)
        if run.status != "running":
            break
    if run.status == "running":
        run.status = "finished"
    if on_step is not None:
        on_step(run)
    return run
