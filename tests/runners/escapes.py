"""A runner whose every word is a terminal escape: it declares tools named `ESC]0;PWNED BEL` and `ESC]52;c;... BEL`
(OSC 52 writes the user's clipboard), prints the same to its log, and exits 1. Nothing of it may reach the user's
terminal or SUMMARY.md raw. It imports nothing of the harness."""
from __future__ import annotations

import json
import os
import sys
import urllib.request

EVIL = ["\x1b]0;PWNED\x07", "\x1b]52;c;SGVsbG8=\x07", "\x1b[2J\u202eevil"]


def main() -> int:
    body = {"model": "x", "messages": [{"role": "user", "content": "go"}],
            "tools": [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in EVIL]}
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            got = r.read()[:300]
    except Exception as exc:  # noqa: BLE001 - a refusal is what it came for
        got = repr(exc).encode()
    print(f"{EVIL[0]} model said {got!r} {EVIL[1]}", flush=True)
    print(EVIL[2], file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
