"""The effects service: where a workload's tools act outside the workspace (deploy, send,
charge). `POST /v1/effects` with the task's key records one effect with the attempt
holding the lease at that moment; a repeated `Idempotency-Key` is answered with the
first receipt and recorded as `deduped` (a correct retry). The same effect applied
twice without a key is a double apply: `no_double_apply` reads this log.
"""
from __future__ import annotations

import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler

from fleet import workloads
from fleet.services import HttpError, JsonService, TaskEntry, TaskRegistry


class EffectsService(JsonService):
    name = "effects-service"

    def __init__(self, registry: TaskRegistry | None = None, log_path=None):
        super().__init__(registry or TaskRegistry(), log_path)
        self._seen: dict[tuple[str, str], dict] = {}
        self._seen_lock = threading.Lock()
        self._maps: dict[tuple, dict] = {}
        self._answered: dict[str, int] = {}

    def preload(self, path) -> None:
        """A resumed wave: the Idempotency-Keys seen before the driver died still deduplicate."""
        for r in self.log.preload(path):
            if r.get("idempotency_key") and not r.get("deduped"):
                self._seen.setdefault((r["task"], r["idempotency_key"]),
                                      {"effect_id": r["effect_id"], "receipt": r["receipt"], "applied_at": r["t"]})

    def _steps(self, entry: TaskEntry) -> dict[str, int]:
        k = (entry.workload, entry.seed, entry.steps)
        if k not in self._maps:
            self._maps[k] = workloads.get(entry.workload).effect_steps(entry.seed, entry.steps)
        return self._maps[k]

    def route(self, h: BaseHTTPRequestHandler, method: str, path: str, entry: TaskEntry) -> None:
        if method != "POST" or path not in ("/v1/effects", "/effects"):
            raise HttpError(404, f"no route {method} {path}; this service takes POST /v1/effects", code="not_found")
        self.registry.touch(entry.key)  # an effect: the attempt is alive (cluster/wave/silence.py)
        t0 = time.time()
        attempt = entry.attempt
        body = self.read_json(h)
        eid = body.get("effect_id")
        if not isinstance(eid, str) or not eid or len(eid) > 200:
            raise HttpError(400, "'effect_id' must be a non-empty string (at most 200 characters)",
                            param="effect_id")
        idem = h.headers.get("Idempotency-Key")
        if idem is not None and (not idem or len(idem) > 255):
            raise HttpError(400, "Idempotency-Key must be 1-255 characters", param="Idempotency-Key")
        with self._seen_lock:
            first = self._seen.get((entry.task_id, idem)) if idem else None
            deduped = first is not None
            if first is None:
                first = {"effect_id": eid, "receipt": "fx-" + secrets.token_hex(8), "applied_at": t0}
                if idem:
                    self._seen[(entry.task_id, idem)] = first
        step = self._steps(entry).get(eid)
        rec = {"t": t0, "task": entry.task_id, "attempt": attempt, "effect_id": eid, "step": step,
               "idempotency_key": idem, "deduped": deduped, "receipt": first["receipt"],
               "same_effect_as_key": deduped and first["effect_id"] == eid}
        rec["t_done"] = time.time()
        self.log.append(rec)  # recorded before it is answered: a runner never sees an unrecorded effect
        if self.send_json(h, 200, {**first, "deduped": deduped}):
            with self._seen_lock:
                self._answered[entry.task_id] = self._answered.get(entry.task_id, 0) + 1

    def answered(self, task_id: str) -> int:
        """How many effect answers reached the task's runner (the PK1 `after_effects` boundary)."""
        with self._seen_lock:
            return self._answered.get(task_id, 0)
