"""A sandbox host given an attempt by a driver on another machine (`spec.remote`): it makes every path on its own
node, writes the attempt's credentials there (the sandbox user's, mode 0400), mounts the staged code at the runner
workdir's path, publishes a rotated key where credential_process reads it, and removes all of it when the
attempt ends; code that was never staged is refused."""
from __future__ import annotations

import asyncio
import os
import secrets
import shutil

import orjson
import pytest

from fleet import codeship
from fleet.host import SandboxHost
from fleet.markers import ATTEMPT_CREDENTIALS
from fleet.sandbox import SANDBOX_UID, SandboxSpec


@pytest.fixture
def host():
    h = SandboxHost(f"unit-{secrets.token_hex(3)}", backend=object())
    yield h
    shutil.rmtree(h.home(), ignore_errors=True)


def _spec(**kw) -> SandboxSpec:
    return SandboxSpec(wave_id="w-x", sandbox_id="t000-a1", task_id="t000", attempt=1, argv=["/bin/true"], env={},
                       state_dir="", remote=True, ro_binds=["/opt/runner", "/usr/lib/python3"], **kw)


def test_a_remote_attempt_gets_its_paths_and_credentials_on_the_node_and_loses_them_at_its_end(host, tmp_path):
    creds = {"access_key": "AK1", "secret_key": "SK1", "region": "us-east-1", "mount": "/run/sandfleet/creds"}
    (tmp_path / "agent.py").write_text("print(1)\n")
    digest, data = codeship.snapshot(str(tmp_path))
    assert asyncio.run(host.stage_code(digest, data))["ok"]
    spec = host.node_dir.localize(_spec(credentials=creds, code={"digest": digest, "path": "/opt/runner"}))
    home = host.home("w-x")
    assert spec.state_dir == str(home / "sandboxes" / "t000-a1") and spec.workspace.startswith(str(home))
    assert spec.credentials is None  # not carried further than the host
    cdir = home / "creds" / "t000-a1"
    st = os.stat(cdir / ATTEMPT_CREDENTIALS)
    assert (st.st_uid, st.st_mode & 0o777) == (SANDBOX_UID, 0o400)
    assert orjson.loads((cdir / ATTEMPT_CREDENTIALS).read_bytes())["SecretAccessKey"] == "SK1"
    assert "/run/sandfleet/creds/credentials.json" in (cdir / "aws-config").read_text()
    assert spec.ro_mounts == {str(cdir): "/run/sandfleet/creds", str(host.home() / "code" / digest): "/opt/runner"}
    assert spec.ro_binds == ["/usr/lib/python3"]  # the workdir comes from the staged snapshot instead
    assert asyncio.run(host.publish_credentials("w-x", "t000-a1", "AK2", "SK2"))
    assert orjson.loads((cdir / ATTEMPT_CREDENTIALS).read_bytes())["AccessKeyId"] == "AK2"
    host.node_dir.forget(spec)
    assert not cdir.exists() and not (home / "sandboxes" / "t000-a1").exists()
    assert not asyncio.run(host.publish_credentials("w-x", "t000-a1", "AK3", "SK3"))  # ended: nothing to publish


def test_code_that_was_never_staged_is_refused_and_missing_paths_are_named(host):
    with pytest.raises(RuntimeError, match="was not staged on this node"):
        host.node_dir.localize(_spec(code={"digest": "0" * 64, "path": "/opt/runner"}))
    assert asyncio.run(host.missing_paths(["/usr", "/nonexistent-sandfleet-path"])) == ["/nonexistent-sandfleet-path"]
