"""SIGINT/SIGTERM during training: remember the signal; the loop saves at the end of the step and stops."""

from __future__ import annotations

import signal
import threading
from typing import Any


class StopSignals:
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
    return threading.current_thread() is threading.main_thread()
