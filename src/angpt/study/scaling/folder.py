"""A scaling folder: it holds a ladder (scaling.json, sizes/, lr_check/), a batch-size study (batch.json, batch/), or
both, and the scaling report over them. What may sit there, and whether it holds a given study."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from angpt.study.batch.plan import BATCH_FILE
from angpt.study.ladder.plan import LADDER_FILE
from angpt.study.store import read_study_file, refusal

# What may sit in OUT beside a study's file: the other study, the report, the lock (OUT holds a ladder, a
# batch-size study, or both).
_KNOWN = {".lock", LADDER_FILE, BATCH_FILE, "sizes", "lr_check", "batch", "report.md", "report.json"}


def stored_study(out: Path, study_file: str) -> dict[str, Any] | None:
    """The identity of the study `out` holds in `study_file` (None while it holds none); UserError unless `out` is
    new, empty, or a scaling directory."""
    stored = read_study_file(
        out,
        study_file,
        belongs=lambda p: p.name in _KNOWN or p.name.endswith(".png"),
        not_ours="an angpt scaling directory",
    )
    return None if stored is None else {k: v for k, v in stored.items() if k not in ("data", "device")}


def check_study_dir(out: Path, study_file: str, identity: dict[str, Any], what: str) -> bool:
    """UserError unless `out` is new, empty, a scaling directory without this study, or one with this same study.

    True when `out` already holds it (a re-run resumes)."""
    theirs = stored_study(out, study_file)
    if theirs is None:
        return False
    if theirs != identity:
        raise refusal(out, what, theirs, identity, "use another --out, or repeat that study's options")
    return True
