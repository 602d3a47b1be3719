"""When each running attempt was last seen doing something observable, so an attempt that stays silent past
`liveness_s` is ended (`killed: silent for N s`) and the next attempt gets its chance within the deadline, instead
of the task waiting for its deadline and `liveness` being graded afterwards.

Observable is what the grader's `liveness` counts: a model call or an effect (the services' registry notes each
request by the attempt's own key when it arrives) and a store request (the fault proxy's request log, by any access
key id the attempt was ever given: a request signed with a key rotated away (CR1) or revoked is refused by the store,
but it is still the attempt's act, and an attempt retrying a dead key is not hung; the proxy writes its log every
10 ms). The proxy log is read only past where the last read
ended, and only when some attempt has looked silent by the services for a while.
"""
from __future__ import annotations

import time
from pathlib import Path

import orjson

from cluster import results

CHECK_EVERY_S = 1.0  # how often a running attempt's silence is looked at


class Activity:
    def __init__(self, registry, proxy_log: Path | None):
        self.registry = registry
        self.proxy_log = proxy_log
        self._offset = 0
        self._partial = b""
        self._by_akid: dict[str, float] = {}  # access key id -> wall time of its latest store request

    def _read_proxy(self) -> None:
        if self.proxy_log is None:
            return
        try:
            with open(self.proxy_log, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # a line the proxy has not finished writing yet
        for line in lines:
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            akid, t = rec.get("akid"), rec.get("t")
            if akid and isinstance(t, (int, float)):
                t = results.request_span(rec)[1]  # (seen until the proxy answered it)
                if t > self._by_akid.get(akid, 0.0):
                    self._by_akid[akid] = float(t)

    def last_seen(self, sandbox_id: str, akids, started: float, bound_s: float) -> float:
        """Wall time of the attempt's latest observable act (its start when it has done none). `akids`: every key id
        the attempt was given (its current one, and any rotated away). The proxy log is read only when the services
        saw nothing for half the bound."""
        seen = max(started, self.registry.last_seen(sandbox_id) or 0.0)
        akids = [akids] if isinstance(akids, str) else [a for a in akids or () if a]
        if akids and time.time() - seen > bound_s / 2:
            self._read_proxy()
            seen = max([seen] + [self._by_akid.get(a, 0.0) for a in akids])
        return seen
