"""The command line of this angpt invocation: what every provenance records as its command (a run's
provenance.json, a comparison's and a ladder's report).

angpt.cli.main sets it from the argv it was given, which is not sys.argv when main is called from Python; the worker
processes of a comparison inherit their parent's (ANGPT_COMMAND). Library calls outside main record this process's
own sys.argv.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

ENV = "ANGPT_COMMAND"  # the parent's command line (a JSON list) in a comparison's worker processes

_argv: ContextVar[tuple[str, ...] | None] = ContextVar("angpt_command", default=None)


@contextmanager
def invoked_as(argv: Sequence[str]) -> Iterator[None]:
    """Within the block, the command line is ``angpt`` followed by `argv` (the verb and its flags)."""
    token = _argv.set(("angpt", *argv))
    try:
        yield
    finally:
        _argv.reset(token)


def command_argv() -> list[str]:
    """This invocation's command line as a list (``["angpt", "train", ...]``)."""
    argv = _argv.get()
    if argv is None and ENV in os.environ:
        try:
            argv = tuple(json.loads(os.environ[ENV]))
        except (ValueError, TypeError):  # not ours: ignore it
            argv = None
    return list(argv) if argv is not None else list(sys.argv)


def command_line() -> str:
    """This invocation's command line, shell-quoted."""
    return shlex.join(command_argv())


def child_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a worker process of this invocation: it records this command line, not its own."""
    return {**env, ENV: json.dumps(command_argv())}
