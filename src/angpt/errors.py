"""Errors that mean "the user gave us something wrong".

The CLI catches :class:`UserError` and prints its message as one line with a non-zero exit, so every message
must say what is wrong and what to change. Library callers can catch it like any other exception.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input (config, data, checkpoint, command line): reported as one line, exit code 2."""


class ConfigError(UserError, ValueError):
    """An invalid configuration value; the message names the field and the fix."""


class DataError(UserError):
    """A missing, corrupt or mismatched dataset file."""


class CheckpointError(UserError):
    """A missing, incomplete or mismatched checkpoint."""


class DeadlineReached(KeyboardInterrupt):
    """A study's in-process executor left runs unstarted that would have ended past its `--deadline`: the study
    stops as an interruption does (its report PARTIAL, the same command goes on), and the command exits 0, having
    done what it was asked (a chained job goes on)."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'train.lr'?)`` for a mistyped `word`, or "" when no choice is close.

    A dotted key whose last part is a choice's last part is that choice (``lr`` -> ``train.lr``, the section
    forgotten); else the closest spelling (difflib) in its own section, or anywhere when the section is the typo
    (``trian.lr``). A long list of valid keys need not then be searched by eye."""
    choices = list(choices)
    section, _, name = word.rpartition(".")
    close = [c for c in choices if c != word and c.rpartition(".")[2] == name]
    siblings = {c.rpartition(".")[2]: c for c in choices if c.rpartition(".")[0] == section}
    if not close and siblings:
        close = [siblings[m] for m in difflib.get_close_matches(name, list(siblings), n=1)]
    elif not close:
        close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
