"""Checkpoints: one directory per saved step, written atomically, loaded without unpickling arbitrary objects.

    OUT/checkpoints/step_000100/
        model.safetensors      plain model weights (no compile/DDP/FSDP prefixes)
        trainer.pt             optimizer, scheduler and RNG states (tensors and plain containers only:
                               loaded with torch.load(weights_only=True))
        state.json             step, data cursor, resolved run config, model config, metrics at save time
        tokenizer.json, angpt_tokenizer.json   copied from the dataset, so the checkpoint stands alone

A checkpoint is written to a hidden temporary directory and renamed into place, so a crash or signal during a
save leaves either the previous set of checkpoints or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from angpt.errors import CheckpointError

MODEL_FILE = "model.safetensors"
TRAINER_FILE = "trainer.pt"
STATE_FILE = "state.json"
TOKENIZER_FILES = ("tokenizer.json", "angpt_tokenizer.json")


def checkpoint_dir(out: str | Path) -> Path:
    return Path(out) / "checkpoints"


def list_checkpoints(out: str | Path) -> list[Path]:
    """Complete checkpoints under OUT, oldest first."""
    root = checkpoint_dir(out)
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step_*") if p.is_dir() and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def save_checkpoint(
    out: str | Path,
    step: int,
    model_state: dict[str, torch.Tensor],
    trainer_state: dict[str, Any],
    state: dict[str, Any],
    *,
    tokenizer_dir: str | Path | None = None,
    keep_last: int = 2,
) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep_last`. Returns its directory."""
    from safetensors.torch import save_file

    root = checkpoint_dir(out)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model_state.items()}
        save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": "pt"})
        torch.save(trainer_state, tmp / TRAINER_FILE)
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step, "saved_at": time.time()}, indent=2))
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copy2(Path(tokenizer_dir) / name, tmp / name)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():  # re-saving the same step (e.g. a signal right after a periodic save)
            old = root / f".old_step_{step:06d}_{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(out)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_resume(out: str | Path | None, resume: str | None) -> Path | None:
    """The checkpoint directory to resume from: None, "auto" (latest in OUT, if any) or an explicit path."""
    if resume is None or resume == "" or resume is False:
        return None
    if resume == "auto":
        found = list_checkpoints(out) if out else []
        return found[-1] if found else None
    path = Path(resume)
    if path.is_dir() and not (path / STATE_FILE).is_file() and list_checkpoints(path):
        path = list_checkpoints(path)[-1]  # a run directory: take its latest checkpoint
    validate_checkpoint(path)
    return path


def validate_checkpoint(path: str | Path, need_trainer: bool = True) -> None:
    """CheckpointError unless `path` is a complete checkpoint directory."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is not a directory")
    needed = [STATE_FILE, MODEL_FILE] + ([TRAINER_FILE] if need_trainer else [])
    missing = [n for n in needed if not (path / n).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")


def read_state(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads((Path(path) / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{Path(path) / STATE_FILE} is unreadable ({e})") from e


def load_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(Path(path) / MODEL_FILE))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{Path(path) / MODEL_FILE} is corrupt or unreadable ({e})") from e


def load_trainer_state(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    try:
        return torch.load(Path(path) / TRAINER_FILE, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises many types for a bad file; all mean the same to the user
        raise CheckpointError(f"{Path(path) / TRAINER_FILE} is corrupt or unreadable ({type(e).__name__})") from e


def load_into(model: torch.nn.Module, sd: dict[str, torch.Tensor], where: str) -> None:
    """Load a state dict, with a one-line error naming the first mismatched tensor."""
    check_fits(model, sd, where)
    model.load_state_dict(sd)


def check_fits(model: torch.nn.Module, sd: dict[str, torch.Tensor], where: str) -> None:
    """CheckpointError unless `sd` has exactly the model's tensors with the model's (full) shapes."""
    own = {k: v.shape for k, v in model.state_dict().items()}
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    if missing or unexpected:
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise CheckpointError(
            f"{where} does not fit this model ({what}; {len(missing)} missing, {len(unexpected)} extra)"
        )
    for k, v in sd.items():
        if own[k] != v.shape:
            raise CheckpointError(f"{where}: tensor {k} has shape {tuple(v.shape)}, the model expects {tuple(own[k])}")


def load_checkpoint_model(path: str | Path, device: str | torch.device = "cpu"):
    """(model, tokenizer or None) from a checkpoint directory (or a run directory: its latest checkpoint).

    The model is built from the model config stored in state.json and put in eval mode.
    """
    from angpt.models import ModelConfig, model_from_config

    path = Path(path)
    if path.is_dir() and not (path / STATE_FILE).is_file() and list_checkpoints(path):
        path = list_checkpoints(path)[-1]
    validate_checkpoint(path, need_trainer=False)
    state = read_state(path)
    if "model_config" not in state:
        raise CheckpointError(f"{path / STATE_FILE} has no model_config; not an angpt checkpoint")
    cfg = ModelConfig.from_dict(state["model_config"])
    model = model_from_config(cfg)
    load_into(model, load_model_state(path), str(path))
    tokenizer = None
    if (path / "tokenizer.json").is_file() or (path / "angpt_tokenizer.json").is_file():
        from angpt.data import load_tokenizer

        tokenizer = load_tokenizer(path)
    return model.to(device).eval(), tokenizer
