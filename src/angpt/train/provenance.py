"""What a run directory records about where it came from: versions, git revision, seed, device, command."""

from __future__ import annotations

import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from angpt.invocation import command_argv
from angpt.train.dist import DistInfo


def git_revision(where: Path | None = None) -> str | None:
    """The commit of the source tree at `where` (default: this package's), with "+dirty" when tracked files differ.

    None outside a git checkout (an installed wheel) or without git. A run made from uncommitted code says so, so
    that its numbers are never attributed to a commit that did not produce them.
    """
    here = where or Path(__file__).resolve().parent
    run = {"cwd": here, "capture_output": True, "text": True, "timeout": 5}
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], **run)
        sha = head.stdout.strip()
        if head.returncode != 0 or not sha:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **run)
        return sha + "+dirty" if status.returncode == 0 and status.stdout.strip() else sha
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(run: Any, info: DistInfo) -> dict[str, Any]:
    """How a run (train/setup.py's ResolvedRun) was made: versions, commit, machine, dtype, command, and the content
    fingerprint of the tokens it read (its data identity), which a folder of the same name need not hold later."""
    import angpt
    from angpt.train.hardware import cpu_bf16_summary

    dev = torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else platform.processor() or "cpu"
    cpu = cpu_bf16_summary() if info.device.type == "cpu" else {}  # what decided `auto` on this CPU
    return {
        "angpt_version": angpt.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "git_revision": git_revision(),
        "seed": run.train.seed,
        "device": dev,
        "device_type": info.device.type,
        "world_size": info.world_size,
        "dist": run.dist if info.enabled else None,
        "dtype": run.train.dtype,
        **cpu,
        "threads": torch.get_num_threads(),
        "hostname": platform.node(),
        "command": command_argv(),
        "data_fingerprint": (run.data_identity or {}).get("data_fingerprint"),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
