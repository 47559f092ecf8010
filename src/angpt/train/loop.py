"""The training loop behind `angpt train`: one process or many (torchrun), DDP or FSDP2, exact resume.

`train(cfg)` sets a run up (`Trainer.__init__`: data, model, optimizer, resume), then steps it with the shared
`TrainStep` (train/step.py), evaluating, logging and checkpointing on the way. Anything beyond validation loss
that should run at evaluation time (lm-eval tasks, say) comes in as an evaluator: a callable `(model, step)` ->
metrics, which the CLI wires in, so that this module needs nothing from inference.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from contextlib import closing, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from angpt import checkpoint as ckpt
from angpt.checkpoint import RunState
from angpt.errors import CheckpointError, ConfigError, UserError
from angpt.lock import DirLock
from angpt.train.config import RunConfig
from angpt.train.dist import (
    DistInfo,
    all_reduce_mean,
    any_rank,
    full_model_state,
    full_optimizer_state,
    init_distributed,
    load_full_state,
)
from angpt.train.hardware import keep_freed_memory
from angpt.train.metrics import MetricsLogger, bits_per_byte, health_metrics, peak_flops, plot_loss_curve
from angpt.train.provenance import provenance
from angpt.train.setup import RESUME, build, resolve, resuming
from angpt.train.signals import StopSignals
from angpt.train.step import autocast, check_compute, synchronize
from angpt.train.summary import TIMED_AFTER, RunSummary, epochs_note, startup_lines, timed_line
from angpt.train.watch import ResidualWatch

Evaluator = Callable[[nn.Module, int], dict[str, float]]


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
    signal: int | None = None  # the signal (SIGINT, SIGTERM) that stopped the run, if one did
    dtype: str | None = None  # the compute dtype actually used ("bf16" or "fp32", never "auto")
    compiled: bool | None = None  # whether the forward ran through torch.compile (train.compile resolved)
    best: Path | None = None  # checkpoints/best: the weights of the lowest validation loss (train.keep_best)
    best_val_loss: float | None = None
    test_loss: float | None = None  # on the test split, at the last step (datasets with one)
    model_reused: bool = False  # built by an earlier run in this process (train's `models`): nothing compiled


# --------------------------------------------------------------------------------------------------- train
def train(
    cfg: RunConfig,
    evaluators: list[Evaluator] | None = None,
    *,
    restart_unsaved: bool = False,
    cpu_note: str = "",
    models: Any = None,
) -> TrainResult:
    """Train one run described by `cfg`; returns where it stopped. Safe to call again to resume (resume=auto).

    `evaluators` run at every `train.eval_tasks_every` steps and at the end (rank 0, single process only); the
    CLI passes lm-eval's when `train.eval_tasks` is set. `restart_unsaved` starts afresh a run whose folder holds
    one that stopped before its first checkpoint (a study's own runs; `angpt train` refuses such a folder).
    `cpu_note` is what the CLI found of a busy machine (hardware.cpu_share), for the start-up summary. `models`
    (study/inprocess.py's ModelCache) lends the model, and its compiled forward, of an earlier run of the same
    model in this process: its weights are set in place to this run's fresh ones, and nothing compiles again.
    """
    if cfg.out is not None and Path(cfg.out).exists() and not Path(cfg.out).is_dir():
        raise ConfigError(f"--out {cfg.out} is a file; pass a folder")
    other_rank = int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) != 0
    kw = {"restart_unsaved": restart_unsaved, "cpu_note": cpu_note, "models": models}
    if cfg.out is None or other_rank:  # rank 0 claims the folder for all ranks
        return Trainer(cfg, evaluators, **kw).run()
    with DirLock(cfg.out, "angpt train"):
        return Trainer(cfg, evaluators, **kw).run()


class Trainer:
    """One run: decided, built and restored on construction; `run()` trains to the end or a stop.

    Construction goes one way: the run resolved (train/setup.py: how it starts, fresh, resume or init_from, from the
    run folder read once; its model config, dtype, recipe and run id), then built (model, optimizer, schedule, step,
    loader), then restored from the start's checkpoint (:meth:`_restore`)."""

    def __init__(
        self,
        cfg: RunConfig,
        evaluators: list[Evaluator] | None = None,
        *,
        restart_unsaved: bool = False,
        cpu_note: str = "",
        models: Any = None,
    ):
        from angpt.data import check_compatible, check_trainable, data_identity, load_meta

        if cfg.data is None:
            raise ConfigError("no dataset: pass --data DIR (a folder written by `angpt prepare`)")
        if cfg.out is None:
            raise ConfigError("no output directory: pass --out DIR")
        if cfg.train.eval_tasks and not evaluators:
            raise ConfigError(
                "train.eval_tasks needs an evaluator: pass evaluators=[angpt.infer.task_evaluator(cfg)] "
                "(`angpt train` does this itself)"
            )
        self.evaluators = evaluators or []
        self.info = info = init_distributed(cfg.train.device)
        meta = load_meta(cfg.data)  # the dataset's meta.json, read once: the run carries it
        self.resolved = run = resolve(
            cfg, device=info.device, world_size=info.world_size, meta=meta,
            data_identity=data_identity(cfg.data, meta=meta), clean=info.is_main, restart_unsaved=restart_unsaved,
        )  # fmt: skip
        # From here on the resolved run is the run: the config it came from is not read again.
        self.train, self.start, self.out = run.train, run.start, Path(run.out)
        check_compatible(meta, run.model.vocab_size)
        self.cpu_note = cpu_note
        check_trainable(run.data, self.train.seq_len, world_size=info.world_size, meta=meta)  # fails now, not at step N
        if self.train.deterministic:
            torch.use_deterministic_algorithms(True)
        notes = check_compute(self.train.dtype, info.device, self.train.compile)
        if info.device.type == "cpu":
            keep_freed_memory()  # reuse freed activation memory instead of page-faulting it in every step
        if run.dist == "fsdp" and not info.enabled:
            notes.append("--dist fsdp in a single process shards nothing; launch with torchrun --nproc_per_node=N")
        for note in notes if info.is_main else []:
            print(f"warning: {note}", file=sys.stderr)

        # build (model, optimizer, schedule, step, loader: train/setup.py), then restore
        lent = models.lend(run) if models is not None and not info.enabled else {}
        built = build(run, info, dist=run.dist, **lent)
        if models is not None and not info.enabled:
            models.keep(run, built)
        self.model_reused = "model" in lent
        self.model, self.base, self.opt, self.sched = built.model, built.base, built.optimizer, built.scheduler
        self.loader, self.step_fn, self.flops_per_token = built.loader, built.step, built.flops_per_token
        test = meta.get("splits", {}).get("test", {})
        self.has_test = test.get("tokens", 0) > self.train.seq_len * info.world_size  # a window per rank
        self.step, self.tokens = 0, 0
        self.best_val, self.best_step = math.inf, None  # train.keep_best: carried in every checkpoint's state
        self.watch = self._residual_watch()
        self._restore()
        if info.is_main:
            if self.start.mode == RESUME:  # said once the checkpoint is back, not before a later refusal
                resuming(self.start)
            for note in self._data_notes():
                print(f"warning: {note}", file=sys.stderr)

    @property
    def resume_from(self) -> Path | None:
        return self.start.checkpoint if self.start.mode == RESUME else None

    def _restore(self) -> None:
        """What the start says to bring back, from its checkpoint (its state read once, by the start): a resumed
        run's weights, optimizer, schedule, RNG, data position, step and best validation loss; an init_from run's
        weights only."""
        where, state, resume = self.start.checkpoint, self.start.state, self.start.mode == RESUME
        if where is None or state is None:
            return
        recorded = state.to_dict()  # its checksums: state.json is not read again
        model_sd = ckpt.load_model_state(where, recorded)
        ckpt.check_fits(self.base, model_sd, str(where))
        trainer = ckpt.load_trainer_state(where, state=recorded) if resume else None
        load_full_state(self.model, self.opt if resume else None, model_sd, trainer["optimizer"] if trainer else None)
        if trainer is None:
            return
        self.sched.load_state_dict(trainer["scheduler"])
        self._reschedule()
        torch.set_rng_state(trainer["rng"]["torch"])
        self.loader.load_state_dict(state.data)
        self.step, self.tokens = state.step, state.tokens
        self.best_val = state.best_val_loss or math.inf
        self.best_step = state.best_step

    def summary(self, peak: float | None) -> RunSummary:
        """The numbers of the start-up summary (train/summary.py); `peak` is one device's FLOP/s, if known. On a CPU,
        a run long enough to need one gets the dry run's estimate of its step (the MFU measured on one block of its
        model), so that the start-up line, the dry run and the step-3 line agree."""
        info = self.info
        device = str(info.device)
        if info.device.type == "cuda":
            device += f" ({torch.cuda.get_device_name(info.device)})"
        if info.world_size > 1:
            device += f" x {info.world_size} processes"
        lr, lr_from = self.train.lr, self.resolved.lr_from
        has_embed = getattr(self.base, "embed", None) is not None
        return RunSummary(
            arch=self.resolved.arch,
            preset=self.resolved.preset,
            params=self.base.num_params(),
            params_non_embedding=self.base.num_params(embeddings=False) if has_embed else None,
            device=device,
            dtype=f"{self.train.dtype}, compiled" if self.train.compile else self.train.dtype,
            lr=lr,
            lr_from=lr_from or " (train.lr)",
            batch_tokens=self.train.batch_tokens,
            micro_batch=self.train.micro_batch,
            seq_len=self.train.seq_len,
            accum=self.step_fn.accum,
            world_size=info.world_size,
            max_steps=self.train.max_steps,
            step=self.step,
            train_tokens=self.loader.tokens_per_epoch,
            flops_per_token=self.flops_per_token,
            peak=peak,
            mfu=self._estimated_mfu(peak),
            cpu_note=self.cpu_note,
        )

    def _estimated_mfu(self, peak: float | None) -> float | None:
        """The dry run's MFU for this run on this CPU (train/dryrun.py), where the run has more than a few steps left
        (a short one is measured before an estimate would help); its probe's random draws leave the run's alone."""
        if self.info.device.type != "cpu" or not peak or self.train.max_steps - self.step <= 3 * TIMED_AFTER:
            return None
        from angpt.train.dryrun import measured_cpu_mfu

        with torch.random.fork_rng(devices=[]):
            return measured_cpu_mfu(self.resolved, self.train.dtype, peak)

    def _data_notes(self) -> list[str]:
        """How many times the run reads its training data, when that is more than a few (it will overfit)."""
        note = epochs_note(self.train, self.loader.tokens_per_epoch)
        return [note] if note else []

    def _save_best(self, val_loss: float, metrics: dict) -> Path | None:
        """The weights of a new lowest validation loss into checkpoints/best (every rank gathers; rank 0 writes),
        replacing the previous best only once the new one is complete."""
        model_sd = full_model_state(self.model)
        self.best_val, self.best_step = val_loss, self.step
        if not self.info.is_main:
            return None
        root = ckpt.checkpoint_dir(self.out)
        best, new, old = root / "best", root / f".best_new_{os.getpid()}", root / f".best_old_{os.getpid()}"
        for stale in (new, old):
            shutil.rmtree(stale, ignore_errors=True)
        state = RunState(
            step=self.step,
            tokens=self.tokens,
            run=self.record(),
            model_config=self.resolved.model.to_dict(),
            metrics=metrics,
            best_val_loss=val_loss,
            run_id=self.start.run_id,
        )
        ckpt.save_weights_checkpoint(new, model_sd, _weights_only(state), tokenizer_dir=self.resolved.data)
        if best.exists():
            os.replace(best, old)
        os.replace(new, best)
        shutil.rmtree(old, ignore_errors=True)
        return best

    def _reschedule(self) -> None:
        """After loading a scheduler's state: this run's schedule (its max_steps), and the LR it gives now.

        LambdaLR's state carries the callable schedule's fields, so a resumed run would otherwise keep the old
        max_steps (and the old run's cosine) whatever the new config says.
        """
        sched = self.sched
        for fn in sched.lr_lambdas:
            fn.max_steps = self.train.max_steps
        for group, base, fn in zip(self.opt.param_groups, sched.base_lrs, sched.lr_lambdas):
            group["lr"] = base * fn(sched.last_epoch)
        sched._last_lr = [g["lr"] for g in self.opt.param_groups]

    def _forget_unsaved_steps(self) -> None:
        """Steps after the checkpoint being resumed are about to be run again: their metrics rows go, and later
        checkpoints (resuming an older one on purpose) move aside to checkpoints/superseded_*, kept but no longer
        what `--resume auto` or rotation sees."""
        if not self.info.is_main:
            return
        later = [c for c in ckpt.list_checkpoints(self.out) if int(c.name.split("_")[1]) > self.step]
        if self.resume_from is not None and later:
            aside = ckpt.checkpoint_dir(self.out) / f"superseded_{time.strftime('%Y%m%d-%H%M%S')}"
            aside.mkdir()
            for c in later:
                os.replace(c, aside / c.name)
            print(f"moved {len(later)} later checkpoint(s) aside to {aside}", file=sys.stderr)
        path = self.out / "metrics.jsonl"
        if not path.is_file():
            return
        lines = path.read_text().splitlines()
        keep = [line for line in lines if _row_step(line) <= self.step]  # a torn last line is dropped too
        if len(keep) != len(lines):
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in keep))
            os.replace(tmp, path)

    # ------------------------------------------------------------------------------------------------ pieces
    def evaluate(self, split: str = "val") -> tuple[float, float | None]:
        """Loss on a held-out split (nats per token, mean over ranks) and bits per byte: "val" (selection) or
        "test" (the numbers reported), over `train.eval_batches` batches spread over the split."""
        loss = held_out_loss(self.model, self.resolved, split, self.info)
        return loss, bits_per_byte(loss, _bytes_per_token(self.resolved.meta, split))

    def _side_batches(self, n: int) -> list[torch.Tensor]:
        """`n` training batches for an architecture's hook: a separate loader with its own seed, identical on
        every rank, so the training stream (and thus the data order every arm shares) is untouched."""
        from angpt.data import TokenLoader

        t = self.train
        side = TokenLoader(self.resolved.data, "train", t.micro_batch, t.seq_len, seed=t.seed + SIDE_SEED,
                           meta=self.resolved.meta)  # fmt: skip
        return [side.next_batch()[0].to(self.info.device) for _ in range(n)]

    def health(self) -> dict[str, float]:
        """Per-layer norms and scales on one validation batch (single process only)."""
        from angpt.data import iter_eval_batches

        t = self.train
        batches = iter_eval_batches(self.resolved.data, min(4, t.micro_batch), t.seq_len, max_batches=1,
                                    meta=self.resolved.meta)  # fmt: skip
        xb, _ = next(iter(batches))
        return health_metrics(self.base, xb.to(self.info.device))

    def _residual_watch(self) -> ResidualWatch | None:
        """The early warning of a growing residual stream, for architectures with a bound (single process)."""
        spec = self.resolved.spec
        if spec.residual_bound is None or self.info.enabled:
            return None

        def remedy() -> str:  # said only when the watch warns
            return self._halve_lr() + (spec.onset_remedy(self.resolved.model) if spec.onset_remedy else "")

        return ResidualWatch(spec.residual_bound, self._side_batches(1)[0][:1], self.train.dtype, remedy)

    def _halve_lr(self) -> str:
        return f"halve the learning rate (train.lr={self.train.lr / 2:g}; this run's is {self.train.lr:g})"

    def _remedy(self) -> str:
        """What to change after a divergence: a rate and a warm-up to try, beside the run's own."""
        warmup = self.sched.lr_lambdas[0].warmup_steps  # the run's Schedule (train/optim.py)
        longer = max(2 * warmup, math.ceil(0.05 * self.train.max_steps))  # GPT+'s recipe warms up over 5%
        return (
            f"{self._halve_lr()} or lengthen the warm-up (train.warmup_steps={longer}; this run's is {warmup}), "
            "then train again (docs/open_choices.md, early-training spikes)"
        )

    def _fail(self, logger: MetricsLogger, row: dict[str, Any], message: str) -> None:
        """Log the failing step's `row` with the error (rank 0), then stop with a TrainingError saying `message`."""
        if self.info.is_main:
            logger.log({**row, "error": message})
        raise TrainingError(message)

    def save(self, metrics: dict) -> Path | None:
        """Checkpoint the current step (every rank gathers; rank 0 writes); returns its path on rank 0."""
        model_sd = full_model_state(self.model)
        optim_sd = full_optimizer_state(self.model, self.opt)
        if not self.info.is_main:
            return None
        trainer_state = {
            "optimizer": optim_sd,
            "scheduler": self.sched.state_dict(),
            "rng": {"torch": torch.get_rng_state()},
        }
        state = RunState(
            step=self.step,
            tokens=self.tokens,
            data=self.loader.state_dict(),
            run=self.record(),
            model_config=self.resolved.model.to_dict(),
            metrics=metrics,
            world_size=self.info.world_size,
            data_identity=self.resolved.data_identity,
            best_val_loss=self.best_val if math.isfinite(self.best_val) else None,
            best_step=self.best_step,
        )
        return ckpt.save_checkpoint(
            self.out,
            self.step,
            model_sd,
            trainer_state,
            state.to_dict(),
            tokenizer_dir=self.resolved.data,
            keep_last=self.train.keep_last,
            run_id=self.start.run_id,
        )

    def record(self) -> dict[str, Any]:
        """The run's record as a checkpoint keeps it: train/record.py's, less the model (state.json's model_config)."""
        return {k: v for k, v in self.resolved.to_dict().items() if k != "model"}

    def _write_run_files(self) -> None:
        """config.json (the run's record: what `--resume auto` restarts from) and provenance.json."""
        if self.info.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text(json.dumps({"run": self.resolved.to_dict()}, indent=2))
            (self.out / "provenance.json").write_text(json.dumps(provenance(self.resolved, self.info), indent=2))

    # ------------------------------------------------------------------------------------------------- loop
    def run(self) -> TrainResult:
        info = self.info
        self._forget_unsaved_steps()
        self._write_run_files()
        logger = MetricsLogger(
            self.out,
            tensorboard=self.train.tensorboard,
            wandb=self.train.wandb,
            wandb_project=self.train.wandb_project,
            config=self.resolved.to_dict(),
            enabled=info.is_main,
        )
        peak = peak_flops(info.device, self.train.peak_flops, self.train.dtype)
        self.last_ckpt = self.resume_from
        status, loss_value, self.val_loss, self.val_bpb, self.test_loss = "finished", None, None, None, None
        step_times: list[float] = []
        # The summary goes with the bar: a study turns both off (it has its own bar over all its runs).
        shown = self.train.progress and info.is_main and self.step < self.train.max_steps
        summary = self.summary(peak) if shown else None
        for line in startup_lines(summary) if summary else []:
            print(line, file=sys.stderr)
        pbar = _progress(self.train.progress and info.is_main, self.step, self.train.max_steps)
        spikes = SpikeDetector(self.train.spike_factor)
        self.before_step = self.resolved.spec.before_step  # the architecture's hook, if any, before every step
        self.model.train()
        start_norms = None  # logged with the first step, so that a run's rows hold every measurement of the watch
        if self.watch is not None and self.step < self.train.max_steps:
            self.watch.start(self.base)  # the norms the first rise is judged against
            start_norms = self.watch.last
        # The bar and the logger's TensorBoard / W&B writers close however the loop ends (a TrainingError, Ctrl-C):
        # TensorBoard writes its queued events on close (else every 2 minutes), W&B ends its run.
        signals = StopSignals(announce=info.is_main, step=self.step + 1)
        with signals, closing(logger), pbar if pbar is not None else nullcontext():
            while self.step < self.train.max_steps:
                signals.step = self.step + 1  # the step in progress, which a first Ctrl-C lets finish and save
                loss_value, grad_norm, dt = self._step(logger, spikes)
                step_times.append(dt)
                timed = timed_line(summary, self.step, step_times) if summary else None
                if timed:
                    _say(timed, pbar)
                if peak and info.device.type == "cpu" and not self.train.peak_flops:  # the least the CPU does: raise it
                    peak = max(peak, self.flops_per_token * self.train.batch_tokens / (dt * info.world_size))
                row, mfu = self._row(loss_value, grad_norm, dt, peak, start_norms)
                start_norms = None
                last = self.step == self.train.max_steps
                self._evaluate_into(row, last)
                if self.step % self.train.log_every == 0 or "val_loss" in row or "warning" in row or self.step == 1:
                    logger.log(row)
                if pbar is not None:
                    pbar.update(1)
                    pbar.set_postfix_str(_postfix(row, mfu))
                if self._save_or_stop(row, signals, last):
                    status = "interrupted"
                    break
        if info.is_main and status == "finished" and self.train.loss_curve:
            plot_loss_curve(self.out, f"{self.resolved.arch} ({self.resolved.preset})")
        return self._result(status, loss_value, step_times, signals.received)

    def _step(self, logger: MetricsLogger, spikes: SpikeDetector) -> tuple[float, torch.Tensor, float]:
        """One optimizer step, stopped before the update where its loss or gradient norm is not finite or the loss
        spiked (the failing step's row is logged with the error first, so metrics.jsonl shows where and how
        training failed): (loss, gradient norm before clipping, seconds)."""
        info = self.info
        before_step = self.before_step
        note = before_step(self.base, self.step, self.train.max_steps, self._side_batches) if before_step else None
        if note and info.is_main:
            print(note, file=sys.stderr)
        t0 = time.perf_counter()
        loss_value = self.step_fn.accumulate(self.loader.next_batch).item()
        where = f"the last good checkpoint is {self.last_ckpt}" if self.last_ckpt else "no checkpoint was saved yet"
        failed = {"step": self.step + 1, "loss": loss_value}
        if not math.isfinite(loss_value):
            self._fail(
                logger, failed, f"loss is {loss_value} at step {self.step + 1}; stopping ({where}); {self._remedy()}"
            )
        if spikes.check(loss_value):  # before the update: the weights stay those of the last good step
            self._fail(
                logger,
                failed,
                f"loss spiked to {loss_value:.4g} at step {self.step + 1}, {spikes.ratio:.1f}x its running "
                f"mean (train.spike_factor={self.train.spike_factor}); stopping before the update ({where}); "
                f"{self._remedy()}",
            )
        grad_norm = self.step_fn.clip()
        if not torch.isfinite(grad_norm):  # the update would poison the weights: stop before it
            self._fail(
                logger,
                {**failed, "grad_norm": float(grad_norm)},
                f"gradient norm is {float(grad_norm)} at step {self.step + 1}; stopping before the update "
                f"({where}); {self._remedy()}",
            )
        self.step_fn.apply()
        self.step += 1
        self.tokens += self.train.batch_tokens
        synchronize(info.device)
        return loss_value, grad_norm, time.perf_counter() - t0

    def _row(self, loss_value, grad_norm, dt, peak, start_norms) -> tuple[dict[str, Any], float | None]:
        """The step's metrics row, with the residual watch's measurement where it is due (after the step's time:
        the probe is not the step), and the step's MFU."""
        info = self.info
        warning = norms = None
        if self.watch is not None and self.watch.due(self.step, self.train.log_every):
            warning, norms = self.watch.check(self.base, self.step), self.watch.last
            if warning and info.is_main:
                print(f"warning: {warning}", file=sys.stderr)
        tok_s = self.train.batch_tokens / dt
        mfu = self.flops_per_token * tok_s / (peak * info.world_size) if peak else None
        row: dict[str, Any] = {
            "step": self.step,
            "loss": loss_value,
            "lr": self.sched.get_last_lr()[0],
            "tokens": self.tokens,
            "grad_norm": float(grad_norm),
            "tokens_per_sec": tok_s,
            "step_time": dt,
            "data_time": self.step_fn.data_time,
        }
        if mfu is not None:
            row["mfu"] = mfu
        if warning:
            row["warning"] = warning
        # every layer's ||h|| on the watch's probe: what a later calibration of the warning replays
        if start_norms is not None:
            row["residual_norms_start"] = [round(x, 4) for x in start_norms]
        if norms is not None:
            row["residual_norms"] = [round(x, 4) for x in norms]
        return row, mfu

    def _evaluate_into(self, row: dict[str, Any], last: bool) -> None:
        """Validation where it is due (and at the last step), the best weights kept, the test loss once at the end,
        the health metrics, and the evaluators' tasks where they are due: all into `row`."""
        info = self.info
        if (self.train.eval_every and self.step % self.train.eval_every == 0) or last:
            self.val_loss, self.val_bpb = self.evaluate()
            if self.train.keep_best and self.val_loss < self.best_val:
                self._save_best(self.val_loss, {"val_loss": self.val_loss, "val_bpb": self.val_bpb})
            row["val_loss"] = self.val_loss
            if self.val_bpb is not None:
                row["val_bpb"] = self.val_bpb
            if last and self.has_test:  # the reported number, once, on data no choice has seen
                self.test_loss, test_bpb = self.evaluate("test")
                row["test_loss"] = self.test_loss
                if test_bpb is not None:
                    row["test_bpb"] = test_bpb
            if info.is_main and not info.enabled:
                row.update(self.health())
        if self.evaluators and self.train.eval_tasks_every and (self.step % self.train.eval_tasks_every == 0 or last):
            if info.is_main and not info.enabled:  # evaluators run one process on the whole model
                for evaluator in self.evaluators:
                    row.update(evaluator(self.base, self.step))

    def _save_or_stop(self, row: dict[str, Any], signals: StopSignals, last: bool) -> bool:
        """Checkpoint where due (every rank gathers, rank 0 writes); True when the run stops here (a signal,
        train.stop_at), saved. Every rank stops at the same step (a signal reaches the ranks at different moments)."""
        info = self.info
        stop = any_rank(signals.received is not None, info) or (
            self.train.stop_at is not None and self.step >= self.train.stop_at and not last
        )
        if stop or last or (self.train.save_every and self.step % self.train.save_every == 0):
            failure, saved = None, None
            try:
                saved = self.save({k: v for k, v in row.items() if not k.startswith("health/")})
            except CheckpointError as e:  # non-finite weights after a finite loss, a full disk: keep the last
                failure = e
            if any_rank(failure is not None, info):  # rank 0 writes; every rank must stop with it
                reason = failure or "the checkpoint could not be saved on rank 0"
                raise TrainingError(f"{reason}; stopping (the last good checkpoint is {self.last_ckpt})")
            self.last_ckpt = saved or self.last_ckpt
        if stop and info.is_main:
            why = (  # the signal's own line said "received" when it came: this one says what was done
                f"stopped by {signal.Signals(signals.received).name}" if signals.received else "train.stop_at"
            )
            print(f"\n{why}: saved {self.last_ckpt} at step {self.step}; resume with --resume auto", file=sys.stderr)
        return stop

    def _result(self, status: str, loss_value, step_times: list[float], received) -> TrainResult:
        times = sorted(step_times[1:] or step_times)
        return TrainResult(
            out=self.out,
            step=self.step,
            status=status,
            final_loss=loss_value,
            val_loss=self.val_loss,
            val_bpb=self.val_bpb,
            test_loss=self.test_loss,
            checkpoint=self.last_ckpt,
            tokens=self.tokens,
            step_time_median=times[len(times) // 2] if times else None,
            signal=received,
            dtype=self.train.dtype,
            compiled=self.train.compile,
            best=ckpt.checkpoint_dir(self.out) / "best" if self.best_step is not None else None,
            best_val_loss=self.best_val if self.best_step is not None else None,
            model_reused=self.model_reused,
        )


def held_out_loss(model: nn.Module, run: Any, split: str, info: DistInfo) -> float:
    """Mean loss (nats per token, mean over ranks) of `model` on `run.train.eval_batches` batches of micro-batch
    windows spread evenly over a held-out `split` of the run's data (angpt.data.iter_eval_batches; `run`: a
    ResolvedRun): the same windows every time. The model is put in eval mode for it and back in train mode after."""
    from angpt.data import iter_eval_batches

    t = run.train
    model.eval()
    total, n = torch.zeros((), device=info.device), 0
    batches = iter_eval_batches(run.data, t.micro_batch, t.seq_len, max_batches=t.eval_batches, rank=info.rank,
                                world_size=info.world_size, split=split, meta=run.meta)  # fmt: skip
    with torch.no_grad(), autocast(info.device, t.dtype):
        for x, y in batches:
            _, loss = model(x.to(info.device), y.to(info.device))
            total += loss.float() * x.shape[0]  # a smaller last batch weighs by its size
            n += x.shape[0]
    model.train()
    return all_reduce_mean(total / max(n, 1), info).item()


SIDE_SEED = 1_000_003  # added to the run's seed: the loader of the batches an architecture's hook measures on


def _weights_only(state: RunState) -> dict[str, Any]:
    """The state.json of checkpoints/best: the run's step, configs, metrics and best loss (no data cursor: it is a
    start for --init_from or an export, not a run to resume)."""
    out = state.to_dict()
    out.pop("best_step", None)
    return out


def _row_step(line: str) -> float:
    try:
        return json.loads(line).get("step", 0)
    except (ValueError, AttributeError):
        return float("inf")


class SpikeDetector:
    """Flags a loss above `factor` x the running mean of the losses before it (an EMA, after `warmup` steps)."""

    def __init__(self, factor: float, warmup: int = 10, decay: float = 0.9) -> None:
        self.factor, self.warmup, self.decay = factor, warmup, decay
        self.mean: float | None = None
        self.seen = 0
        self.ratio = 1.0

    def check(self, loss: float) -> bool:
        if self.factor <= 0:
            return False
        if self.mean is not None and self.seen >= self.warmup:
            self.ratio = loss / self.mean
            if self.ratio > self.factor:
                return True
        self.mean = loss if self.mean is None else self.decay * self.mean + (1 - self.decay) * loss
        self.seen += 1
        return False


def _bytes_per_token(meta: dict, split: str = "val") -> float | None:
    held = meta.get("splits", {}).get(split, {})
    if held.get("bytes") and held.get("tokens"):
        return held["bytes"] / held["tokens"]
    return None


def _say(line: str, pbar) -> None:
    """A line on stderr, above the progress bar when there is one."""
    if pbar is not None:
        pbar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)


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


WARMUP_STEPS_NOTE = 3  # the first steps allocate memory and pick kernels: slow, and the ETA follows them


def _postfix(row: dict, mfu: float | None) -> str:
    parts = [f"loss {row['loss']:.3f}", f"{row['tokens_per_sec']:.0f} tok/s"]
    if row["step"] <= WARMUP_STEPS_NOTE:
        parts.append("first steps are slow (memory, kernels): the ETA settles after a few")
    if "val_loss" in row:
        parts.append(f"val {row['val_loss']:.3f}")
    if mfu is not None:
        parts.append(f"MFU {100 * mfu:.1f}%")
    return ", ".join(parts)
