"""The error of a wave that could not run (not a verdict about the runner)."""
from __future__ import annotations


class HarnessError(RuntimeError):
    """The harness could not run the wave (not a verdict about the runner)."""
