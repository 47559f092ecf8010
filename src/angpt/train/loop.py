"""The training loop behind `angpt train`: one process or many (torchrun), DDP or FSDP2, exact resume."""

from __future__ import annotations

import contextlib
import json
import math
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from angpt.errors import ConfigError, UserError
from angpt.models import MODEL_CLASSES, ModelConfig, apply_constraints, make_config, unwrap
from angpt.train import checkpoint as ckpt
from angpt.train.config import RunConfig
from angpt.train.dist import (
    DistInfo,
    all_reduce_mean,
    full_model_state,
    full_optimizer_state,
    init_distributed,
    load_full_state,
    no_grad_sync,
    parallelize,
)
from angpt.train.metrics import MetricsLogger, bits_per_byte, health_metrics, peak_flops, plot_loss_curve
from angpt.train.optim import make_optimizer


class TrainingError(UserError):
    """Training cannot go on (a NaN loss, say); the message names the step and the last good checkpoint."""


@dataclass
class TrainResult:
    out: Path
    step: int
    status: str  # "finished" | "interrupted"
    final_loss: float | None
    val_loss: float | None
    val_bpb: float | None
    checkpoint: Path | None
    tokens: int
    step_time_median: float | None


# ------------------------------------------------------------------------------------------------ helpers
def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 matmul (AMX or AVX512-BF16); without it bf16 is far slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(requested: str, device: torch.device) -> str:
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_supports_bf16() else "fp32"


def autocast(device: torch.device, dtype: str):
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def git_revision() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(cfg: RunConfig, info: DistInfo, dtype: str) -> dict[str, Any]:
    import angpt

    dev = torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else platform.processor() or "cpu"
    return {
        "angpt_version": angpt.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "git_revision": git_revision(),
        "seed": cfg.train.seed,
        "device": dev,
        "device_type": info.device.type,
        "world_size": info.world_size,
        "dist": cfg.dist if info.enabled else None,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "hostname": platform.node(),
        "command": sys.argv,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


class _Signals:
    """SIGINT/SIGTERM set a flag; the loop saves a checkpoint at the end of the current step and exits.

    The handler never raises, so a signal that arrives during a save cannot interrupt it half-way.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self):
        if threading_main():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def resolve_model_config(cfg: RunConfig, data_meta: dict | None):
    """Preset + overrides; the vocabulary follows the dataset unless given, and must cover it."""
    overrides = dict(cfg.model)
    if cfg.train.seq_len is not None and "context_length" not in overrides:
        overrides["context_length"] = max(cfg.train.seq_len, make_config(cfg.arch, cfg.preset).context_length)
    if data_meta is not None:
        data_vocab = int(data_meta["vocab_size"])
        if "vocab_size" not in overrides:
            overrides["vocab_size"] = -(-data_vocab // 64) * 64  # padded to a multiple of 64 for fast matmuls
        elif overrides["vocab_size"] < data_vocab:
            raise ConfigError(
                f"the dataset's vocabulary ({data_vocab}) is larger than model.vocab_size={overrides['vocab_size']}; "
                f"set model.vocab_size >= {data_vocab} or drop the override"
            )
    return make_config(cfg.arch, cfg.preset, **overrides)


# --------------------------------------------------------------------------------------------------- train
def train(cfg: RunConfig) -> TrainResult:
    """Train one run described by `cfg`; returns where it stopped. Safe to call again to resume (resume=auto)."""
    from angpt.data import TokenLoader, check_compatible, iter_eval_batches, load_meta

    cfg.validate()
    if cfg.data is None:
        raise ConfigError("no dataset: pass --data DIR (a folder written by `angpt prepare`)")
    if cfg.out is None:
        raise ConfigError("no output directory: pass --out DIR")
    out = Path(cfg.out)
    tc = cfg.train
    info = init_distributed(tc.device)
    meta = load_meta(cfg.data)
    if cfg.init_from is not None:  # the model is whatever the checkpoint holds (e.g. an imported Qwen3)
        ckpt.validate_checkpoint(cfg.init_from, need_trainer=False)
        mcfg = ModelConfig.from_dict(ckpt.read_state(cfg.init_from)["model_config"])
        if mcfg.arch != cfg.arch:
            raise ConfigError(f"--train.init_from holds a {mcfg.arch} model; pass --arch {mcfg.arch}")
    else:
        mcfg = resolve_model_config(cfg, meta)
    check_compatible(meta, mcfg.vocab_size)
    T = tc.seq_len or mcfg.context_length
    if T > mcfg.context_length:
        raise ConfigError(f"train.seq_len={T} exceeds the model's context length {mcfg.context_length}")
    seqs, rem = divmod(tc.batch_tokens, T)
    per_step = tc.micro_batch * info.world_size
    if rem or seqs % per_step:
        raise ConfigError(
            f"train.batch_tokens={tc.batch_tokens} must be a multiple of seq_len x micro_batch x ranks = "
            f"{T} x {tc.micro_batch} x {info.world_size} = {T * per_step}; e.g. --train.batch_tokens "
            f"{max(1, round(tc.batch_tokens / (T * per_step))) * T * per_step}"
        )
    accum = seqs // per_step
    resume_from = ckpt.resolve_resume(out, cfg.resume)
    if resume_from is None and (out / "metrics.jsonl").exists():
        raise UserError(
            f"{out} already holds a run (metrics.jsonl) but no checkpoint to resume; "
            "pass --resume auto to continue it, or choose a new --out"
        )
    if tc.deterministic:
        torch.use_deterministic_algorithms(True)
    dtype = resolve_dtype(tc.dtype, info.device)

    torch.manual_seed(tc.seed)
    model = MODEL_CLASSES[mcfg.arch](mcfg).to(info.device)
    flops_per_token = model.flops_per_token(T)
    model = parallelize(model, info, cfg.dist)
    base = unwrap(model)
    opt, sched = make_optimizer(
        model,
        cfg.arch,
        cfg.lr,
        max_steps=tc.max_steps,
        weight_decay=tc.weight_decay,
        warmup_steps=tc.warmup_steps,
        min_lr_ratio=tc.min_lr_ratio,
        betas=(tc.beta1, tc.beta2),
    )
    loader = TokenLoader(cfg.data, "train", tc.micro_batch, T, rank=info.rank, world_size=info.world_size, seed=tc.seed)
    step, tokens = 0, 0
    if resume_from is not None:
        state = ckpt.read_state(resume_from)
        if state.get("model_config") != mcfg.to_dict():
            raise UserError(f"checkpoint {resume_from} was trained with a different model config; use a new --out")
        trainer = ckpt.load_trainer_state(resume_from)
        model_sd = ckpt.load_model_state(resume_from)
        ckpt.check_fits(base, model_sd, str(resume_from))
        load_full_state(model, opt, model_sd, trainer["optimizer"])
        sched.load_state_dict(trainer["scheduler"])
        torch.set_rng_state(trainer["rng"]["torch"])
        loader.load_state_dict(state["data"])
        step, tokens = state["step"], state["tokens"]
    elif cfg.init_from is not None:
        model_sd = ckpt.load_model_state(cfg.init_from)
        ckpt.check_fits(base, model_sd, str(cfg.init_from))
        load_full_state(model, None, model_sd, None)
    train_fn = torch.compile(model) if tc.compile else model

    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"run": cfg.to_dict(), "model": mcfg.to_dict()}, indent=2))
        prov = provenance(cfg, info, dtype)
        (out / "provenance.json").write_text(json.dumps(prov, indent=2))
    logger = MetricsLogger(
        out,
        tensorboard=tc.tensorboard,
        wandb=tc.wandb,
        wandb_project=tc.wandb_project,
        config=cfg.to_dict(),
        enabled=info.is_main,
    )
    bpt = meta.get("bytes_per_token") or _bytes_per_token(meta)
    peak = peak_flops(info.device, tc.peak_flops)

    def evaluate() -> tuple[float, float | None]:
        model.eval()
        total, n = torch.zeros((), device=info.device), 0
        with torch.no_grad(), autocast(info.device, dtype):
            for x, y in iter_eval_batches(
                cfg.data, tc.micro_batch, T, max_batches=tc.eval_batches, rank=info.rank, world_size=info.world_size
            ):
                _, loss = model(x.to(info.device), y.to(info.device))
                total += loss.float()
                n += 1
        model.train()
        val = all_reduce_mean(total / max(n, 1), info).item()
        return val, bits_per_byte(val, bpt)

    def save(step: int, metrics: dict) -> Path | None:
        model_sd = full_model_state(model)
        optim_sd = full_optimizer_state(model, opt)
        if not info.is_main:
            return None
        trainer_state = {
            "optimizer": optim_sd,
            "scheduler": sched.state_dict(),
            "rng": {"torch": torch.get_rng_state()},
        }
        state = {
            "tokens": tokens,
            "data": loader.state_dict(),
            "run_config": cfg.to_dict(),
            "model_config": mcfg.to_dict(),
            "metrics": metrics,
            "world_size": info.world_size,
        }
        return ckpt.save_checkpoint(
            out, step, model_sd, trainer_state, state, tokenizer_dir=cfg.data, keep_last=tc.keep_last
        )

    last_ckpt = resume_from
    status, loss_value, val_loss, val_bpb = "finished", None, None, None
    step_times: list[float] = []
    pbar = _progress(tc.progress and info.is_main, step, tc.max_steps)
    model.train()
    with _Signals() as signals:
        while step < tc.max_steps:
            t0 = time.perf_counter()
            loss_sum = torch.zeros((), device=info.device)
            data_time = 0.0
            for micro in range(accum):
                td = time.perf_counter()
                x, y = loader.next_batch()
                data_time += time.perf_counter() - td
                x, y = x.to(info.device, non_blocking=True), y.to(info.device, non_blocking=True)
                with no_grad_sync(model, info.enabled and micro < accum - 1), autocast(info.device, dtype):
                    _, loss = train_fn(x, y)
                (loss / accum).backward()
                loss_sum += loss.detach().float()
            loss_t = all_reduce_mean(loss_sum / accum, info)
            loss_value = loss_t.item()
            if not math.isfinite(loss_value):
                where = f"the last good checkpoint is {last_ckpt}" if last_ckpt else "no checkpoint was saved yet"
                raise TrainingError(f"loss is {loss_value} at step {step + 1}; stopping ({where})")
            grad_norm = (
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                if tc.grad_clip > 0
                else _grad_norm(model)
            )
            opt.step()  # the weight constraint (nGPT, anGPT) runs in the optimizer's post-step hook
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            tokens += tc.batch_tokens
            if info.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            step_times.append(dt)
            tok_s = tc.batch_tokens / dt
            mfu = flops_per_token * tok_s / (peak * info.world_size) if peak else None
            row: dict[str, Any] = {
                "step": step,
                "loss": loss_value,
                "lr": sched.get_last_lr()[0],
                "tokens": tokens,
                "grad_norm": float(grad_norm),
                "tokens_per_sec": tok_s,
                "step_time": dt,
                "data_time": data_time,
            }
            if mfu is not None:
                row["mfu"] = mfu
            last = step == tc.max_steps
            if (tc.eval_every and step % tc.eval_every == 0) or last:
                val_loss, val_bpb = evaluate()
                row["val_loss"] = val_loss
                if val_bpb is not None:
                    row["val_bpb"] = val_bpb
                if info.is_main and not info.enabled:
                    xb, _ = next(iter(iter_eval_batches(cfg.data, min(4, tc.micro_batch), T, max_batches=1)))
                    row.update(health_metrics(base, xb.to(info.device)))
            if tc.eval_tasks and tc.eval_tasks_every and (step % tc.eval_tasks_every == 0 or last):
                row.update(task_metrics(base, cfg, info))
            if step % tc.log_every == 0 or "val_loss" in row or step == 1:
                logger.log(row)
            if pbar is not None:
                pbar.update(1)
                pbar.set_postfix_str(_postfix(row, mfu))
            stop = signals.received is not None or (tc.stop_at is not None and step >= tc.stop_at and not last)
            if stop or last or (tc.save_every and step % tc.save_every == 0):
                last_ckpt = save(step, {k: v for k, v in row.items() if not k.startswith("health/")}) or last_ckpt
            if stop:
                status = "interrupted"
                if info.is_main:
                    why = f"{signal.Signals(signals.received).name} received" if signals.received else "train.stop_at"
                    print(f"\n{why}: saved {last_ckpt} at step {step}; resume with --resume auto", file=sys.stderr)
                break
    if pbar is not None:
        pbar.close()
    logger.close()
    if info.is_main and status == "finished":
        plot_loss_curve(out, f"{cfg.arch} ({cfg.preset})")
    step_times_sorted = sorted(step_times[1:] or step_times)
    return TrainResult(
        out=out,
        step=step,
        status=status,
        final_loss=loss_value,
        val_loss=val_loss,
        val_bpb=val_bpb,
        checkpoint=last_ckpt,
        tokens=tokens,
        step_time_median=step_times_sorted[len(step_times_sorted) // 2] if step_times_sorted else None,
    )


def task_metrics(model, cfg: RunConfig, info: DistInfo) -> dict[str, float]:
    """lm-eval tasks on the current model (rank 0 only), as flat `task/<task>/<metric>` scalars."""
    if not info.is_main or info.enabled:
        return {}  # the harness runs one process on the whole model; skip it under DDP/FSDP
    from angpt.data import load_tokenizer
    from angpt.infer.harness import evaluate_tasks

    tc = cfg.train
    was_training = model.training
    results = evaluate_tasks(
        model.eval(),
        load_tokenizer(cfg.data),
        tc.eval_tasks,
        include_path=tc.eval_tasks_include,
        limit=tc.eval_tasks_limit,
        bootstrap_iters=0,
    )
    model.train(was_training)
    out = {}
    for task, metrics in results.get("results", {}).items():
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and "stderr" not in name:
                out[f"task/{task}/{name.split(',')[0]}"] = float(value)
    return out


def _grad_norm(model) -> torch.Tensor:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def _bytes_per_token(meta: dict) -> float | None:
    val = meta.get("splits", {}).get("val", {})
    if val.get("bytes") and val.get("tokens"):
        return val["bytes"] / val["tokens"]
    return None


def _progress(enabled: bool, start: int, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=start,
        desc="train",
        unit="step",
        dynamic_ncols=True,
        mininterval=1.0 if sys.stderr.isatty() else 30.0,
    )


def _postfix(row: dict, mfu: float | None) -> str:
    parts = [f"loss {row['loss']:.3f}", f"{row['tokens_per_sec']:.0f} tok/s"]
    if "val_loss" in row:
        parts.append(f"val {row['val_loss']:.3f}")
    if mfu is not None:
        parts.append(f"MFU {100 * mfu:.1f}%")
    return ", ".join(parts)


def apply_constraints_now(model) -> None:
    """Re-apply the weight constraint (after loading foreign weights, say)."""
    apply_constraints(unwrap(model).constraint_groups())
