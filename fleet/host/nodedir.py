"""A host's own dir on its node (`/tmp/sandfleet-host-<node>/`), for a driver on another machine: nothing it sends
is a path here. Staged code, and per wave its sandboxes' state, workspaces' mount points and credentials; the
runner logs the driver pulls."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
from pathlib import Path

from fleet.hostdirs import record_owner
from fleet.markers import ATTEMPT_CREDENTIALS
from fleet.sandbox import RUNNER_LOG, SANDBOX_UID, SandboxSpec

LOG_CAP = 16 * 1024 * 1024 + 256  # the backends cap a runner's log at 16 MiB, then write one line saying so
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")  # a wave or sandbox id: one path component, never ..


def read_log(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(LOG_CAP)
    except OSError:
        return None


class NodeDir:
    """The host's dir on its node and what lives in it (the host's node id names it)."""

    def __init__(self, host):
        self.host = host

    def home(self, wave_id: str | None = None) -> Path:
        """This host's own dir on its node (`/tmp/sandfleet-host-<node>/`): staged code, and per wave its
        sandboxes' state, workspaces' mount points and credentials."""
        base = Path(f"/tmp/sandfleet-host-{self.host.node_id}")
        return base / wave_id if wave_id else base

    def localize(self, spec: SandboxSpec) -> SandboxSpec:
        from storage.credentials import CredentialSource, Credentials

        base = self.home(spec.wave_id)
        record_owner(self.home())  # (the sweep on this node tells a dead host's dir by it)
        base.mkdir(mode=0o711, exist_ok=True)
        sdir = base / "sandboxes" / spec.sandbox_id
        sdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        ro_mounts, ro_binds = dict(spec.ro_mounts), list(spec.ro_binds)
        if spec.credentials is not None:
            c = spec.credentials
            cdir = base / "creds" / spec.sandbox_id
            cdir.mkdir(parents=True, exist_ok=True, mode=0o755)
            src = CredentialSource(cdir / ATTEMPT_CREDENTIALS)
            src.publish(Credentials(c["access_key"], c["secret_key"]), owner_uid=SANDBOX_UID)
            src.write_aws_config(cdir / "aws-config", c.get("region", "us-east-1"),
                                 source_path=f"{c['mount']}/{ATTEMPT_CREDENTIALS}")
            ro_mounts[str(cdir)] = c["mount"]
        if spec.code is not None:
            staged = self.home() / "code" / spec.code["digest"]
            if not staged.is_dir():
                raise RuntimeError(f"the runner's code {spec.code['digest'][:12]} was not staged on this node")
            ro_mounts[str(staged)] = spec.code["path"]
            inside = spec.code["path"].rstrip("/") + "/"
            # what the snapshot left out (a venv, fleet/codeship.py) is this node's own, at the same path, mounted
            # over the shipped code (its place there is an empty dir: the mount point a read-only copy cannot make)
            for b in [*ro_binds, *spec.code.get("envs", ())]:
                place = staged / b[len(inside):]
                if (b.startswith(inside) and os.path.isdir(b)
                        and (not place.exists() or (place.is_dir() and not any(place.iterdir())))):
                    ro_mounts[b] = b
            ro_binds = [b for b in ro_binds if b != spec.code["path"] and not b.startswith(inside)]
        # this host's own dir (every attempt's credentials on this node) is never shown, whatever a bind covers
        hide = list(spec.hide) + [str(self.home())] * any(
            str(self.home()).startswith(b.rstrip("/") + "/") for b in ro_binds)
        ws = spec.workspace_dir if spec.volume else str(base / "ws" / spec.sandbox_id)  # (a kept volume: its own)
        return dataclasses.replace(spec, state_dir=str(sdir), workspace_dir=ws,
                                   ro_mounts=ro_mounts, ro_binds=ro_binds, hide=hide, credentials=None)

    def forget(self, spec: SandboxSpec) -> None:
        """A remote attempt ended: its credentials and its state go from this node (its log went to the driver)."""
        base = self.home(spec.wave_id)
        for d in (base / "creds" / spec.sandbox_id, base / "sandboxes" / spec.sandbox_id):
            shutil.rmtree(d, ignore_errors=True)
        try:
            (base / "ws" / spec.sandbox_id).rmdir()
        except OSError:
            pass

    def logs_since(self, offsets: dict[str, int]) -> dict[str, bytes]:
        out = {}
        for key, have in offsets.items():
            wave_id, _, sid = str(key).partition("/")
            if not (NAME.fullmatch(wave_id) and NAME.fullmatch(sid)) or not 0 <= int(have) < LOG_CAP:
                continue
            sb = self.host.backend.sandboxes.get(key)
            path = sb.spec.log_path if sb is not None else str(self.home(wave_id) / "sandboxes" / sid / RUNNER_LOG)
            if not path.startswith(str(self.home()) + "/"):  # (a local attempt's log is the driver's own file)
                continue
            try:
                with open(path, "rb") as f:
                    f.seek(int(have))
                    data = f.read(LOG_CAP - int(have))
            except OSError:
                continue
            if data:
                out[key] = data
        return out

    async def publish_credentials(self, wave_id: str, sandbox_id: str, access_key: str, secret_key: str) -> bool:
        """CR1 on a remote attempt: its rotated key, published where its credential_process reads it. False when
        the attempt ended meanwhile (its credentials dir is gone)."""
        from storage.credentials import CredentialSource, Credentials

        cdir = self.home(wave_id) / "creds" / sandbox_id
        if not cdir.is_dir():
            return False
        src = CredentialSource(cdir / ATTEMPT_CREDENTIALS)
        await asyncio.to_thread(src.publish, Credentials(access_key, secret_key), SANDBOX_UID)
        return True

    async def stage_code(self, digest: str, data: bytes) -> dict:
        """Unpack the runner's snapshot here and check its digest (fleet/codeship.py)."""
        from fleet.codeship import ShipError, unpack

        record_owner(self.home())
        (self.home() / "code").mkdir(mode=0o711, exist_ok=True)
        try:
            path = await asyncio.to_thread(unpack, data, str(self.home() / "code" / digest), digest)
        except (ShipError, OSError, ValueError) as exc:
            return {"node": self.host.node_id, "ok": False, "why": str(exc)[:300]}
        return {"node": self.host.node_id, "ok": True, "path": path, "digest": digest}

    async def drop_wave(self, wave_id: str) -> None:
        """The wave's dir on this node goes (what its ended attempts left)."""
        await asyncio.to_thread(shutil.rmtree, self.home(wave_id), True)
