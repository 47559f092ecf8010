"""A folder claimed by one process at a time: FOLDER/.lock holds the owner's pid and host.

A lock whose process is gone (a crash, a killed job) on this host is stale: it is taken over, and said so.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from angpt.errors import UserError


class DirLock:
    """`with DirLock(folder, "angpt train"):` claims `folder` (created if missing) for the block."""

    def __init__(self, folder: str | Path, what: str) -> None:
        self.path = Path(folder) / ".lock"
        self.what = what
        self.held = False
        self.created = False

    def __enter__(self) -> DirLock:
        self.created = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = f"{os.getpid()} {socket.gethostname()}"
        for _ in range(2):
            # The owner is written before the lock appears (hard link: atomic and exclusive), so a reader never
            # sees an empty lock and takes it for a stale one.
            tmp = self.path.with_name(f".lock.{os.getpid()}")
            tmp.write_text(me)
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pid, host = _owner(self.path)
                if pid and (host != socket.gethostname() or (pid != os.getpid() and alive(pid))):
                    where = f"pid {pid}" + (f" on {host}" if host != socket.gethostname() else "")
                    raise UserError(
                        f"another {self.what} ({where}) holds {self.path.parent}; wait for it, stop it, or choose "
                        f"another folder (remove {self.path} only if that process is gone)"
                    ) from None
                if pid:
                    print(
                        f"warning: took over a stale lock of pid {pid} (no longer running) in {self.path}",
                        file=sys.stderr,
                    )
                self.path.unlink(missing_ok=True)
                continue
            finally:
                tmp.unlink(missing_ok=True)
            self.held = True
            return self
        raise UserError(f"cannot take the lock {self.path}; remove it if no {self.what} is running there")

    def __exit__(self, *exc) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
            if self.created and not any(self.path.parent.iterdir()):  # a start that failed leaves no empty folder
                self.path.parent.rmdir()


def _owner(path: Path) -> tuple[int, str]:
    try:
        pid, _, host = path.read_text().strip().partition(" ")
        return int(pid or 0), host or socket.gethostname()
    except (OSError, ValueError):
        return 0, socket.gethostname()


def alive(pid: int) -> bool:
    """Whether process `pid` exists on this host."""
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
