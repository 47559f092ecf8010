"""`angpt train --dry-run`: what a run would cost, without a GPU, a dataset or any memory.

`plan_run(cfg, gpus, gpu, mfu)` builds the model on the meta device (shapes only, so a 1B model is instant),
then reports its parameters, training FLOPs per token, the batch geometry, an estimate of the memory per GPU with
and without activation checkpointing, and the time per step and per run. By default it plans for the machine it
runs on (its GPUs, else this CPU, :func:`this_machine`): on a GPU at an assumed MFU of 0.4, on a CPU at the MFU
measured on one block of the model itself (:func:`measured_cpu_mfu`; laptops reach a few percent, not 40%). The
estimates and their sources are documented in docs/recipes.md#what-a-dry-run-estimates.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from angpt import units
from angpt.errors import ConfigError
from angpt.models import ModelConfig, registry
from angpt.models.base import LanguageModel
from angpt.train.config import RunConfig
from angpt.train.dist import DistInfo
from angpt.train.hardware import (
    ACCELERATORS,
    Accelerator,
    accelerator,
    cpu_memory,
    measured_cpu_peak,
    process_resident,
)
from angpt.train.setup import ResolvedRun, build, model_config, resolve
from angpt.train.step import resolve_dtype

GPU_CHOICES = (*ACCELERATORS, "cpu")


@dataclass
class Memory:
    """Estimated bytes per GPU at the peak of a training step (the start of the backward)."""

    states: float  # fp32 parameters, gradients and Adam's m and v: 16 bytes per parameter, sharded under FSDP
    working: float  # what is not sharded: bf16 weight copies, DDP's buckets or FSDP's all-gathered groups
    activations: float  # saved for the backward, without recomputation
    activations_ckpt: float  # with full per-block activation checkpointing
    # The process itself (Python, torch, the tokenizer) where the run trains on the CPU: the dry run's own resident
    # memory, which a training process holds too (gpt2-small on the CPU peaked 0.23-0.3 GB above the rest; issue 48)
    runtime: float = 0.0

    @property
    def total(self) -> float:
        return self.states + self.working + self.activations + self.runtime

    @property
    def total_ckpt(self) -> float:
        return self.states + self.working + self.activations_ckpt + self.runtime


@dataclass
class DryRunReport:
    arch: str
    preset: str
    model: ModelConfig
    vocab_from: str  # where the vocabulary size came from
    params: int
    params_non_embedding: int
    flops_per_token: float  # training, 6 N + 12 L T d
    flops_attention: float  # the 12 L T d part
    seq_len: int
    micro_batch: int
    gpus: int
    accum: int
    batch_tokens: int
    steps: int
    dist: str  # "ddp" | "fsdp" | "single" (one process: no wrapper)
    dtype: str  # "bf16" | "fp32"
    memory: Memory
    gpu: Accelerator  # for "cpu": this machine, with the measured matmul peak and its RAM
    mfu: float
    mfu_source: str  # "assumed" or how it was measured
    step_time: float  # seconds
    warning: str | None  # set when the estimate does not fit the GPU: what to change
    checkpointing: bool = False  # the run recomputes each block in backward (train.activation_checkpointing)
    fused_loss: bool = True  # the loss without the full logits (train.fused_loss)
    optimizer: str = ""  # the optimizer, peak rate (and where it comes from), warm-up and schedule
    data_note: str | None = None  # the trainer's warning that the run reads its data many times (summary.epochs_note)

    @property
    def needed(self) -> float:
        """The estimate that applies to this run: with checkpointing when the run turns it on."""
        return self.memory.total_ckpt if self.checkpointing else self.memory.total

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_tokens

    @property
    def run_time(self) -> float:
        return self.steps * self.step_time


ASSUMED_GPU_MFU = 0.4


def this_machine() -> tuple[int, str]:
    """What a bare --dry-run plans for: the GPUs of this machine (their count, and their kind by name), else its CPU
    as one process."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        kind = next((k for k in sorted(ACCELERATORS, key=len, reverse=True) if k.lower() in name.lower()), None)
        if kind is None:
            choices = " | ".join(GPU_CHOICES)
            raise ConfigError(f"this machine's GPU ({name}) is not in the table; pass --dry-run-gpu {choices}")
        return torch.cuda.device_count(), kind
    return 1, "cpu"


def plan_run(
    cfg: RunConfig, gpus: int | None = None, gpu: str | None = "H100", mfu: float | None = None
) -> DryRunReport:
    """Plan `cfg` on `gpus` accelerators of kind `gpu` (A100 | H100 | H200 | B200 | cpu) at model FLOPs
    utilisation `mfu`. `gpu` None is this machine (:func:`this_machine`), `gpus` None its count (8 for a named GPU,
    one process for the CPU); `mfu` None is 0.4 on a GPU, assumed, and on the CPU the one measured on a block of
    this model. Nothing is allocated, no data is read; ConfigError on bad input (exit 2 in the CLI)."""
    resident = process_resident()  # before the probe builds anything: what any process of ours holds
    gpus, device = _target(gpus, gpu, mfu)
    mfu_source = "given"
    tc = cfg.train
    requested_dtype = tc.dtype  # what the run asks of a GPU (its `auto` resolves there, not here)
    meta = identity = None
    if cfg.data is not None and (Path(cfg.data) / "meta.json").is_file():
        from angpt.data import data_identity, load_meta

        meta = load_meta(cfg.data)
        identity = data_identity(cfg.data, meta=meta)
    try:  # the trainer's own decision (a resume's or init_from's checkpoint settles the model, dtype and recipe),
        # reading the run folder without touching it
        run = resolve(cfg, device=torch.device("cpu"), world_size=gpus, meta=meta, data_identity=identity)
    except ConfigError as e:
        T = tc.seq_len or model_config(cfg, meta)[0].context_length
        fits = [n for n in range(gpus, 0, -1) if (tc.batch_tokens // T) % (tc.micro_batch * n) == 0]
        hint = f", or plan for --dry-run-gpus {fits[0]}" if fits and not tc.batch_tokens % T else ""
        raise ConfigError(f"{e} (for --dry-run-gpus {gpus}){hint}" if "batch_tokens" in str(e) else str(e)) from None
    t, T, accum, mcfg = run.train, run.train.seq_len, run.accum, run.model  # the run, from here on

    run.spec.describe(mcfg)  # computes (and caches) any Monte Carlo constants on the CPU: meta tensors hold no values
    with torch.device("meta"):
        model = run.spec.model(mcfg)

    if device is None:
        dtype = resolve_dtype(requested_dtype, torch.device("cpu"))
        measured = {d: measured_cpu_peak(d) for d in ("fp32", dtype)}  # fp32 always; bf16 when the run uses it
        source = f"measured {dtype} matmul peak" + (
            f"; fp32: {measured['fp32'] / 1e9:.3g} GFLOP/s" if dtype != "fp32" else ""
        )
        device = Accelerator("cpu", measured[dtype], cpu_memory(), source)
        if mfu is None:
            mfu, mfu_source = measured_cpu_mfu(run, dtype, device.peak_flops), MEASURED
    else:
        dtype = "fp32" if requested_dtype == "fp32" else "bf16"
    if mfu is None:
        mfu, mfu_source = ASSUMED_GPU_MFU, "assumed"
    dist = run.dist if gpus > 1 else "single"
    memory = estimate_memory(model, T, t.micro_batch, gpus, dist, dtype, t.fused_loss)
    if device.name == "cpu":
        memory.runtime = resident
    flops = model.flops_per_token(T)
    report = DryRunReport(
        arch=run.arch,
        preset=run.preset,
        model=mcfg,
        vocab_from=run.model_from,
        params=model.num_params(),
        params_non_embedding=model.num_params(embeddings=False),
        flops_per_token=flops,
        flops_attention=12.0 * mcfg.n_layers * T * mcfg.d_model,
        seq_len=T,
        micro_batch=t.micro_batch,
        gpus=gpus,
        accum=accum,
        batch_tokens=t.batch_tokens,
        steps=t.max_steps,
        dist=dist,
        dtype=dtype,
        memory=memory,
        gpu=device,
        mfu=mfu,
        mfu_source=mfu_source,
        step_time=flops * t.batch_tokens / (gpus * device.peak_flops * mfu),
        warning=None,
        checkpointing=t.activation_checkpointing,
        fused_loss=t.fused_loss,
        optimizer=_optimizer_summary(run),
        data_note=_epochs_note(run),
    )
    report.warning = _fit_advice(report, model)
    return report


def _target(gpus: int | None, gpu: str | None, mfu: float | None) -> tuple[int, Accelerator | None]:
    """The number of accelerators planned for and their kind (None: this machine's CPU, measured later), as
    :func:`plan_run` takes them; a one-line ConfigError for a count, a kind or an MFU that cannot be."""
    if gpu is None:
        here, gpu = this_machine()
        gpus = here if gpus is None else gpus
    if gpus is None:
        gpus = 1 if gpu.lower() == "cpu" else 8
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"--dry-run-gpus {gpus!r} must be a positive integer (the number of GPUs)")
    if mfu is not None and not 0 < mfu <= 1:
        raise ConfigError(f"--dry-run-mfu {mfu!r} must be in (0, 1], e.g. 0.4")
    try:
        return gpus, accelerator(gpu) if gpu.lower() != "cpu" else None
    except KeyError:
        raise ConfigError(f"--dry-run-gpu {gpu!r} is not known; use one of: {', '.join(GPU_CHOICES)}") from None


def _epochs_note(run: ResolvedRun) -> str | None:
    """The trainer's warning of many passes over the data, from meta.json's shards (whole windows of the run's
    seq_len + 1 tokens, as the loader reads them), where the run names a prepared dataset."""
    from angpt.train.summary import epochs_note

    if run.meta is None:
        return None
    shards = run.meta.get("splits", {}).get("train", {}).get("shards", [])
    seq_len = run.train.seq_len
    per_epoch = sum(max(0, (s["tokens"] - 1) // seq_len) * seq_len for s in shards)
    return epochs_note(run.train, per_epoch) if per_epoch else None


MEASURED = "measured on one block of this model on this CPU"
# The block's probe takes as many of the run's sequences (of up to 256 tokens) as make a step of about this many
# FLOPs (~0.3 s on a laptop core pair): small matmuls run far below the peak, so a probe of 4 x 128 tokens read MFU
# 0.31 where the demo run's 16 x 256 reached ~0.5, and the dry run said 10 min for a 5-min run (issue 48;
# benchmarks/RESULTS.md, "A training step on a busy CPU").
PROBE_FLOPS = 2e10


def measured_cpu_mfu(run: ResolvedRun, dtype: str, peak: float, reps: int = 3, budget_s: float = 0.5) -> float:
    """The MFU this CPU reaches on the run's own shapes: the run's training step (train/setup.py's, its optimizer
    and weight constraint included) on one layer of the model (its width, heads and MLP; a 64-token vocabulary, so
    the embedding and head cost nothing), over as many of the run's sequences of up to 256 tokens as make a step of
    ``PROBE_FLOPS`` (at least one, at most its micro-batch), the median step after a warm-up (at least `reps`, and
    more until `budget_s` has passed, at most 50), against the measured matmul `peak`. The median, not the best: on
    a busy machine the run's steps take what the machine gives now, and the best of fifty catches the moments it
    was quiet (a dry run read 4 min, then 2.2 h, for the same run beside other work; issue 48). A block, not the
    whole model, so that planning a 1B run takes a second; the head's large matmul runs nearer the peak
    (docs/recipes.md#what-a-dry-run-estimates)."""
    one = ModelConfig.from_dict({**run.model.to_dict(), "n_layers": 1, "vocab_size": 64})
    t = min(run.train.seq_len, one.context_length, 256)
    per_token = 6 * (4 * one.d_model**2 + 3 * one.d_model * one.ffn_dim)  # the block's matrices, forward + backward
    b = max(1, min(run.train.micro_batch, int(PROBE_FLOPS / (per_token * t))))
    train = dataclasses.replace(run.train, seq_len=t, micro_batch=b, batch_tokens=b * t, dtype=dtype, compile=False,
                                activation_checkpointing=False)  # fmt: skip
    probe = dataclasses.replace(run, model=one, train=train, accum=1, world_size=1, data=None)
    built = build(probe, DistInfo())
    x = torch.randint(0, 64, (b, t + 1), generator=torch.Generator().manual_seed(0))
    times: list[float] = []
    start_t, passes = time.perf_counter(), 0
    while passes <= reps or (time.perf_counter() - start_t < budget_s and passes < 50):
        t0 = time.perf_counter()
        built.step(lambda: (x[:, :-1], x[:, 1:]))
        if passes:  # the first step is the warm-up
            times.append(time.perf_counter() - t0)
        passes += 1
    return min(1.0, built.flops_per_token * t * b / statistics.median(times) / peak)


def _optimizer_summary(run: ResolvedRun) -> str:
    """E.g. `adam, peak lr 0.002 (the angpt recipe's at gpt2-small; train.lr unset), no warm-up, cosine to 0.1x`."""
    decay = f"{run.train.schedule} to {run.train.min_lr_ratio:g}x"
    optimizer = f"adamw (weight decay {run.train.weight_decay:g})" if run.optimizer == "adamw" else run.optimizer
    return f"{optimizer}, peak lr {run.train.lr:g}{run.lr_from}, " + (
        f"{run.train.warmup_steps:,} warm-up steps, {decay}" if run.train.warmup_steps else f"no warm-up, {decay}"
    )


# ------------------------------------------------------------------------------------------------- memory
def activation_bytes(
    cfg: ModelConfig, seq_len: int, micro_batch: int, dtype: str = "bf16", fused_loss: bool = False
) -> tuple[float, float]:
    """Bytes of activations kept for the backward, (without, with) full per-block activation checkpointing.

    The method is Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
    arXiv 2205.05198, section 4.1): count every tensor a layer saves, per token, in units of the width h. Their GPT
    block (bf16, GeLU MLP of width 4h, dropout, unfused attention) keeps sbh(34 + 5as/h) bytes per layer and, with
    full per-layer checkpointing, 2sbh (its input). Adapted to our blocks, with e bytes per compute element (2 for
    bf16 autocast) and the SwiGLU branch width f, per token and layer:

      two pre-norms on the fp32 residual stream    2 (8 + e) h   fp32 input, fp32 normalised output (the gain's
                                                                 gradient), the e-byte copy feeding the matmul
      QK-norm                                        (8 + 2e) h   fp32 q, k and their normalised e-byte copies
      attention, fused kernel (SDPA / Flash)         7e h         q, k, v; q, k after RoPE; the output and its
                                                                 head-merged copy (no T x T matrix is kept, so
                                                                 their 5as/h term is gone; no dropout masks)
      SwiGLU MLP                                     4e f         [u; z] (2f), silu(z) (f), u * silu(z) (f)

    46h + 8f bytes at bf16 (78h for f = 4h), against their 34h. Outside the blocks: the final norm (8 + e) h and
    the logits (e) with the fp32 log-softmax kept for the backward (4) and the fp32 gradient of the logits (4),
    (e + 8) V bytes per token. With the fused loss (train.fused_loss, models/loss.py) the logits are never kept:
    the head's input gradient, computed in the forward, is kept instead (4h per token: the fp32 stream's), plus its
    weight gradient (4 V h, once) and one chunk's fp32 logits. With checkpointing each block keeps only its input,
    which is the fp32 residual stream here (4h, against their 2h), and one block's activations live again while it
    is recomputed.

    An estimate: under CPU bf16 autocast, saved-tensor hooks count the formula's 78h per layer for GPT+ (plus the
    RoPE tables, which do not grow with the batch), 16% less for GPT (no QK-norm), ~20% more for nGPT and ~10%
    less for anGPT (docs/recipes.md); tests/test_dryrun.py keeps every architecture within 30% of the formula.
    An architecture with another block (TokenFormer) gives its own per-token count in its registry entry
    (`saved_per_token`).
    """
    e = 2 if dtype == "bf16" else 4
    h, f, V, L = cfg.d_model, cfg.ffn_dim, cfg.vocab_size, cfg.n_layers
    tokens = seq_len * micro_batch
    own = registry.get(cfg.arch).saved_per_token  # an architecture whose block is not this one counts its own
    per_token = own(cfg, e) if own is not None else 2 * (8 + e) * h + (8 + 2 * e) * h + 7 * e * h + 4 * e * f
    layer = tokens * per_token
    if fused_loss:
        from angpt.models.loss import CHUNK_BYTES

        outside = tokens * ((8 + e) * h + 4 * h) + 4 * V * h + CHUNK_BYTES["cuda"]
    else:
        outside = tokens * ((8 + e) * h + (e + 8) * V)
    return L * layer + outside, L * tokens * 4 * h + layer + outside


def estimate_memory(
    model: LanguageModel, seq_len: int, micro_batch: int, gpus: int, dist: str, dtype: str, fused_loss: bool = True
) -> Memory:
    """Memory per GPU of training `model` (built on any device; only shapes are read); see `activation_bytes`.

    - states: fp32 parameters, gradients and Adam's m and v, 16 bytes per parameter; FSDP2 shards them over the
      GPUs (`fully_shard` per block and at the root, as train/dist.py does).
    - working set, not sharded: under bf16 autocast each matrix's bf16 copy is saved for the backward (2 bytes per
      matrix weight, on every rank, FSDP or not); DDP adds nothing, since train/dist.py wraps it with
      gradient_as_bucket_view (the gradients are views of its all-reduce buckets); FSDP2 keeps the root group
      (embedding, LM head, final norm) unsharded through forward and backward (params and grads, 8 bytes each)
      and has two blocks all-gathered (the current one and the prefetched next, 4 bytes each) plus one block's
      unsharded gradients (4 bytes).
    - not counted: the CUDA context and allocator fragmentation (planning with 1e9-byte GB leaves ~6% for them),
      the optimizer step's temporaries (they come after the activations are freed).
    """
    p_total = model.num_params()
    p_matrices = sum(p.numel() for p in model.matrices())
    blocks = list(getattr(model, "blocks", []))
    p_block = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=0)
    p_root = p_total - sum(sum(p.numel() for p in b.parameters()) for b in blocks)
    states = 16.0 * p_total / (gpus if dist == "fsdp" else 1)
    working = 2.0 * p_matrices if dtype == "bf16" else 0.0
    if dist == "fsdp":
        working += 8.0 * p_root + 12.0 * p_block
    act, act_ckpt = activation_bytes(model.config, seq_len, micro_batch, dtype, fused_loss)
    return Memory(states, working, act, act_ckpt)


def _fit_advice(r: DryRunReport, model: LanguageModel) -> str | None:
    """None when the estimate fits `r.gpu`; else one line naming what to change, each with its estimate."""
    limit = r.gpu.memory
    if not limit or r.needed <= limit:
        return None
    options = []
    for mb in range(r.micro_batch - 1, 0, -1):  # the largest micro-batch that fits and divides the batch
        if (r.batch_tokens // r.seq_len) % (mb * r.gpus) == 0:
            mem = estimate_memory(model, r.seq_len, mb, r.gpus, r.dist, r.dtype, r.fused_loss)
            if (mem.total_ckpt if r.checkpointing else mem.total) <= limit:
                options.append(f"--train.micro_batch {mb} ({_gb(mem.total)})")
                break
    if r.dist == "ddp":
        mem = estimate_memory(model, r.seq_len, r.micro_batch, r.gpus, "fsdp", r.dtype, r.fused_loss)
        options.append(f"--dist fsdp ({_gb(mem.total)} on {r.gpus} GPUs)")
    if not r.checkpointing:
        options.append(f"--train.activation_checkpointing true ({_gb(r.memory.total_ckpt)})")
    if r.dist != "ddp":
        options.append("more GPUs with --dist fsdp (it shards parameters, gradients and Adam states, not activations)")
    return f"estimated {_gb(r.needed)} per GPU exceeds the {r.gpu.name}'s {_gb(limit)}; use {', or '.join(options)}"


# ------------------------------------------------------------------------------------------------- report
def format_report(r: DryRunReport) -> str:
    """The dry run as printed by `angpt train --dry-run`."""
    c, m = r.model, r.memory
    where = {"ddp": f"DDP on {r.gpus} GPUs", "fsdp": f"FSDP2 on {r.gpus} GPUs", "single": "one process"}[r.dist]
    six_n = r.flops_per_token - r.flops_attention
    per_run = units.duration(r.run_time)
    if r.gpu.name != "cpu":
        per_run += f" ({r.run_time * r.gpus / 3600:,.0f} GPU-hours)"
    peak = f"{r.gpu.peak_flops / 1e12:.1f} TFLOP/s bf16 dense"
    if r.gpu.name == "cpu":
        peak = f"{r.gpu.peak_flops / 1e9:.3g} GFLOP/s ({r.gpu.source})"
    lines = [
        f"angpt dry run: {r.arch}, preset {r.preset} (built on the meta device: nothing allocated, no data read)",
        f"  model        L={c.n_layers} d={c.d_model} H={c.n_heads} d_ff={c.ffn_dim} T={r.seq_len} V={c.vocab_size}; "
        f"vocabulary from {r.vocab_from}",
        f"  parameters   {r.params:,} total ({units.count(r.params)}), "
        f"{r.params_non_embedding:,} non-embedding ({units.count(r.params_non_embedding)})",
        f"  FLOPs/token  {r.flops_per_token:.3e} training = 6N {six_n:.3e} + attention 12LTd {r.flops_attention:.3e}"
        " (PaLM App. B, full T x T)",
        f"  batch        {r.batch_tokens:,} tokens/step = {r.gpus} GPU(s) x micro_batch {r.micro_batch} x "
        f"{r.seq_len} tokens x {r.accum} accumulation step(s)",
        f"  run          {r.steps:,} steps = {units.count(r.tokens)} tokens",
        f"  optimizer    {r.optimizer}",
        f"  memory/GPU   estimated for {where}, {r.dtype} compute, fp32 parameters and Adam states:",
        f"                 parameters, gradients, Adam m and v {_gb(m.states):>9}",
        f"                 unsharded working set               {_gb(m.working):>9}",
        f"                 activations at micro_batch {r.micro_batch:<8} {_gb(m.activations):>9}"
        f"   {_gb(m.activations_ckpt)} with activation checkpointing",
        *([f"                 the process (Python, torch; as now)  {_gb(m.runtime):>8}"] if m.runtime else []),
        f"                 total                               {_gb(m.total):>9}"
        f"   {_gb(m.total_ckpt)} with activation checkpointing   ({_capacity(r.gpu)})",
        f"  time         {r.gpu.name} at {peak}, MFU {r.mfu:.2g} ({r.mfu_source}): {r.step_time:.3g} s/step, "
        f"{per_run} per run",
    ]
    return "\n".join(lines)


def _capacity(device: Accelerator) -> str:
    """What the estimate is held against: a GPU's memory ('H100: 80.0 GB'), or this machine's RAM, said as such (a
    bare 'cpu: 25.3 GB' beside the total read as the run's need; issue 48)."""
    return f"{'this machine' if device.name == 'cpu' else device.name}: {_gb(device.memory)}"


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"
