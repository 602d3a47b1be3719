"""Boundary pauses of the lazy file system: an armed ``(kind, n)`` write, fsync or rename blocks in its FUSE thread
until the harness releases it (so a kill lands mid-append deterministically)."""
from __future__ import annotations

import threading
import time

from fleet.lazyfs.cache import KINDS


class Boundaries:
    """Armed ``(kind, n)`` pauses: the operation that reaches one blocks in its FUSE thread until released.

    Use as ``LazyOps(on_boundary=Boundaries())``; the serving process has one behind its control socket. A pause is
    bounded (``max_pause_s``) so a harness that forgets to release never wedges a mount for good."""

    def __init__(self, max_pause_s: float = 600.0) -> None:
        self._cv = threading.Condition()
        self._armed: dict[tuple[str, int], dict] = {}
        self.max_pause_s = max_pause_s

    def arm(self, kind: str, n: int) -> None:
        if kind not in KINDS or int(n) < 1:
            raise ValueError(f"boundary ({kind!r}, {n!r}): kind must be one of {', '.join(KINDS)} and n >= 1")
        with self._cv:
            self._armed[(kind, int(n))] = {"kind": kind, "n": int(n), "path": None, "reached": False,
                                           "released": False}

    def __call__(self, kind: str, n: int, path: str | None) -> None:
        with self._cv:
            st = self._armed.get((kind, n))
            if st is None or st["released"]:
                return
            st["reached"], st["path"], st["t"] = True, path, time.time()
            self._cv.notify_all()
            self._cv.wait_for(lambda: st["released"], timeout=self.max_pause_s)
            self._armed.pop((kind, n), None)

    def wait(self, kind: str, n: int, timeout_s: float) -> dict | None:
        """Until the armed boundary is reached: ``{"kind", "n", "path"}``, or None on timeout / not armed."""
        with self._cv:
            st = self._armed.get((kind, int(n)))
            if st is None:
                return None
            if not self._cv.wait_for(lambda: st["reached"], timeout=timeout_s):
                return None
            return {"kind": kind, "n": int(n), "path": st["path"]}

    def release(self, kind: str | None = None, n: int | None = None) -> int:
        """Let paused operations go on and disarm the rest (all of them with no arguments); how many were paused."""
        with self._cv:
            hit = [k for k in self._armed if (kind is None or k[0] == kind) and (n is None or k[1] == int(n))]
            paused = 0
            for k in hit:
                st = self._armed[k]
                if st["reached"]:
                    st["released"] = True
                    paused += 1
                else:
                    del self._armed[k]
            self._cv.notify_all()
            return paused

    def paused(self) -> list[dict]:
        with self._cv:
            return [{"kind": s["kind"], "n": s["n"], "path": s["path"]} for s in self._armed.values()
                    if s["reached"] and not s["released"]]
