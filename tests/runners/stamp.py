"""The durable reference, plus what real agents leave beside their work: `repo/BUILD_INFO` with the time and a uuid,
written at every exit 0 (like a chat history or a session stamp). It is an honest runner whose artifact
legitimately differs on every run: `unknown` unless the user declares the path volatile, then `pass`.

$STAMP=0 leaves the stamp out. $DAMAGE=1: a task's run (never a reference, `ref-*`) drops the last line of the
repo's first Python file before it exits 0, the way a runner that ignores a write error under DF1 leaves a file
short: damage, which two agreeing uninterrupted runs show (`fail`, naming the line). It imports nothing of the
harness (only the built-in runners' own toolkit, by path)."""
from __future__ import annotations

import os
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "fleet", "runners"))

from agentkit import log, main_guard  # noqa: E402
from durable import run  # noqa: E402


def _damage(repo: str) -> None:
    py = sorted(os.path.join(d, f) for d, _, fs in os.walk(repo) for f in fs if f.endswith(".py"))
    if not py:
        return
    with open(py[0], "rb") as f:
        lines = f.read().rstrip(b"\n").split(b"\n")
    with open(py[0], "wb") as f:
        f.write(b"\n".join(lines[:-1]) + b"\n")
    log(f"dropped {lines[-1][:60]!r} from {os.path.relpath(py[0], repo)}")


def stamped() -> None:
    run()
    repo = os.path.join(os.environ["SANDFLEET_WORKSPACE"], "repo")
    if os.environ.get("DAMAGE") == "1" and not os.environ.get("SANDFLEET_TASK_ID", "").startswith("ref-"):
        _damage(repo)
    if os.environ.get("STAMP", "1") == "1":
        with open(os.path.join(repo, "BUILD_INFO"), "w") as f:
            f.write(f"built at {time.time():.6f} id {uuid.uuid4()}\n")
        log("wrote BUILD_INFO")


if __name__ == "__main__":
    main_guard(stamped)
