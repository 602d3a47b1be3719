"""The kernel's TCP buffer memory (/proc/net/sockstat, over every socket of the machine), for the tests that check
what a client that never reads can pin in a relay."""
from __future__ import annotations

import os
import time


def pages() -> int:
    line = next(x for x in open("/proc/net/sockstat") if x.startswith("TCP:")).split()
    return int(line[line.index("mem") + 1])


def pinned_mib(before: int, settle_s: float = 2.0, bound_s: float = 30.0) -> float:
    """MiB grown since `before` once the buffers are full: the figure held (within 64 pages) for `settle_s`, read
    every 0.25 s (bounded by `bound_s`)."""
    deadline = time.monotonic() + bound_s
    last, since = pages(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = pages()
        if abs(now - last) > 64:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle_s:
            break
    return (pages() - before) * os.sysconf("SC_PAGE_SIZE") / 2**20
