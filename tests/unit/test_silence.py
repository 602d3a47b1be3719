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


def test_the_watch_reads_every_key_the_attempt_may_sign_with_not_a_running_zombies():
    """Its own keys (the one rotated away too) and the dead keys of the task's ended earlier attempts (a runner
    that kept one is refused, but only the running attempt can send it); never the keys of a zombie still running,
    whose requests are its own."""
    from types import SimpleNamespace

    from cluster.wave.attempts import Attempts

    keys = {"t000-a1": ["K1"], "t000-a2": ["K2"], "t000-a3": ["K3", "K3b"]}
    att = Attempts.__new__(Attempts)
    att.access = SimpleNamespace(akids_of=lambda sid: tuple(keys.get(sid, ())))
    att.zombie_sids = set()
    run = SimpleNamespace(attempts=3, plan=SimpleNamespace(task_id="t000"))
    assert sorted(att._keys_it_may_sign_with(run, "t000-a3")) == ["K1", "K2", "K3", "K3b"]
    att.zombie_sids = {"t000-a2"}  # frozen and abandoned (PK6), thawed: still running
    assert sorted(att._keys_it_may_sign_with(run, "t000-a3")) == ["K1", "K3", "K3b"]
