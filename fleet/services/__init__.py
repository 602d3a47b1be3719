"""Harness services a runner talks to, on 127.0.0.1. Rooms:

- `registry`: the task registry the services share (per-task and per-attempt keys) and the call log.
- `base`: the threaded JSON service base (bearer keys, body, connection, in-flight and rate limits).

The model endpoint (`fleet/model_endpoint.py`) and the effects service (`fleet/effects.py`) are built on them.
"""
from fleet.services.base import (BURST_PER_KEY, IDLE_TIMEOUT_S, LARGE_BODY, LARGE_BODY_POOL, MAX_BODY,
                                 MAX_CONNECTIONS, MAX_IN_FLIGHT_PER_KEY, RATE_PER_KEY, HttpError, JsonService,
                                 body_length, now)
from fleet.services.registry import CallLog, TaskEntry, TaskRegistry

__all__ = ["BURST_PER_KEY", "IDLE_TIMEOUT_S", "LARGE_BODY", "LARGE_BODY_POOL", "MAX_BODY", "MAX_CONNECTIONS",
           "MAX_IN_FLIGHT_PER_KEY", "RATE_PER_KEY", "CallLog", "HttpError", "JsonService", "TaskEntry",
           "TaskRegistry", "body_length", "now"]
