"""How a run starts, decided once: fresh, resume, or from other weights (init_from).

As nanoGPT reads one `init_from` string and torchtitan's checkpointer decides in one place, :func:`decide` reads the
run folder once and says how the run starts, with the model it builds, the dtype it computes in, the optimizer
recipe it takes and the id its checkpoints carry:

- **resume**: ``--resume auto`` (the folder's newest checkpoint) or ``--resume PATH``. The checkpoint's state is
  read once; the run's settings are checked against it (train/resume.py: a changed rate, batch, dtype, model or
  data refuses in one line), and the run keeps its dtype, its recipe record and its id.
- **init_from**: ``--init_from PATH``, weights from elsewhere (an import, a grown model) at step 0. The model is the
  checkpoint's; weights trained with another tokenizer are refused unless ``train.init_any_tokenizer``.
- **fresh**: anything else. A folder that already holds a run is refused (resume it, or choose a new --out), unless
  the caller asks to restart one that crashed before its first checkpoint (`restart_unsaved`: a study re-running a
  run it owns).

A resume takes the run's stored settings (its folder's config.json): flags given explicitly override them and are
checked like any other change, so ``angpt train --out runs/x --resume auto`` continues the run as it was started
(:func:`resumed_settings`).

``--resume`` together with ``--init_from`` continues a run only if it started from those same weights (the same
command again, with --resume auto); otherwise it is refused in one line, as litgpt refuses resuming and an initial
checkpoint together: the model would come from one and the weights from the other. The dry run makes the same
decision without touching the folder (`clean=False`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from angpt import checkpoint as ckpt
from angpt.checkpoint import RunState
from angpt.errors import ConfigError, UserError
from angpt.models import ModelConfig
from angpt.train.config import RunConfig, resolve_model_config, stored_settings
from angpt.train.resume import check_resume, recipe_used
from angpt.train.step import resolve_dtype

FRESH, RESUME, INIT_FROM = "fresh", "resume", "init_from"


@dataclass
class Start:
    """How a run starts (see the module docstring)."""

    mode: str  # FRESH | RESUME | INIT_FROM
    model: ModelConfig
    model_from: str  # where the model config comes from, in words (the dry run says it)
    dtype: str  # the compute dtype, resolved ("bf16" or "fp32"): a resumed run keeps its own
    recipe: dict[str, Any]  # the optimizer recipe's values the run takes (a resumed run keeps its record)
    run_id: str  # the id its checkpoints carry (rotation deletes only its own)
    checkpoint: Path | None = None  # RESUME: the checkpoint; INIT_FROM: the weights
    state: RunState | None = None  # RESUME, INIT_FROM: the checkpoint's state, read once
    notes: list[str] = field(default_factory=list)  # what resuming changes (a longer max_steps, say)


def resumed_settings(out: str | Path | None, resume: str | None) -> list[tuple[str, Any]] | None:
    """The settings a resume starts from: the run's own, as its folder's config.json recorded them when it last
    started (less what belongs to one invocation: --resume and train.stop_at; a run started --init_from keeps it, its
    model came from there). None when there is nothing to resume from (no --resume, no --out, or a folder without a
    run yet)."""
    if resume is None or out is None:
        return None
    path = Path(out) / "config.json"
    if not path.is_file():
        return None
    try:
        run = json.loads(path.read_text())["run"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a run's config.json ({type(e).__name__}); resume with --config RECIPE") from e
    return stored_settings(run)


def resumed_dtype(requested: str, state: RunState | None, device: torch.device) -> str:
    """The compute dtype a run uses on `device`: with `auto`, the one a resumed run has computed in (its state's
    `compute_dtype`), so that a run keeps its dtype wherever it resumes; otherwise what `requested` resolves to."""
    recorded = state.compute_dtype if state is not None else None
    if requested == "auto" and recorded in ("bf16", "fp32"):
        return recorded
    return resolve_dtype(requested, device)


def model_config(cfg: RunConfig, meta: dict | None, init_model: ModelConfig | None = None) -> tuple[ModelConfig, str]:
    """The model a run of `cfg` builds, and where its config comes from: the checkpoint's for init_from (its
    `init_model`, read once), else the preset plus overrides with the dataset's vocabulary (`meta`, None when the
    data is not prepared yet)."""
    if cfg.init_from is not None:
        mcfg = init_model if init_model is not None else ckpt.read_weights_start(cfg.init_from)[1]
        if mcfg.arch != cfg.arch:
            raise ConfigError(f"--train.init_from holds a {mcfg.arch} model; pass --arch {mcfg.arch}")
        return mcfg, f"checkpoint {cfg.init_from}"
    mcfg = resolve_model_config(cfg, meta)
    if "vocab_size" in cfg.model:
        return mcfg, "model.vocab_size"
    if meta is not None:
        return mcfg, f"{cfg.data}/meta.json ({meta['vocab_size']} tokens, padded to a multiple of 64)"
    if not cfg.data:
        why = "no data folder given"
    else:
        why = f"{cfg.data} is not prepared yet" if Path(cfg.data).is_dir() else f"{cfg.data} does not exist"
    return mcfg, f"the preset ({why})"


def decide(
    cfg: RunConfig,
    meta: dict | None,
    device: torch.device,
    data_identity: dict[str, Any] | None = None,
    *,
    clean: bool = True,
    restart_unsaved: bool = False,
    report: bool = True,
) -> Start:
    """How the run of `cfg` starts (see the module docstring); a one-line UserError where it cannot.

    `meta` is the dataset's meta.json, `data_identity` its fingerprint (a resume checks it), `device` where the run
    computes (its `auto` dtype). `clean` removes what a killed save left in the folder first (the trainer's rank 0);
    the dry run passes False and reads only. `report` prints where a resume continues from (the trainer passes False
    and says it once the checkpoint is restored: `resuming`).
    """
    out = Path(cfg.out) if cfg.out is not None else None
    if clean and out is not None and out.is_dir():  # a killed save may have left step_N aside: restore it first
        for p in ckpt.clean_stale_tmp(out):
            print(f"removed {p}, left by an interrupted save", file=sys.stderr)
    found = ckpt.resolve_resume(out, cfg.resume)  # the checkpoint and its state.json, read once
    if cfg.resume and cfg.init_from and found is not None:
        _check_same_start(cfg, found[1].get("run_config") or {})
    init_state, init_model = ckpt.read_weights_start(cfg.init_from) if cfg.init_from is not None else (None, None)
    mcfg, model_from = model_config(cfg, meta, init_model)
    state = RunState.from_dict(found[1]) if found is not None else init_state
    dtype = resumed_dtype(cfg.train.dtype, state if found is not None else None, device)
    recipe = (state.recipe if found is not None and state.recipe else None) or recipe_used(
        cfg.arch, cfg.preset, cfg.train
    )
    if found is not None:
        resume_from = found[0]
        notes = check_resume(resume_from, state, cfg, mcfg, data_identity, dtype)
        run_id = state.run_id or ckpt.new_run_id()
        decided = Start(RESUME, mcfg, model_from, dtype, recipe, run_id, resume_from, state, notes)
        if report:
            resuming(decided)
        return decided
    if out is not None and (out / "metrics.jsonl").exists() and not restart_unsaved:
        found_ckpts = ckpt.list_checkpoints(out)
        if found_ckpts:  # not resuming because --resume was not given, not because there is nothing to resume
            raise UserError(
                f"{out} already holds a run (latest checkpoint {found_ckpts[-1].name}); "
                "pass --resume auto to continue it, or choose a new --out"
            )
        raise UserError(
            f"{out} already holds a run (metrics.jsonl) but no checkpoint to continue from; "
            "choose a new --out, or delete that folder to start over"
        )
    if cfg.init_from is not None:
        _check_tokenizer(cfg, data_identity)
        return Start(INIT_FROM, mcfg, model_from, dtype, recipe, ckpt.new_run_id(), Path(cfg.init_from), state)
    return Start(FRESH, mcfg, model_from, dtype, recipe, ckpt.new_run_id())


def resuming(decided: Start) -> None:
    """Say where a resume continues from, and what resuming changes (on stderr)."""
    print(f"resuming from step {decided.state.step} ({decided.checkpoint})", file=sys.stderr)
    for note in decided.notes:
        print(f"  {note}", file=sys.stderr)


def _check_same_start(cfg: RunConfig, recorded: dict[str, Any]) -> None:
    """--resume with --init_from continues the run only when the run started from those same weights (the same
    command run again with --resume auto); otherwise the model would come from one and the weights from the other,
    and it is refused in one line, as litgpt refuses a resume with an initial checkpoint."""
    started = recorded.get("init_from")
    if started is not None and Path(started).resolve() == Path(cfg.init_from).resolve():
        return
    origin = f"started from {started}" if started else "started fresh"
    raise UserError(
        f"--resume {cfg.resume} continues the run in {cfg.out}, which {origin}; --init_from {cfg.init_from} would "
        "start another from other weights: give one (or a new --out)"
    )


def _check_tokenizer(cfg: RunConfig, data_identity: dict[str, Any] | None) -> None:
    """--init_from's weights were trained with some tokenizer: refuse other data unless told to."""
    from angpt.data.format import tokenizer_hash

    folder = Path(cfg.init_from)
    recorded = tokenizer_hash(folder)  # the checkpoint carries a copy of its dataset's tokenizer
    now = (data_identity or {}).get("tokenizer_hash")
    if recorded is None or now is None or recorded == now or cfg.train.init_any_tokenizer:
        return
    raise UserError(
        f"--init_from {folder} was trained with another tokenizer than {cfg.data}'s: its token ids would "
        "mean other text; prepare the data with that tokenizer, or pass --train.init_any_tokenizer true"
    )
