"""The workload interface shared by the model endpoint, the effects service and the grader."""
from __future__ import annotations

import hashlib
import random
import re
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
    files: tuple[str, ...] = ()  # a multi-file apply (`apply_edits`): the files it changes, all or none


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

    # optional, for workloads with multi-file applies (`rename4`):
    #   applied_files(seed, steps, step, files) -> {path: True (after) | False (before) | None (neither)}
    #   tests(seed, files) -> {test name: (passed, why)}


MARK = "sf-step="
_MARK_RE = re.compile(rb"\(" + MARK.encode() + rb"(\d+)\)")


def marker_counts(files: dict[str, bytes]) -> dict[int, int]:
    """How often each step's marker `(sf-step=N)` appears in a file tree."""
    counts: dict[int, int] = {}
    for body in files.values():
        for m in _MARK_RE.finditer(body):
            n = int(m.group(1))
            counts[n] = counts.get(n, 0) + 1
    return counts


def effect_ids(script: list[ToolStep]) -> dict[str, int]:
    return {s.arguments["effect_id"]: s.step for s in script if s.kind == "effect"}


# The tools every workload draws from (OpenAI function schemas). The built-in runners implement all of
# them; docs/runner-contract.md says what each does.
TOOL_SCHEMAS = {
    "apply_patch": {"type": "function", "function": {
        "name": "apply_patch",
        "description": "Append text (one or more lines) to a file of the repository (path relative to repo/).",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "append": {"type": "string"}},
            "required": ["path", "append"], "additionalProperties": False}}},
    "apply_edits": {"type": "function", "function": {
        "name": "apply_edits",
        "description": "One change across several files: in each file replace every occurrence of `old` by `new`.",
        "parameters": {"type": "object", "properties": {
            "edits": {"type": "array", "items": {"type": "object", "properties": {
                "path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                "required": ["path", "old", "new"], "additionalProperties": False}}},
            "required": ["edits"], "additionalProperties": False}}},
    "run_command": {"type": "function", "function": {
        "name": "run_command",
        "description": "Run a shell command in the repository (sh -c, working directory repo/).",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string"}, "timeout_s": {"type": "number"}},
            "required": ["command"], "additionalProperties": False}}},
    "publish": {"type": "function", "function": {
        "name": "publish",
        "description": "Send a message to a channel through the effects service (an external effect).",
        "parameters": {"type": "object", "properties": {
            "effect_id": {"type": "string"}, "channel": {"type": "string"}, "text": {"type": "string"}},
            "required": ["effect_id", "channel", "text"], "additionalProperties": False}}},
    "run_tests": {"type": "function", "function": {
        "name": "run_tests",
        "description": "Run the repository's checks; read-only.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
}


def tools(*names: str) -> list[dict]:
    return [TOOL_SCHEMAS[n] for n in names]


def rng(seed: int, *salt) -> random.Random:
    return random.Random(hashlib.sha256(repr((seed,) + salt).encode()).digest())


def tree_digest(files: dict[str, bytes]) -> str:
    """Digest of a file tree: sorted (path, sha256(content)) pairs."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()
