"""The durable reference, plus one file a real agent may leave: a name that is not UTF-8 (`repo/odd\\xffname.txt`,
from a tool that wrote raw bytes). Every attempt writes it first; $ODD_EXIT=1 makes a task's (never a reference's) first attempt
exit 1 right after (so a kept disk carries it into the next). A file name is untrusted input: it may be left out of the artifact,
named, but must never end the wave. It imports nothing of the harness (only the built-in runners' own toolkit)."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "fleet", "runners"))

from agentkit import Env, log, main_guard  # noqa: E402
from durable import run  # noqa: E402


def main() -> None:
    env = Env.load()
    repo = os.path.join(env.workspace, "repo").encode()
    os.makedirs(repo, exist_ok=True)
    with open(os.path.join(repo, b"odd\xffname.txt"), "wb") as f:
        f.write(b"x\n")
    log("made repo/odd\\xffname.txt")
    if env.attempt == 1 and os.environ.get("ODD_EXIT") == "1" and not env.task_id.startswith("ref-"):
        sys.exit(1)
    run()


main_guard(main)
