"""SIGINT/SIGTERM during training: the first is remembered (the loop saves at the end of the step and stops), a
second Ctrl-C stops at once without saving."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any


class StopSignals:
    """The first SIGINT or SIGTERM sets a flag; the loop saves a checkpoint at the end of the current step and exits.

    A step can take a minute (`gpt2-small` on a CPU), so the handler says at once what will happen (rank 0:
    `announce`). A second SIGINT raises KeyboardInterrupt where the run is: no checkpoint of this step is written,
    and the last one stays as it was (a save in progress writes to a temporary folder, which it removes when
    interrupted: angpt/checkpoint.py). A repeated SIGTERM changes nothing: a supervisor that sends it twice still
    gets its checkpoint.
    """

    def __init__(self, announce: bool = True, step: int = 1) -> None:
        self.received: int | None = None
        self.announce = announce
        self.step = step  # the step in progress, named by the message; the loop keeps it current
        self._old: dict[int, Any] = {}

    def __enter__(self):
        if threading_main():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
            again = "again " if signum == signal.SIGINT else ""
            name = signal.Signals(signum).name
            self._say(f"{name} received: stopping after step {self.step}; Ctrl-C {again}to stop without saving")
        elif signum == signal.SIGINT:
            self._say(f"SIGINT again: stopping now, without saving step {self.step}; saved checkpoints are kept")
            raise KeyboardInterrupt

    def _say(self, line: str) -> None:
        if not self.announce:
            return
        try:  # on a line of its own: the progress bar may hold the current one
            print(f"\n{line}", file=sys.stderr, flush=True)
        except RuntimeError:  # the signal came while stderr was being written (a reentrant call): bypass its buffer
            os.write(2, f"\n{line}\n".encode())

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def threading_main() -> bool:
    return threading.current_thread() is threading.main_thread()
