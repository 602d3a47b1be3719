"""The error of a wave that could not run (not a verdict about the runner)."""
from __future__ import annotations


class HarnessError(RuntimeError):
    """The harness could not run the wave (not a verdict about the runner): exit 2, or 254 (`bad_input`) when the
    machine's set-up is what the user must change (not root, a cgroup subtree that is not delegated)."""

    def __init__(self, msg: str = "", bad_input: bool = False):
        super().__init__(msg)
        self.exit_code = 254 if bad_input else 2


def first_line(err) -> str:
    """The first line of an error (or of its text), at most 200 characters; its type's name when it has no text."""
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__
