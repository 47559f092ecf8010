"""Errors that mean "the user gave us something wrong".

The CLI catches :class:`UserError` and prints its message as one line with a non-zero exit, so every message
must say what is wrong and what to change. Library callers can catch it like any other exception.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input (config, data, checkpoint, command line): reported as one line, exit code 2."""


class ConfigError(UserError, ValueError):
    """An invalid configuration value; the message names the field and the fix."""


class DataError(UserError):
    """A missing, corrupt or mismatched dataset file."""


class CheckpointError(UserError):
    """A missing, incomplete or mismatched checkpoint."""
