"""A remote attempt's runner.log is pulled from its node while the attempt runs (cluster/wave/logstream.py): a host
lost mid-attempt leaves the log as of the last pull, an attempt's result replaces it with the whole log, and the host
answers only for its own dir, bounded as the log is."""
from __future__ import annotations

import asyncio
import secrets
import shutil
import types

import pytest

from cluster import results
from cluster.wave.logstream import LogStream
from fleet.host import LOG_CAP, SandboxHost

WAVE = "w-20261206T060000-s1-abcd"


class _Ref:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, offsets):
        async def call():
            return self.fn(offsets)
        return call()


class _FakeHost:
    """A node's host whose runner logs grow as the test writes them; `lost` makes its calls fail as a dead actor's."""

    def __init__(self):
        self.logs: dict[str, bytes] = {}
        self.lost = False
        self.calls = 0
        self.logs_since = _Ref(self._since)

    def _since(self, offsets):
        self.calls += 1
        if self.lost:
            raise RuntimeError("actor died")
        return {k: self.logs[k][n:] for k, n in offsets.items() if self.logs.get(k, b"")[n:]}


def test_a_lost_host_leaves_the_log_as_of_the_last_pull_and_a_result_replaces_it(tmp_path):
    out = results.ResultsDir(tmp_path)
    host = _FakeHost()

    async def wave():
        s = LogStream(WAVE, out, every_s=0.02)
        s.watch("t000-a1", "node-a", host)
        s.watch("t001-a1", "node-a", host)
        assert out.runner_log("t000-a1").read_bytes() == b""  # an attempt that started has its log at once
        host.logs[f"{WAVE}/t000-a1"] = b"step 1\n"
        await asyncio.sleep(0.1)
        host.logs[f"{WAVE}/t000-a1"] += b"step 2\n"
        host.logs[f"{WAVE}/t001-a1"] = b"other\n"
        await asyncio.sleep(0.1)
        s.finish("t001-a1", b"other\nthe whole log\n")  # its result came back: the host's read at its end
        host.logs[f"{WAVE}/t001-a1"] += b"late pull\n"
        host.lost = True
        host.logs[f"{WAVE}/t000-a1"] += b"step 3 (never pulled)\n"
        await asyncio.sleep(0.1)
        s.finish("t000-a1", None)  # the host was lost: no log in the result
        await asyncio.sleep(0.05)
        return s

    s = asyncio.run(wave())
    assert out.runner_log("t000-a1").read_bytes() == b"step 1\nstep 2\n"
    assert out.runner_log("t001-a1").read_bytes() == b"other\nthe whole log\n"
    assert not s.live and host.calls >= 5  # one call per node per pull, and it stops with the last attempt


def test_the_last_pull_of_a_stopped_attempt_takes_what_came_since_the_periodic_one(tmp_path):
    out = results.ResultsDir(tmp_path)
    host = _FakeHost()

    async def wave():
        s = LogStream(WAVE, out, every_s=60)
        s.watch("t000-a1", "node-a", host)
        host.logs[f"{WAVE}/t000-a1"] = b"before the stop\n"
        await s.last("t000-a1")
        return s

    s = asyncio.run(wave())
    assert out.runner_log("t000-a1").read_bytes() == b"before the stop\n" and not s.live


@pytest.fixture
def node_host():
    h = SandboxHost(f"unit-{secrets.token_hex(3)}", backend=types.SimpleNamespace(sandboxes={}))
    yield h
    shutil.rmtree(h.home(), ignore_errors=True)


def test_the_host_answers_from_its_own_dir_only_and_bounded(node_host):
    d = node_host.home(WAVE) / "sandboxes" / "t000-a1"
    d.mkdir(parents=True)
    (d / "runner.log").write_bytes(b"0123456789")
    got = asyncio.run(node_host.logs_since({f"{WAVE}/t000-a1": 4, f"{WAVE}/../../etc": 0, "../x/t000-a1": 0,
                                            f"{WAVE}/t001-a1": 0, f"{WAVE}/t000-a1x": LOG_CAP}))
    assert got == {f"{WAVE}/t000-a1": b"456789"}
    assert asyncio.run(node_host.logs_since({f"{WAVE}/t000-a1": LOG_CAP})) == {}  # past the cap: nothing more
