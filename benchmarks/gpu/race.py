"""The race's training runs: each arm built and compiled once per loan, every run of it on that one model (issue 45).

A loan trains six to eight runs of two arms at one shape. Built and compiled afresh, each run would pay the model's
compiling (~40 s on an H200) again; here an :class:`ArmRunner` builds its arm's model once
(angpt.train.setup.build), compiles it once, and for every run sets the weights in place to what a fresh
`angpt train` run of that seed starts from, makes a new optimizer and schedule at the run's rate and length, and
reads the training data in the run's seed's order. The step is `angpt train`'s (angpt.train.step.TrainStep), and so
is the held-out loss (angpt.train.loop.held_out_loss): tests/test_gpu_race.py checks that a runner's runs give the
losses of separate `angpt train` runs.

What a race run leaves out: checkpoints, probes of the norms, and a host synchronisation every step. The loss and the
gradient norm stay on the device and are read every `check_every` steps: a non-finite one there ends the run as
diverged (a few steps later than `angpt train`'s check would, with the same verdict), and the step time is measured
over those windows, the first (the compiling) apart. Validation loss is taken every `eval_every` steps on the same
fixed windows; at the end, validation (for the choice of rates) and test (for the numbers reported) on
`eval_batches` fixed batches each.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from angpt.study.arms import parse_arm
from angpt.train.config import load_run_config
from angpt.train.dist import DistInfo
from angpt.train.hardware import peak_for_device_name
from angpt.train.loop import held_out_loss
from angpt.train.setup import ResolvedRun, build, resolve
from angpt.train.step import synchronize


@dataclass
class Run:
    """One training run: an arm at a rate and seed, for `steps` optimizer steps. `role`: "tune" (the tuning seed,
    chosen on validation loss) or "report" (a reported seed: its test loss is what the race reports)."""

    arm: str
    lr: float
    seed: int
    steps: int
    role: str = "report"


def run_overrides(race: dict, cfg: dict, data: dict, arm: str) -> dict[str, Any]:
    """The `angpt train` settings of `arm`'s race runs, less the rate, seed and length (race.py and the tests'
    `angpt train` reference build from these)."""
    parsed = parse_arm(arm)
    return {
        "arch": parsed.arch,
        "preset": race["preset"],
        "data": data["dir"],
        **{f"model.{k}": v for k, v in {**race["model"], **parsed.model}.items()},
        **{f"train.{k}": v for k, v in parsed.train.items()},
        "train.batch_tokens": race["batch_tokens"],
        "train.micro_batch": race["micro_batch"],
        "train.seq_len": race["seq_len"],
        "train.eval_every": race["eval_every"],
        "train.eval_batches": race["eval_batches"],
        "train.dtype": cfg["dtype"],
        "train.device": cfg["device"],
        "train.compile": bool(race.get("compile", False)),
    }


class ArmRunner:
    """Every race run of one arm in this process, on one model built and (with `race.compile`) compiled once."""

    def __init__(self, arm: str, race: dict, cfg: dict, data: dict, *, fresh_compile: bool = True) -> None:
        self.arm, self.race, self.cfg, self.data = arm, race, cfg, data
        self.overrides = run_overrides(race, cfg, data, arm)
        self.info = DistInfo(device=torch.device(cfg["device"]))
        self.fresh_compile = fresh_compile  # reset Dynamo before this arm's compiling (the loan's first arm only)
        self.model = None
        self.forward = None
        self.runs = 0  # runs made on this model

    def resolved(self, run: Run) -> ResolvedRun:
        """The run's settings as `angpt train --train.lr LR --train.seed SEED --train.max_steps STEPS` resolves
        them (its model with the dataset's vocabulary)."""
        from angpt.data import load_meta

        rc = load_run_config(
            None, {**self.overrides, "train.lr": run.lr, "train.seed": run.seed, "train.max_steps": run.steps}
        )
        return resolve(rc, device=self.info.device, meta=load_meta(rc.data))

    def run(
        self,
        run: Run,
        *,
        deadline: float | None = None,
        check_every: int = 10,
        on_check: Callable[[dict], None] | None = None,
    ) -> dict[str, Any]:
        """Train `run` to its end (or to `deadline`, a time.time(): a run that cannot finish by then stops, "cut",
        and counts for nothing); return its record: status, final validation and test loss, median step time, the
        curve, parameter counts and timings."""
        spec = self.resolved(run)
        t0 = time.time()
        first = self.model is None
        built = build(spec, self.info, model=self.model, forward=self.forward, fresh_compile=self.fresh_compile)
        self.model, self.forward = built.model, built.forward
        self.runs += 1
        record: dict[str, Any] = {
            "status": "running",
            "tokens": run.steps * spec.batch_tokens,
            "params": built.base.num_params(),
            "params_non_embedding": built.base.num_params(embeddings=False),
            "flops_per_token": built.flops_per_token,
            "lr_from": spec.lr_from.strip(" ()") or "train.lr",
            "warmup_steps": spec.warmup_steps,
            "weight_decay": spec.weight_decay,
            "compiled": spec.compile,
            "constraint": _constraint(built.optimizer),
            "model_reused": not first,
            "epochs": run.steps * spec.batch_tokens / max(1, built.loader.tokens_per_epoch),
        }
        try:
            record.update(self._train(spec, built, run, deadline, check_every, on_check, record))
        finally:
            built.step.optimizer.zero_grad(set_to_none=True)
        record["seconds"] = round(time.time() - t0, 2)
        if self.info.device.type == "cuda":
            record["max_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
        return record

    @staticmethod
    def has_test(spec: ResolvedRun) -> bool:
        """Whether the data has a test split with a window in it (as `angpt train` decides)."""
        from angpt.data import load_meta

        return load_meta(spec.data).get("splits", {}).get("test", {}).get("tokens", 0) > spec.seq_len

    def _train(self, spec, built, run, deadline, check_every, on_check, record) -> dict[str, Any]:
        info, race, step_fn = self.info, self.race, built.step
        losses: list[torch.Tensor] = []
        norms: list[torch.Tensor] = []
        curve: list[dict] = []
        windows: list[float] = []  # seconds per step of each check window after the first
        log_every = int(race.get("log_every", 10))
        eval_every = int(race.get("eval_every", 0))
        t_start = t_last = time.perf_counter()
        done_at_last = 0
        first_window_s, first_window_steps = None, 0
        digest = []  # of the run's first batch: the same tokens in the same order for every arm of a seed

        def next_batch():
            batch = built.loader.next_batch()
            if not digest:
                digest.append(hashlib.sha256(batch[0].numpy().tobytes()).hexdigest()[:16])
            return batch

        status, error = "finished", None
        val_loss = test_loss = None
        step = 0
        while step < run.steps:
            loss = step_fn.accumulate(next_batch)
            norms.append(step_fn.clip())
            step_fn.apply()
            losses.append(loss)
            step += 1
            last = step == run.steps
            evaluate = bool(eval_every) and step % eval_every == 0 and not last
            if step % check_every and not last and not evaluate:
                continue
            got = torch.stack(losses[done_at_last:]).float().cpu()  # waits for the device: the window's time
            got_norms = torch.stack(norms[done_at_last:]).float().cpu()
            now = time.perf_counter()
            n = step - done_at_last
            if first_window_s is None:
                first_window_s, first_window_steps = now - t_start, n  # the compiling (a first run), the warm-up
            else:
                windows.append((now - t_last) / n)
            for i, (lv, gv) in enumerate(zip(got.tolist(), got_norms.tolist())):
                s = done_at_last + i + 1
                if s % log_every == 0 or s == 1 or s == run.steps:
                    curve.append({"step": s, "tokens": s * spec.batch_tokens, "loss": lv, "grad_norm": gv})
            done_at_last = step
            if not (torch.isfinite(got).all() and torch.isfinite(got_norms).all()):
                bad = (
                    next(i for i, v in enumerate(got.tolist()) if not math.isfinite(v))
                    if not torch.isfinite(got).all()
                    else None
                )
                status = "diverged"
                error = f"a non-finite loss or gradient norm by step {step}" + (
                    f" (loss at step {step - n + 1 + bad})" if bad is not None else ""
                )
                break
            if evaluate:
                v = held_out_loss(
                    built.model,
                    spec.data,
                    "val",
                    spec.micro_batch,
                    spec.seq_len,
                    race["eval_batches"],
                    spec.dtype,
                    info,
                )
                curve.append({"step": step, "tokens": step * spec.batch_tokens, "val_loss": v})
            t_last = time.perf_counter()
            per_step = _median(windows) if windows else (first_window_s or 0) / max(1, step)
            if on_check is not None:
                on_check({"step": step, "steps": run.steps, "step_time": per_step})
            # the first window holds the compiling: the projection waits for a window of steps alone
            if (
                deadline is not None
                and windows
                and not last
                and time.time() + per_step * (run.steps - step) * 1.02 > deadline
            ):
                status = "cut"
                error = f"stopped at step {step} of {run.steps}: the rest would end past the loan's deadline"
                break
        if status == "finished":
            val_loss = held_out_loss(
                built.model, spec.data, "val", spec.micro_batch, spec.seq_len, race["eval_batches"], spec.dtype, info
            )
            if self.has_test(spec):  # the race's corpus always holds one; a small dataset may not
                test_loss = held_out_loss(
                    built.model,
                    spec.data,
                    "test",
                    spec.micro_batch,
                    spec.seq_len,
                    race["eval_batches"],
                    spec.dtype,
                    info,
                )
            curve.append(
                {"step": step, "tokens": step * spec.batch_tokens, "val_loss": val_loss, "test_loss": test_loss}
            )
        elif status == "diverged":
            val_loss = test_loss = math.inf
        synchronize(info.device)
        step_time = _median(windows) if windows else None
        out: dict[str, Any] = {
            "status": status,
            "steps_done": step,
            "val_loss": val_loss,
            "test_loss": test_loss,
            "step_time": step_time,
            "first_window_s": round(first_window_s, 3) if first_window_s is not None else None,
            "first_batch": digest[0] if digest else None,
            "curve": curve,
        }
        if error:
            out["error"] = error
        if step_time:
            tok_s = spec.batch_tokens / step_time
            out["tokens_per_s"] = round(tok_s)
            out["train_tflops"] = round(record["flops_per_token"] * tok_s / 1e12, 1)
            if info.device.type == "cuda":
                datasheet = peak_for_device_name(torch.cuda.get_device_name(info.device))
                if datasheet:
                    out["mfu_datasheet"] = round(record["flops_per_token"] * tok_s / datasheet, 4)
        if first_window_s is not None and step_time:
            # what the first window took beyond its steps: the compiling (on the arm's first run) and warm-up
            out["first_window_extra_s"] = round(max(0.0, first_window_s - step_time * first_window_steps), 2)
        return out


def _constraint(optimizer) -> str | None:
    """How the run's weight constraint runs after each step: "compiled", "eager", or None (GPT+ has none)."""
    hook = getattr(optimizer, "weight_constraint", None)
    return None if hook is None else ("compiled" if hook.compiled is not None else "eager")


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])
