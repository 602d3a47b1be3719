"""The built-in workload: several steps that patch files of a small fixture repository.

Pure functions shared by the model endpoint (which answers each step), the
runners (which apply the answers) and the grader (which computes the reference
artifact of an uninterrupted run and finds double applies). Each step appends
one line that carries its step marker, so a step applied twice is visible in the
artifact itself.
"""
from __future__ import annotations

import hashlib
import random

FILES = ("README.md", "src/app.py", "src/util.py", "CHANGELOG.md")
VERBS = ("add", "fix", "rename", "document", "guard", "inline", "split", "test")
NOUNS = ("parser", "retry loop", "cache", "config", "logger", "handler", "index", "timeout")
MARK = "sf-step="


def _rng(seed: int, *salt) -> random.Random:
    return random.Random(hashlib.sha256(repr((seed,) + salt).encode()).digest())


def fixture(seed: int) -> dict[str, str]:
    """The initial repository of a task: a few small files derived from the seed."""
    rng = _rng(seed, "fixture")
    return {
        "README.md": f"# fixture-{seed}\n\nA small repository an agent patches.\n",
        "src/app.py": f"def main():\n    return {rng.randrange(1000)}\n",
        "src/util.py": f"def helper(x):\n    return x * {rng.randrange(2, 9)}\n",
        "CHANGELOG.md": "# Changelog\n",
    }


def decide(seed: int, step: int) -> dict:
    """The content of the model's answer for one step (the same on every call)."""
    rng = _rng(seed, "step", step)
    path = rng.choice(FILES)
    comment = "#" if path.endswith(".py") else "-"
    text = f"{comment} {rng.choice(VERBS)} {rng.choice(NOUNS)} ({MARK}{step})"
    return {"step": step, "file": path, "line": text}


def apply(files: dict[str, str], decision: dict) -> dict[str, str]:
    """Apply one decision (append its line); returns a new dict."""
    out = dict(files)
    out[decision["file"]] = out[decision["file"]] + decision["line"] + "\n"
    return out


def reference(seed: int, steps: int) -> dict[str, str]:
    """The artifact of an uninterrupted run: every step applied exactly once, in order."""
    files = fixture(seed)
    for i in range(steps):
        files = apply(files, decide(seed, i))
    return files


def fingerprint(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path].encode()).digest())
    return h.hexdigest()


def step_counts(files: dict[str, str]) -> dict[int, int]:
    """How many times each step's marker appears in an artifact (2+ = applied twice)."""
    counts: dict[int, int] = {}
    for text in files.values():
        for line in text.splitlines():
            if f"({MARK}" in line:
                n = int(line.rsplit(MARK, 1)[1].rstrip(")"))
                counts[n] = counts.get(n, 0) + 1
    return counts
