"""The workload interface shared by the model endpoint, the effects service and the grader."""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ToolStep:
    """One step of a task's script: the tool call the model answers with."""

    step: int
    tool: str
    arguments: dict = field(hash=False)
    completion_tokens: int = 0
    kind: str = "workspace"  # workspace (leaves a marker in the artifact) | effect (external) | read


class Workload(Protocol):
    name: str

    def fixture(self, seed: int) -> dict[str, str]:
        """The repository (paths relative to `$SANDFLEET_WORKSPACE/repo`) every attempt starts from."""

    def script(self, seed: int, steps: int) -> list[ToolStep]:
        """The tool call of every step, fixed per (seed, step)."""

    def final_message(self, seed: int, steps: int) -> str:
        """The assistant's closing message after the last step."""

    def tools(self) -> list[dict]:
        """OpenAI function schemas of the tools the script calls."""

    def step_counts(self, files: dict[str, bytes]) -> dict[int, int]:
        """How often each step's marker appears in an artifact (2+ = applied twice)."""

    def effect_steps(self, seed: int, steps: int) -> dict[str, int]:
        """effect_id -> step for every external effect the script asks for."""


def rng(seed: int, *salt) -> random.Random:
    return random.Random(hashlib.sha256(repr((seed,) + salt).encode()).digest())


def tree_digest(files: dict[str, bytes]) -> str:
    """Digest of a file tree: sorted (path, sha256(content)) pairs."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()
