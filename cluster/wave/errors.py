"""The error of a wave that could not run (not a verdict about the runner)."""
from __future__ import annotations


class HarnessError(RuntimeError):
    """The harness could not run the wave (not a verdict about the runner)."""


def first_line(err) -> str:
    """The first line of an error (or of its text), at most 200 characters; its type's name when it has no text."""
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__
