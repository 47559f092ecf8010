"""Training-step and inference timing of several architectures, side by side in one process.

Repetitions are interleaved (arch A, B, C, A, B, C, ...) so that drift in the machine's speed hits every arm
alike; each figure is a median, and ratios are taken against the first architecture (GPT+ by default). An arm is
written as for `angpt compare` (``gpt+``, ``gpt+[laurel=lr]``, ``lr=gpt+[laurel=lr,laurel_rank=64]``: model keys
only), or is a peer implementation: "qwen3" is transformers' Qwen3ForCausalLM at GPT+'s shape (the same model,
written by others), trained by the same step. Each step's model FLOP/s is reported
as a fraction of a matmul peak measured in the same run, at the same dtype.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from angpt.errors import UserError
from angpt.models import apply_constraints, build_model, fold_for_inference, make_config, registry
from angpt.models.layers import cross_entropy
from angpt.train.config import load_run_config
from angpt.train.dist import DistInfo
from angpt.train.hardware import keep_freed_memory, matmul_peak
from angpt.train.setup import ResolvedRun, build, resolve
from angpt.train.step import autocast, synchronize


@dataclass
class StepTiming:
    arch: str
    params: int
    train_ms: float
    infer_ms: float
    train_ratio: float = 1.0
    infer_ratio: float = 1.0
    train_flops: float = 0.0  # model FLOP/s of the training step
    peak_fraction: float = 0.0  # train_flops / the matmul peak measured in the same run
    profile: str | None = None  # torch.profiler's table of the step's costliest kernels (profile_steps > 0)
    constraint_ms: float | None = None  # the weight constraint after each step, as the step runs it (None: none)
    constraint_eager_ms: float | None = None  # the same, eager: a compiled run's constraint beside its eager form


class Qwen3Peer(nn.Module):
    """transformers' Qwen3ForCausalLM at GPT+'s config, answering (logits, loss) like our models."""

    def __init__(self, preset: str) -> None:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        from angpt.hf.qwen3 import qwen3_config_dict

        super().__init__()
        self.config = make_config(registry.BASELINE, preset)
        hf_config = Qwen3Config(**qwen3_config_dict(self.config))
        hf_config._attn_implementation = "sdpa"
        self.hf = Qwen3ForCausalLM(hf_config)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        logits = self.hf(input_ids=x).logits
        return logits, (cross_entropy(logits, y) if y is not None else None)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> float:
        with torch.device("meta"):
            return build_model(registry.BASELINE, self.config).flops_per_token(seq_len)


PEERS = {"qwen3": Qwen3Peer}


def bench_run(
    arm: str,
    preset: str,
    batch_size: int,
    seq_len: int | None,
    dtype: str,
    compile: bool,
    seed: int,
    fused_loss: bool,
    device: torch.device,
) -> tuple[str, nn.Module | None, ResolvedRun]:
    """(label, peer model or None, the resolved run) of a bench arm: NAME[key=value,...] as `angpt compare` writes
    arms, or a peer (its model, and GPT+'s run at its shape: GPT+'s optimizer recipe). One batch of `batch_size`
    sequences a step, at a rate that keeps the weights trainable for every repetition."""
    from angpt.study.arms import parse_arm

    if arm in PEERS:
        label, arch, model_keys, peer = arm, registry.BASELINE, {}, PEERS[arm](preset)
    else:
        parsed = parse_arm(arm)
        if parsed.train:
            raise UserError(f"bench arm {arm!r}: train settings do not change a step's cost; give model keys only")
        label, arch, model_keys, peer = parsed.label, parsed.arch, parsed.model, None
    T = seq_len or make_config(arch, preset, **model_keys).context_length
    overrides = {
        "arch": arch, "preset": preset, **{f"model.{k}": v for k, v in model_keys.items()},
        "train.seq_len": T, "train.micro_batch": batch_size, "train.batch_tokens": batch_size * T,
        "train.lr": 1e-4, "train.max_steps": 10_000, "train.dtype": dtype, "train.compile": compile,
        "train.seed": seed, "train.fused_loss": fused_loss,
    }  # fmt: skip
    return label, peer, resolve(load_run_config(None, overrides), device=device)


@contextlib.contextmanager
def _dynamo_room(compile: bool, arms: int):
    """Our arms share one forward code object, which Dynamo compiles once per model and shape up to its recompile
    limit (8): the arms' training and inference models with an earlier shape of the same process pass it (the
    2026-11-27 loan's 0.5B shape did, and nGPT's forward then ran eagerly). Compiled arms start afresh, with room."""
    if not compile:
        yield
        return
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(recompile_limit=max(8, 4 * arms)):
            yield
    finally:
        torch._dynamo.reset()  # this shape's graphs: none of them is called again


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
    fused_loss: bool = True,
    profile_steps: int = 0,
    profile_rows: int = 15,
) -> list[StepTiming]:
    """Median ms per training step (forward, backward, optimizer step, constraint) and per folded inference
    forward, for each architecture; ratios against `archs[0]`. `fused_loss`: our models compute the training
    loss chunk by chunk without the logits, as training does by default (a peer computes it on its logits).
    `profile_steps` > 0: after the timings, that many training steps of each arm run under torch.profiler, and
    each arm's row carries the table of its `profile_rows` costliest kernels (self time on the device)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cpu":
        keep_freed_memory()  # as training does
    with _dynamo_room(compile, len(archs)):
        runs = []
        for name in archs:
            # the step `angpt train` builds (train/setup.py); a peer is built as GPT+'s run with its own model
            torch.manual_seed(seed)
            arch, peer, run = bench_run(name, preset, batch_size, seq_len, dtype, compile, seed, fused_loss, dev)
            if peer is not None:
                peer = peer.to(dev)
            # dynamic=False: several models share forward code objects, and Dynamo would otherwise take the second
            # model's call for a shape change and recompile the first with dynamic-shape kernels (3x slower on CPU).
            built = build(
                run, DistInfo(device=dev), model=peer, reinit=False, fresh_compile=False,
                compile_options={"dynamic": False},
            )  # fmt: skip
            model, step, T = built.base, built.step, run.train.seq_len
            infer = fold_for_inference(model).to(dev)
            infer_fn = torch.compile(infer, dynamic=False) if compile else infer
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
        peak = matmul_peak(dtype, dev)
        times = {run[0]: ([], []) for run in runs}
        for kind, step in ((0, train_step), (1, infer_step)):
            for rep in range(warmup + reps):
                for run in runs:
                    synchronize(dev)
                    t0 = time.perf_counter()
                    step(run)
                    synchronize(dev)
                    if rep >= warmup:
                        times[run[0]][kind].append(time.perf_counter() - t0)
        peak = max(peak, matmul_peak(dtype, dev))  # the best of two measurements, before and after the timings
        tables = {
            run[0]: profile_table(lambda run=run: train_step(run), profile_steps, dev, profile_rows) for run in runs
        }
        constraint = {run[0]: constraint_times(run[2].optimizer, dev) for run in runs}
        out = []
        for a, m, _, _, x in runs:
            t = StepTiming(
                a, m.num_params(), 1e3 * statistics.median(times[a][0]), 1e3 * statistics.median(times[a][1])
            )
            t.profile = tables[a]
            T = x.shape[1] - 1
            t.train_flops = m.flops_per_token(T) * batch_size * T / (t.train_ms / 1e3)
            t.peak_fraction = t.train_flops / peak
            t.constraint_ms, t.constraint_eager_ms = constraint[a]
            out.append(t)
    for t in out:
        t.train_ratio = t.train_ms / out[0].train_ms
        t.infer_ratio = t.infer_ms / out[0].infer_ms
    return out


def constraint_times(optimizer, dev: torch.device, reps: int = 5) -> tuple[float | None, float | None]:
    """Median ms of the optimizer's weight-constraint hook as the step runs it, and of its eager form (the same
    figure for an eager run); (None, None) without a constraint (GPT+, the Qwen3 peer). Measured after the
    timings: the projection changes nothing more by then, and costs the same."""
    hook = getattr(optimizer, "weight_constraint", None)
    if hook is None:
        return None, None

    def ms(fn) -> float:
        times = []
        for _ in range(reps + 1):
            synchronize(dev)
            t0 = time.perf_counter()
            fn()
            synchronize(dev)
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times[1:])

    eager = ms(lambda: apply_constraints(hook.groups))
    return (ms(hook) if hook.compiled is not None else eager), eager


def profile_table(step, steps: int, dev: torch.device, rows: int = 15) -> str | None:
    """torch.profiler's table of the `rows` costliest operations over `steps` calls of `step` (self time on the
    device: CUDA on a GPU, else the CPU), or None for `steps` 0."""
    if steps <= 0:
        return None
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(dev)
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def format_table(rows: list[StepTiming]) -> str:
    lines = [
        "| arch | params | train ms/step | train ratio | train GFLOP/s | of matmul peak | infer ms | infer ratio | "
        "constraint ms (eager) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = "-" if r.constraint_ms is None else f"{r.constraint_ms:.2f} ({r.constraint_eager_ms:.2f})"
        lines.append(
            f"| {r.arch} | {r.params / 1e6:.2f}M | {r.train_ms:.1f} | {r.train_ratio:.3f} | "
            f"{r.train_flops / 1e9:.1f} | {100 * r.peak_fraction:.0f}% | {r.infer_ms:.1f} | {r.infer_ratio:.3f} | {c} |"
        )
    return "\n".join(lines)
