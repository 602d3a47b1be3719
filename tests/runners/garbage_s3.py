"""A runner that first sends its S3 endpoint what no S3 client sends, then works as the durable reference does.

The hostile find it pins: 21 bytes (`GARBAGE\r\n\r\n`, or a request with both Content-Length and Transfer-Encoding)
made the proxy rightly answer 400 and log the request with `"key": null`, and the grader then crashed on that line:
no SUMMARY.md, verdict.json or grade for any task of the wave. It imports nothing of the harness (only the built-in
runners' own toolkit, by path)."""
from __future__ import annotations

import os
import socket
import sys
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "fleet", "runners"))

from agentkit import log, main_guard  # noqa: E402
from durable import run  # noqa: E402

GARBAGE = (b"GARBAGE\r\n\r\n",
           b"PUT /x/y HTTP/1.1\r\nHost: s3\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
           b"\x1b]0;PWNED\x07 /\x00 HTTP/9.9\r\n\r\n")


def send_garbage() -> None:
    u = urllib.parse.urlsplit(os.environ["SANDFLEET_S3_ENDPOINT"])
    for raw in GARBAGE:
        with socket.create_connection((u.hostname, u.port or 80), timeout=5) as s:
            s.sendall(raw)
            try:
                got = s.recv(200)
            except OSError as exc:
                got = repr(exc).encode()
        first = got.split(b"\r\n", 1)[0]
        log(f"garbage {raw[:12]!r}: {first!r}")


if __name__ == "__main__":
    send_garbage()
    main_guard(run)
