"""The scale bench's hollow nodes (fleet/hollow.py): real SandboxHosts with hollow sandboxes start, are seen by the
sweep's scan, are killed and cancelled, and leave nothing behind (no sandbox, no coroutine, no dir)."""
from __future__ import annotations

import asyncio
import os

import pytest

from fleet.hollow import ENV_NODES, HollowBackend, hollow_nodes
from fleet.host import HollowHost
from fleet.ledger import LeaseLedger
from fleet.markers import ATTEMPT_CREDENTIALS
from storage.credentials import CredentialSource, Credentials
from tests.harness.fakes import LocalLedger, wait_for


def spec(tmp_path, wave: str, sid: str, port: int) -> dict:
    url = "http://127.0.0.1:1/v1"  # (inside: relayed to the silent server of the test)
    env = {"SANDFLEET_TASK_ID": sid.split("-")[0], "SANDFLEET_FENCE": "1", "SANDFLEET_ATTEMPT": "1",
           "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "k", "SANDFLEET_EFFECTS_URL": url,
           "SANDFLEET_EFFECTS_KEY": "k", "SANDFLEET_S3_ENDPOINT": "http://127.0.0.1:1", "SANDFLEET_S3_BUCKET": "b",
           "SANDFLEET_S3_PREFIX": f"{wave}/{sid}/"}
    creds = tmp_path / "creds" / sid
    creds.mkdir(parents=True)
    CredentialSource(creds / ATTEMPT_CREDENTIALS).publish(Credentials("AK" + sid, "secret"))
    env["AWS_CONFIG_FILE"] = "/creds/aws-config"
    return {"wave_id": wave, "sandbox_id": sid, "task_id": sid.split("-")[0], "attempt": 1, "argv": ["x"],
            "env": env, "state_dir": str(tmp_path / "state" / sid), "files": {"repo/a.txt": "a\n"},
            "relays": {1: f"127.0.0.1:{port}"}, "ro_mounts": {str(creds): "/creds"}}


def test_hollow_nodes_start_are_scanned_and_end_with_nothing_left(tmp_path):
    async def main():
        held: list = []

        async def silent(reader, writer):  # services that never answer: the hollow runners wait in their first call
            held.append(writer)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        led = LeaseLedger(str(tmp_path / "l.db"))
        hosts = [HollowHost(f"hollow-t{os.getpid()}-{i}", None, LocalLedger(led)) for i in range(3)]
        runs = []
        for i, h in enumerate(hosts):
            for j in range(2):
                sid = f"t{i}{j}-a1"
                lease = led.acquire(f"w/t{i}{j}", h.node_id, sid, 4)
                runs.append(asyncio.create_task(h.run_attempt(spec(tmp_path, "w", sid, port), lease, 4)))
        await wait_for(lambda: len(held) == 6, "every hollow runner's first request reached the services")
        assert [len(h.backend.listing("w")) for h in hosts] == [2, 2, 2]
        scans = [await h.scan_markers(["w"]) for h in hosts]
        assert sorted(s for sc in scans for s in sc["waves"]["w"]["cgroups"]) == sorted(
            f"t{i}{j}-a1" for i in range(3) for j in range(2))
        swept = await hosts[0].sweep("w", ["t00-a1", "t01-a1"])  # both leased: nothing reaped
        assert swept["reaped"] == [] and sorted(swept["found"]) == ["t00-a1", "t01-a1"]
        killed = await hosts[0].kill("w/t00-a1", 0.0, "PK1")
        assert killed.get("applied", True) is not False
        assert sum([await h.cancel_wave("w") for h in hosts]) == 5
        outs = await asyncio.gather(*runs)
        assert all(o.exit_code == -9 and o.state == "removed" for o in outs), [o.cause for o in outs]
        assert outs[0].killed_by == "PK1"
        assert sum(h.renew_stats["refused"] for h in hosts) == 0
        for h in hosts:
            await wait_for(lambda h=h: h._renewer is None and h._relay_watch is None,
                           f"{h.node_id}'s renewer and relay watch ended with its last sandbox", 15)
            await h.shutdown(0.0, 5.0)
            assert h.backend.sandboxes == {} and h.backend.tasks == {} and h.held == {}
            assert not h.home().exists()
        assert not any((tmp_path / "state" / f"t{i}{j}-a1" / "ws").exists() for i in range(3) for j in range(2))
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        assert left == [], left
    asyncio.run(main())


def test_a_hollow_runner_that_cannot_reach_the_model_fails_and_is_removed(tmp_path):
    async def main():
        be = HollowBackend()
        host = HollowHost(f"hollow-f{os.getpid()}", be, None)
        s = spec(tmp_path, "w", "t0-a1", 9)  # (the discard port: nothing listens, the connection is refused)
        out = await host.run_attempt(s, None, 30)
        assert out.exit_code == 1 and out.state == "removed"
        assert "hollow runner failed" in (tmp_path / "state" / "t0-a1" / "runner.log").read_text()
        await host.shutdown(0.0, 5.0)
        assert be.sandboxes == {} and be.tasks == {}
    asyncio.run(main())


def test_the_hollow_node_count_is_checked(monkeypatch):
    monkeypatch.delenv(ENV_NODES, raising=False)
    assert hollow_nodes() == 0
    monkeypatch.setenv(ENV_NODES, "12")
    assert hollow_nodes() == 12
    for bad in ("0", "x", "-1", "1001"):
        monkeypatch.setenv(ENV_NODES, bad)
        with pytest.raises(ValueError, match=ENV_NODES):
            hollow_nodes()
