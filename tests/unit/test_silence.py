"""The silence watch (cluster/wave/silence.py) counts a store request as the act of the attempt whose key signed it,
any key it was ever given: a key rotated away (CR1) and refused is still the attempt's doing."""
from __future__ import annotations

import time

import orjson

from cluster.wave.silence import Activity


class _Registry:
    def last_seen(self, sandbox_id):
        return None  # no model call, no effect: only the store shows what the attempt does


def test_a_request_signed_with_a_rotated_away_key_is_activity_of_its_attempt(tmp_path):
    now = time.time()
    log = tmp_path / "proxy-requests.jsonl"
    # the attempt's first key, rotated away 20 s ago and since refused every second; its new key never used
    log.write_bytes(b"".join(orjson.dumps({"t": now - 20 + i, "akid": "OLDKEY", "status": 403, "ms": 2}) + b"\n"
                             for i in range(20)) + b'{"t": ')  # (and a line the proxy is still writing)
    act = Activity(_Registry(), log)
    started = now - 60
    seen = act.last_seen("t000-a1", ("OLDKEY", "NEWKEY"), started, bound_s=4.0)
    assert now - 2 < seen <= now, (now, seen)
    # the key it holds now alone (what the watch read before): silent for 60 s, ended as hung
    assert Activity(_Registry(), log).last_seen("t000-a1", ("NEWKEY",), started, bound_s=4.0) == started
    # another attempt's key is not this attempt's activity
    assert Activity(_Registry(), log).last_seen("t000-a2", ("OTHER",), started, bound_s=4.0) == started
