"""The checkpoint format, which training writes and resumes from, and export and inference read: one directory
per saved step, written atomically, loaded without unpickling arbitrary objects.

    OUT/checkpoints/step_000100/
        model.safetensors      plain model weights (no compile/DDP/FSDP prefixes)
        trainer.pt             optimizer, scheduler and RNG states (tensors and plain containers only:
                               loaded with torch.load(weights_only=True))
        state.json             the run's state at that step (:class:`RunState`: step, tokens, data cursor, resolved
                               run config, model config, metrics, compute dtype, recipe, best validation loss, the
                               id of the run that wrote it) and the sha256 of every other file ("files")
        tokenizer.json, angpt_tokenizer.json   copied from the dataset, so the checkpoint stands alone

A checkpoint is written to a hidden temporary directory and renamed into place, so a crash or signal during a
save leaves either the previous set of checkpoints or the new one, never half of one (`clean_stale_tmp` removes
what a killed save leaves behind). Only finite state is written: a NaN or inf in any weight or floating optimizer
tensor refuses the save, so every checkpoint on disk is one training can go on from. Rotation (`keep_last`) only
removes checkpoints of the run that is saving, and never the one just written. Every load verifies the recorded
checksums (checkpoints written before checksums existed load unchecked) and refuses non-finite weights; every
problem is a one-line CheckpointError.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from angpt.errors import CheckpointError, ConfigError

MODEL_FILE = "model.safetensors"
TRAINER_FILE = "trainer.pt"
STATE_FILE = "state.json"
TOKENIZER_FILES = ("tokenizer.json", "angpt_tokenizer.json")
TRAINER_KEYS = ("optimizer", "scheduler", "rng")  # what a trainer.pt must hold to resume from it
RESUME_KEYS = ("step", "tokens", "data", "model_config")  # what state.json must hold to resume from it
_HASH_CHUNK = 8 << 20
_FINITE_CHUNK = 1 << 24  # elements per isfinite() call: bounds the temporary bool mask on a large tensor
_STEP_DIR = re.compile(r"step_(\d+)")
_LEFTOVER = re.compile(r"\.(tmp|old)_step_(\d+)_(\d+)")
# The trainer's best checkpoint is swapped in as checkpoints/.best_new_PID -> best, the old one moved aside to
# .best_old_PID; .best_new_PID.tmp_PID is the new one half-written (save_weights_checkpoint's hidden folder).
_BEST_LEFTOVER = re.compile(r"\.best_(new|old)_(\d+)(?:\.tmp_(\d+))?")
_HEX64 = re.compile(r"[0-9a-f]{64}")
# The type of each state.json key that some reader relies on (checked where present).
_STATE_TYPES: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "tokens": (int,),
    "data": (dict,),
    "model_config": (dict,),
    "run_config": (dict,),
    "metrics": (dict,),
    "files": (dict,),
    "run_id": (str,),
    "world_size": (int,),
    "compute_dtype": (str,),
    "resolved": (dict,),
    "run": (dict,),
}


@dataclass
class RunState:
    """What a checkpoint's state.json says about its run: what save writes and resume reads, typed.

    A training checkpoint has every field a resume needs (`data`, the loader's cursor, among them); a weights-only
    one (`angpt import-hf`, `angpt grow`, checkpoints/best) has a model config and little else. Keys this class
    does not name (``saved_at``, ``files``, ...) stay in `extra` and are written back as they were.
    """

    step: int
    model_config: dict[str, Any]
    tokens: int = 0
    data: dict[str, Any] | None = None  # the training loader's state: where the data stream stands
    # the run's record (train/record.py: ResolvedRun.to_dict() less its model, which is model_config), what a resume
    # compares and restarts from; a checkpoint written before 2026-11-29 keeps its pieces instead (run_config,
    # compute_dtype, recipe, resolved: in `extra`), which train/record.py turns into one record as it reads them
    run: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1
    data_identity: dict[str, Any] | None = None  # tokenizer hash and data fingerprint, checked on resume
    best_val_loss: float | None = None
    best_step: int | None = None
    run_id: str | None = None
    imported_from: str | None = None  # weights made elsewhere: a start for --init_from, not a run to resume
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> RunState:
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in state.items() if k in names}
        return cls(**{"step": 0, "model_config": {}, **known}, extra={k: v for k, v in state.items() if k not in names})

    @classmethod
    def read(cls, path: str | Path, require: Iterable[str] = ("step", "model_config")) -> RunState:
        """The state of checkpoint `path` (read_state's checks: a one-line CheckpointError for a bad file)."""
        return cls.from_dict(read_state(path, require))

    def to_dict(self) -> dict[str, Any]:
        """state.json's keys: a field left None is not written (read_state checks the type of what is there), but
        for the best validation loss and its step, which a run without one records as null."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out = {k: v for k, v in out.items() if v is not None or k in ("best_val_loss", "best_step")}
        return {**self.extra, **out}


def checkpoint_dir(out: str | Path) -> Path:
    return Path(out) / "checkpoints"


def list_checkpoints(out: str | Path) -> list[Path]:
    """Complete checkpoints under OUT (``step_<N>`` folders with a state.json), oldest (lowest step) first."""
    root = checkpoint_dir(out)
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step_*") if _STEP_DIR.fullmatch(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def new_run_id() -> str:
    """A fresh id for a run's checkpoints (record it once per run; a resumed run keeps its checkpoint's id)."""
    return uuid.uuid4().hex


# ------------------------------------------------------------------------------------------- finite checks
def find_non_finite(state: Any, prefix: str = "") -> str | None:
    """The dotted name of the first floating tensor holding a NaN or inf in a (nested) state, or None.

    Walks dicts, lists and tuples; integer and bool tensors (RNG states, step counters) and plain Python
    numbers are not checked. Large tensors are checked in chunks, so the check needs little extra memory.
    """
    if isinstance(state, torch.Tensor):
        return None if _all_finite(state) else (prefix or "<tensor>")
    if isinstance(state, dict):
        items: Iterable = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return None
    for key, value in items:
        bad = find_non_finite(value, f"{prefix}.{key}" if prefix else str(key))
        if bad is not None:
            return bad
    return None


def _all_finite(t: torch.Tensor) -> bool:
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0 or t.device.type == "meta":
        return True
    flat = t.detach().reshape(-1)
    return all(bool(torch.isfinite(flat[i : i + _FINITE_CHUNK]).all()) for i in range(0, flat.numel(), _FINITE_CHUNK))


def checkpoint_is_finite(path: str | Path) -> bool:
    """True when every weight and every floating trainer-state tensor of checkpoint `path` is finite.

    Reads the weights one tensor at a time; a missing or unreadable file is a CheckpointError.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path / MODEL_FILE), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has keys(), not __iter__)
                if not _all_finite(f.get_tensor(name)):
                    return False
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path / MODEL_FILE} is corrupt or unreadable ({_line(e)})") from e
    if (path / TRAINER_FILE).is_file():
        return find_non_finite(_torch_load(path / TRAINER_FILE, "cpu")) is None
    return True


def last_good_checkpoint(out: str | Path, run_id: str | None = None) -> Path | None:
    """The newest checkpoint under OUT (of run `run_id`, when given) whose files match their checksums and
    whose state is finite; None if there is none. For a NaN stop's message: it reads each candidate fully."""
    for path in reversed(list_checkpoints(out)):
        try:
            if run_id is not None and read_state(path, require=()).get("run_id") != run_id:
                continue
            verify_checkpoint(path)
            if checkpoint_is_finite(path):
                return path
        except CheckpointError:
            continue
    return None


# ---------------------------------------------------------------------------------------------------- save
def save_checkpoint(
    out: str | Path,
    step: int,
    model_state: dict[str, torch.Tensor],
    trainer_state: dict[str, Any],
    state: dict[str, Any],
    *,
    tokenizer_dir: str | Path | None = None,
    keep_last: int = 2,
    run_id: str | None = None,
) -> Path:
    """Write checkpoint `step` atomically, then keep only the newest `keep_last` of run `run_id`. Returns its path.

    Refuses (CheckpointError, nothing written) when a model tensor or a floating tensor of `trainer_state` is not
    finite. `run_id` is recorded in state.json; rotation deletes only ``step_*`` checkpoints whose state.json
    carries the same run_id (with run_id=None: only those without one), never an imported checkpoint, an
    unreadable one or the one just written. A full disk (or any other write error) removes the temporary folder,
    keeps the previous checkpoints and raises a one-line CheckpointError.
    """
    bad = find_non_finite(model_state)
    if bad is not None:
        raise CheckpointError(f"refusing to save checkpoint step {step}: model tensor {bad} is not finite (NaN or inf)")
    bad = find_non_finite(trainer_state)
    if bad is not None:
        raise CheckpointError(
            f"refusing to save checkpoint step {step}: trainer state tensor {bad} is not finite (NaN or inf)"
        )
    root = checkpoint_dir(out)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        record = {**state, "step": step, "saved_at": time.time()}
        if run_id is not None:
            record["run_id"] = run_id
        _write_files(tmp, model_state, trainer_state, record, tokenizer_dir)
        if final.exists():  # re-saving the same step (e.g. a signal right after a periodic save)
            old = root / f".old_step_{step:06d}_{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CheckpointError(
                f"disk full while saving checkpoint step {step} to {root} ({e.strerror or e}); the partial "
                "checkpoint was removed and the previous ones are kept: free space, then resume with --resume auto"
            ) from e
        raise CheckpointError(
            f"could not write checkpoint step {step} to {root} ({_line(e)}); the previous checkpoints are kept"
        ) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _rotate(out, keep_last, run_id, final)
    return final


def _write_files(
    folder: Path,
    model_state: dict[str, torch.Tensor],
    trainer_state: dict[str, Any] | None,
    state: dict[str, Any],
    tokenizer_dir: str | Path | None,
) -> None:
    """The files of one checkpoint in `folder` (trainer.pt only with a trainer state), each hashed into state.json's
    "files" as it is written, then every file fsynced."""
    files: dict[str, str] = {}
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model_state.items()}
    save_safetensors(tensors, folder / MODEL_FILE)
    del tensors
    files[MODEL_FILE] = file_sha256(folder / MODEL_FILE)  # the writer is native code: hash what it wrote
    if trainer_state is not None:
        with open(folder / TRAINER_FILE, "wb") as fh:
            writer = _HashingWriter(fh)
            torch.save(trainer_state, writer)  # type: ignore[arg-type]  # a file-like object with write()
        files[TRAINER_FILE] = writer.hexdigest()
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).is_file():
                files[name] = _copy_hashed(Path(tokenizer_dir) / name, folder / name)
    (folder / STATE_FILE).write_text(json.dumps({**state, "files": files}, indent=2), encoding="utf-8")
    for f in folder.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """safetensors' save_file (metadata "pt", which transformers requires), with the mode of every other file we
    write (the library's is 0600: an exported model another user of the machine cannot read), its write failures
    raised as OSError
    with their errno. The library raises its own SafetensorError, which is no OSError and names the errno only in its
    message ("I/O error: No space left on device (os error 28)"), so a full disk would otherwise escape the callers'
    handling of one."""
    import safetensors.torch
    from safetensors import SafetensorError

    try:
        safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as e:
        found = re.search(r"\(os error (\d+)\)", str(e))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from e
    os.chmod(path, 0o666 & ~_umask())  # safetensors writes 0600; every other file here gets the umask's mode


def _umask() -> int:
    """The process's umask (read by setting it, so set it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_weights_checkpoint(
    path: str | Path,
    model_state: dict[str, torch.Tensor],
    state: dict[str, Any],
    *,
    tokenizer_dir: str | Path | None = None,
) -> Path:
    """Write a weights-only checkpoint folder at `path` itself (no trainer state: a start for `--init_from PATH`,
    not a run to resume), atomically: built in a hidden folder beside it and renamed into place.

    `path` must not exist; non-finite weights, a full disk or any write error leave nothing behind (one-line
    CheckpointError). state.json gets `state` plus "step" 0, "saved_at" and the files' sha256.
    """
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise CheckpointError(f"{path} already exists; choose a new folder for the checkpoint")
    bad = find_non_finite(model_state)
    if bad is not None:
        raise CheckpointError(f"refusing to save {path}: model tensor {bad} is not finite (NaN or inf)")
    tmp = path.parent / f".{path.name}.tmp_{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        _write_files(tmp, model_state, None, {"step": 0, **state, "saved_at": time.time()}, tokenizer_dir)
        os.rename(tmp, path)
        _fsync_dir(path.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write checkpoint {path} ({_line(e)}); nothing was written") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _rotate(out: str | Path, keep_last: int, run_id: str | None, just_written: Path) -> None:
    """Delete all but the newest `keep_last` checkpoints of run `run_id` (see save_checkpoint)."""
    if keep_last <= 0:
        return
    mine = []
    for path in list_checkpoints(out):
        if path == just_written:
            mine.append(path)
            continue
        try:
            state = read_state(path, require=())
        except CheckpointError:
            continue  # never delete what cannot be identified
        if state.get("run_id") == run_id and "imported_from" not in state:
            mine.append(path)
    keep = set(mine[-keep_last:]) | {just_written}
    for path in mine:
        if path not in keep:
            shutil.rmtree(path, ignore_errors=True)


def clean_stale_tmp(out: str | Path) -> list[Path]:
    """Remove what a killed save left in OUT/checkpoints; returns the removed folders.

    ``.tmp_step_*`` folders (half-written checkpoints) are removed. A ``.old_step_N_*`` folder (the previous
    step_N, moved aside while the same step was re-saved) is renamed back to ``step_N`` when the kill came before
    the new one was in place, and removed otherwise. Folders of a process that is still alive (other than this
    one) are left alone: it may be saving right now.
    """
    root = checkpoint_dir(out)
    if not root.is_dir():
        return []
    removed = []
    for path in sorted(root.iterdir()):
        m = _LEFTOVER.fullmatch(path.name)
        if m is None or not path.is_dir():
            continue
        if _saving(int(m[3])):
            continue
        final = root / f"step_{m[2]}"
        if m[1] == "old" and not final.exists() and (path / STATE_FILE).is_file():
            os.replace(path, final)
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed + _clean_best(root)


def _clean_best(root: Path) -> list[Path]:
    """What a kill during the best checkpoint's swap left (train/loop.py's _save_best): with no ``best`` in place, a
    complete ``.best_new_PID`` (it exists only once fully written) becomes it, else the ``.best_old_PID`` it was to
    replace comes back; every other leftover of a process no longer alive is removed. Returns the removed ones."""
    found = [(m, p) for p in sorted(root.iterdir()) if (m := _BEST_LEFTOVER.fullmatch(p.name)) and p.is_dir()]
    found = [(m, p) for m, p in found if not _saving(int(m[2]))]
    best = root / "best"
    for kind in ("new", "old"):
        for m, p in found:
            if not best.exists() and m[1] == kind and m[3] is None and (p / STATE_FILE).is_file():
                os.replace(p, best)
    removed = [p for _, p in found if p.exists()]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def _saving(pid: int) -> bool:
    """Whether process `pid`, another one than this, is alive and may be saving right now."""
    return pid != os.getpid() and _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError, ValueError):
        return False
    return True


class _HashingWriter:
    """A write-only file wrapper that computes the sha256 of what passes through it."""

    def __init__(self, fh) -> None:
        self._fh, self._hash = fh, hashlib.sha256()

    def write(self, data) -> int:
        self._hash.update(data)
        return self._fh.write(data)

    def flush(self) -> None:
        self._fh.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _copy_hashed(src: Path, dst: Path) -> str:
    h = hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(_HASH_CHUNK):
            h.update(chunk)
            fout.write(chunk)
    shutil.copystat(src, dst)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not possible on every platform / file system
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file, read in 8 MiB chunks (about 1 s per GB)."""
    h = hashlib.sha256()
    buf = bytearray(_HASH_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- resume / read
def resolve_resume(out: str | Path | None, resume: str | None) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from and its state.json (read once): None, "auto" (the latest in OUT, if any) or an
    explicit path (a run directory: its latest checkpoint).

    The chosen checkpoint must be resumable (complete, with trainer state and a data cursor); a weights-only
    checkpoint (e.g. from `angpt import-hf`) is a CheckpointError that says to use --init_from instead.
    """
    if resume is None or resume == "" or resume is False:
        return None
    if resume == "auto":
        found = list_checkpoints(out) if out else []
        if not found:
            return None
        path = found[-1]
    else:
        path = Path(resume)
        if path.is_dir() and not (path / STATE_FILE).is_file() and list_checkpoints(path):
            path = list_checkpoints(path)[-1]  # a run directory: take its latest checkpoint
    return path, validate_checkpoint(path)


def read_weights_start(path: str | Path) -> tuple[RunState, Any]:
    """(state, ModelConfig) of a checkpoint a new run starts from (--init_from: weights only are enough), read
    once; a one-line CheckpointError for an incomplete or invalid one."""
    state = validate_checkpoint(path, need_trainer=False)
    return RunState.from_dict(state), _model_config(state, Path(path))


def validate_checkpoint(path: str | Path, need_trainer: bool = True) -> dict[str, Any]:
    """The state.json of checkpoint `path`, read once; CheckpointError unless `path` is a complete checkpoint
    directory with a well-formed state.json.

    With `need_trainer`, it must also be resumable: trainer.pt present, state.json with step, tokens, data cursor
    and model config. Checksums are not computed here (the load functions verify them).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist{_available(path.parent)}")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is not a directory")
    if not (path / STATE_FILE).is_file() and checkpoint_dir(path).is_dir():
        raise CheckpointError(f"{path} is a run folder, not a checkpoint{_available(path)}")
    missing = [n for n in (STATE_FILE, MODEL_FILE) if not (path / n).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")
    state = read_state(path, require=("step", "model_config"))
    listed = [n for n in state.get("files", {}) if not (path / n).is_file()]
    if listed:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(listed)} (listed in {STATE_FILE})")
    if not need_trainer:
        return state
    if "imported_from" in state or not (path / TRAINER_FILE).is_file():
        raise CheckpointError(_weights_only(path))
    missing_keys = [k for k in RESUME_KEYS if k not in state]
    if missing_keys:
        f = path / STATE_FILE
        raise CheckpointError(f"{f} has no {missing_keys[0]!r} key; the checkpoint is damaged or not from angpt")
    return state


def _available(folder: Path, shown: int = 5) -> str:
    """``; RUN/checkpoints holds step_000004, step_000005, best`` (the newest `shown` steps, then best) when `folder`
    is a run folder or its checkpoints/ folder, so that a mistyped checkpoint path is followed by the real ones;
    "" for any other folder."""
    run = folder.parent if folder.name == "checkpoints" else folder
    root = checkpoint_dir(run)
    if not root.is_dir():
        return ""
    names = [p.name for p in list_checkpoints(run)]
    older = len(names) - shown
    names = names[-shown:] + (["best"] if (root / "best" / STATE_FILE).is_file() else [])
    if not names:
        return f"; {root} holds no complete checkpoint"
    return f"; {root} holds " + (f"{older} older and " if older > 0 else "") + ", ".join(names)


def _weights_only(path: Path) -> str:
    return (
        f"checkpoint {path} holds weights only, no optimizer state or data position (e.g. made by "
        f"`angpt import-hf` or `angpt grow`), so it cannot be resumed: start a new run from it with --init_from {path}"
    )


def read_state(path: str | Path, require: Iterable[str] = ("step", "model_config")) -> dict[str, Any]:
    """state.json of checkpoint `path`, checked: a JSON object holding the `require`d keys, each known key with
    the right type, "files" mapping plain file names to sha256 digests. Any problem is a one-line CheckpointError
    naming the file and the key."""
    f = Path(path) / STATE_FILE
    try:
        text = f.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise CheckpointError(f"{f} does not exist; not a checkpoint folder") from e
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{f} is unreadable ({_line(e)})") from e
    try:
        state = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{f} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); the checkpoint's state is damaged"
        ) from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{f} is not a JSON object (it holds a {type(state).__name__}); not an angpt checkpoint")
    for key in require:
        if key not in state:
            raise CheckpointError(f"{f} has no {key!r} key; the checkpoint is damaged or not from angpt")
    for key, types in _STATE_TYPES.items():
        if key not in state:
            continue
        value = state[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise CheckpointError(f"{f}: {key!r} is {_short(value)}, expected a {types[0].__name__}")
        if types == (int,) and value < 0:
            raise CheckpointError(f"{f}: {key!r} is {value}, expected a non-negative integer")
    for name, digest in state.get("files", {}).items():
        if not _plain_name(name) or not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise CheckpointError(f"{f}: 'files' entry {_short(name)}: {_short(digest)} is not a file name: sha256")
    return state


def read_model_config(path: str | Path):
    """The ModelConfig recorded in checkpoint `path`'s state.json (one-line CheckpointError when it is invalid)."""
    return _model_config(read_state(path), Path(path))


def _model_config(state: dict[str, Any], path: Path):
    from angpt.models import ModelConfig

    try:
        return ModelConfig.from_dict(state["model_config"])
    except (ConfigError, TypeError, ValueError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{path / STATE_FILE}: 'model_config' is invalid ({_line(e)})") from e


def verify_checkpoint(
    path: str | Path, names: Iterable[str] | None = None, state: dict[str, Any] | None = None
) -> None:
    """CheckpointError unless the files of checkpoint `path` match the sha256 recorded in state.json.

    `names` limits the check to those files (each must then have a recorded checksum); None checks every recorded
    file. A checkpoint without "files" in its state.json (written before checksums existed) passes unchecked.
    `state`: its state.json as read already (else it is read here).
    """
    path = Path(path)
    files = (state if state is not None else read_state(path, require=())).get("files")
    if files is None:
        return
    if names is None:
        names = list(files)
    for name in names:
        if name not in files:
            raise CheckpointError(f"checkpoint {path}: {STATE_FILE} records no checksum for {name}")
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path}: {name} is missing (listed in {STATE_FILE})")
        try:
            digest = file_sha256(path / name)
        except OSError as e:
            raise CheckpointError(f"checkpoint {path}: {name} is unreadable ({_line(e)})") from e
        if digest != files[name]:
            raise CheckpointError(
                f"checkpoint {path}: {name} does not match its checksum (corrupted or modified); "
                "restore it or use another checkpoint"
            )


def load_model_state(path: str | Path, state: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """The weights of checkpoint `path`, after verifying their checksum (against `state`, its state.json as read
    already, or read here); non-finite weights are refused."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    verify_checkpoint(path, [MODEL_FILE], state)
    try:
        sd = load_file(str(path / MODEL_FILE))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path / MODEL_FILE} is corrupt or unreadable ({_line(e)})") from e
    bad = find_non_finite(sd)
    if bad is not None:
        raise CheckpointError(
            f"checkpoint {path}: weight {bad} is not finite (NaN or inf); the checkpoint is unusable, use an "
            "earlier one"
        )
    return sd


def load_trainer_state(
    path: str | Path, map_location: str | torch.device = "cpu", state: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Optimizer, scheduler and RNG states of checkpoint `path`, after verifying the checksum of trainer.pt (against
    `state`, its state.json as read already, or read here)."""
    path = Path(path)
    verify_checkpoint(path, [TRAINER_FILE], state)
    trainer = _torch_load(path / TRAINER_FILE, map_location)
    if not isinstance(trainer, dict) or not all(k in trainer for k in TRAINER_KEYS):
        raise CheckpointError(_weights_only(path))
    return trainer


def _torch_load(file: Path, map_location: str | torch.device) -> Any:
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises many types for a bad file; all mean the same to the user
        raise CheckpointError(f"{file} is corrupt or unreadable ({type(e).__name__})") from e


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


def run_checkpoint(path: str | Path) -> Path:
    """The checkpoint a path names: a checkpoint directory itself; a run directory its best checkpoint (lowest
    validation loss, `checkpoints/best`) where it has one, else its latest. What generate, export, eval and grow
    read, and what their --help says."""
    path = Path(path)
    if not path.is_dir() or (path / STATE_FILE).is_file():
        return path
    best = checkpoint_dir(path) / "best"
    if (best / STATE_FILE).is_file():
        return best
    return list_checkpoints(path)[-1] if list_checkpoints(path) else path


def load_checkpoint_model(path: str | Path, device: str | torch.device = "cpu"):
    """(model, tokenizer or None) from a checkpoint directory (or a run directory: `run_checkpoint`).

    The model is built from the model config stored in state.json and put in eval mode. The weights and the
    tokenizer files are verified against their recorded checksums and the weights must be finite.
    """
    from angpt.models import model_from_config

    path = run_checkpoint(path)
    state = validate_checkpoint(path, need_trainer=False)
    cfg = _model_config(state, path)
    # trainer.pt is not needed here (and is twice the weights' size): check the tokenizer files, then the weights.
    verify_checkpoint(path, [n for n in state.get("files", {}) if n not in (MODEL_FILE, TRAINER_FILE)], state)
    try:
        model = model_from_config(cfg)
    except (ConfigError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path / STATE_FILE}: 'model_config' is invalid ({_line(e)})") from e
    load_into(model, load_model_state(path, state), str(path))
    tokenizer = None
    if (path / "tokenizer.json").is_file() or (path / "angpt_tokenizer.json").is_file():
        from angpt.data import load_tokenizer

        tokenizer = load_tokenizer(path)
    return model.to(device).eval(), tokenizer


def _plain_name(name: Any) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _short(value: Any, n: int = 40) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
    return _line(text if len(text) <= n else text[: n - 3] + "...")


def _line(e: BaseException | str) -> str:
    return " ".join(str(e).split())
