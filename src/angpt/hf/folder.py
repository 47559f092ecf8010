"""The folder an export goes into: checked before anything is loaded (no torch, no transformers, so a refusal comes
at once), and filled without losing what was there (a previous export replaced file by file, other files left)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from angpt.errors import UserError

MARKER = "angpt_export.json"
MODELING_FILE = "modeling_angpt.py"
WEIGHTS_FILE = "model.safetensors"
# Every file an export may write: what a previous export is taken to own when its marker lists no "files".
EXPORT_FILES = (
    "config.json",
    WEIGHTS_FILE,
    "generation_config.json",
    MARKER,
    MODELING_FILE,
    "modeling_tokenformer.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "angpt_tokenizer.json",
)


def check_target(out_dir: str | Path, overwrite: bool = False) -> None:
    """UserError unless `out_dir` can take an export: missing, empty, or a previous export when `overwrite`.

    A folder that is not an export is refused even with `overwrite`: its files are not ours to replace."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"export target {out} is a file; pass a folder path")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / MARKER).is_file():
        raise UserError(
            f"export target {out} is not empty and is not a previous angpt export (no {MARKER}); "
            "choose a new or empty folder"
        )
    if not overwrite:
        raise UserError(
            f"export target {out} holds a previous export; pass --overwrite to replace it (files you added stay) "
            "or choose a new folder"
        )


def move_into_place(tmp: Path, out: Path) -> None:
    """Put the export built in `tmp` at `out`: a rename when `out` is missing or empty, else file by file.

    Over a previous export, the files it owns (its marker's "files", or :data:`EXPORT_FILES` for older markers)
    and any file of the new export already in `out` are moved to a backup folder beside `out`, the new files are
    moved in with the marker last, and the backup is deleted. On a failure the moves are undone. Other files in
    `out` stay where they are.
    """
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.replace(tmp, out)
        return
    new = sorted((p.name for p in tmp.iterdir()), key=lambda n: (n == MARKER, n))  # the marker moves in last
    owned = set(_previous_files(out)) | set(new)
    aside = sorted((n for n in owned if (out / n).exists() or (out / n).is_symlink()), key=lambda n: (n != MARKER, n))
    backup = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    backup.mkdir()
    moved_aside: list[str] = []
    moved_in: list[str] = []
    try:
        for name in aside:  # the old marker first: a half-replaced folder is never taken for a complete export
            os.replace(out / name, backup / name)
            moved_aside.append(name)
        for name in new:
            os.replace(tmp / name, out / name)
            moved_in.append(name)
    except BaseException:
        for src, dst, names in ((out, tmp, moved_in), (backup, out, moved_aside)):
            for name in reversed(names):
                try:
                    os.replace(src / name, dst / name)
                except OSError:
                    pass
        if not any(backup.iterdir()):
            shutil.rmtree(backup, ignore_errors=True)
        raise
    shutil.rmtree(backup, ignore_errors=True)


def _previous_files(out: Path) -> list[str]:
    """The files the previous export in `out` wrote, as its marker lists them (plain names only)."""
    try:
        listed = json.loads((out / MARKER).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    if not isinstance(listed, list):
        return list(EXPORT_FILES)
    return [n for n in listed if isinstance(n, str) and n not in ("", ".", "..") and "/" not in n and "\\" not in n]
