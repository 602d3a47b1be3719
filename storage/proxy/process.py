"""The proxy as a process: `main` (`python -m storage.proxy`), the harness's handle on its child (`ProxyProcess`),
and the client of its control API (`ProxyControl`, stdlib only, so runners and tests can use it)."""
from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import select
import subprocess
import sys
import urllib.parse
import urllib.request

import orjson

from storage.process import stop_process
from storage.proxy import rules
from storage.proxy.handler import FaultProxy
from storage.quota import Quota


class ProxyControl:
    """Client of the proxy's control API (stdlib only, so runners and tests can use it)."""

    def __init__(self, control_port: int, host: str = "127.0.0.1", token: str | None = None):
        self.base = f"http://{host}:{control_port}"
        self.token = token

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = orjson.dumps(body) if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return orjson.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"proxy control {method} {path}: {exc.code} {exc.read().decode()}") from exc

    def open_rule(self, **spec) -> dict:
        return self._call("POST", "/rules", spec)

    def close_rule(self, rule_id: str) -> dict:
        return self._call("DELETE", f"/rules/{urllib.parse.quote(rule_id, safe='')}")

    def close_all(self) -> list[dict]:
        return self._call("DELETE", "/rules")["closed"]

    def rules(self) -> dict:
        return self._call("GET", "/rules")

    def stats(self) -> dict:
        return self._call("GET", "/stats")

    def flush(self) -> None:
        """Write every request the proxy has logged so far to its log file."""
        self._call("POST", "/flush", {})


class ProxyProcess:
    """The proxy as a child process of the harness, ended by PID in `stop()`."""

    def __init__(self, upstream_url: str, log_path: str, relay: bool = True, merge_slashes: bool = False,
                 quota: tuple[int, int] | None = None):
        parts = urllib.parse.urlsplit(upstream_url)
        self.quota = quota  # (objects, bytes) per task (storage/quota.py), or None: no bound
        self.merge_slashes = merge_slashes  # the store is SeaweedFS (MERGE_SLASHES)
        self.relay = relay  # False: the proxy serves alone even where the relay is installed (a bench's "before")
        self.upstream = f"{parts.hostname}:{parts.port or 80}"
        self.log_path = log_path
        self.proc = None
        self.port = 0
        self.control_port = 0
        self.token: str | None = None

    def start(self, timeout_s: float = 20.0) -> "ProxyProcess":
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> "ProxyProcess":
        """Start the proxy's process and return at once (it needs nothing from its upstream to start);
        `wait_ready` reads its READY line with its ports."""
        self.token = secrets.token_urlsafe(32)
        env = dict(os.environ, SANDFLEET_PROXY_TOKEN=self.token)
        if not self.relay:
            env["SANDFLEET_PROXY_RELAY"] = "off"
        self.proc = subprocess.Popen(  # the token goes through the environment, never argv (ps shows argv)
            [sys.executable, "-m", "storage.proxy", "--upstream", self.upstream, "--log", self.log_path]
            + (["--merge-slashes"] if self.merge_slashes else [])
            + (["--quota-objects", str(self.quota[0]), "--quota-bytes", str(self.quota[1])] if self.quota else []),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        return self

    def wait_ready(self, timeout_s: float = 20.0) -> "ProxyProcess":
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline().decode().split() if ready else ["(no READY line after", f"{timeout_s}s)"]
        if len(line) != 3 or line[0] != "READY":
            err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"the S3 fault proxy did not start: {line} {err}")
        self.port, self.control_port = int(line[1]), int(line[2])
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def relay_pid(self) -> int | None:
        """The compiled relay's pid (the proxy's one child), or None when the proxy serves alone."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                kids = f.read().split()
        except (OSError, AttributeError):
            return None
        return int(kids[0]) if kids else None

    def control(self) -> ProxyControl:
        return ProxyControl(self.control_port, token=self.token)

    def stop(self, grace_s: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        stop_process(proc, grace_s)
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="S3 fault proxy: a head-only HTTP/1.1 relay in front of the store")
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the S3 store")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--control-port", type=int, default=0)
    ap.add_argument("--log", default=None, help="JSON-lines request log")
    ap.add_argument("--merge-slashes", action="store_true", help="match and log keys as SeaweedFS stores them")
    ap.add_argument("--quota-objects", type=int, default=0, help="objects a task's prefix may hold (0: no quota)")
    ap.add_argument("--quota-bytes", type=int, default=0, help="bytes a task's prefix may hold (0: no quota)")
    args = ap.parse_args(argv)
    rules.MERGE_SLASHES = args.merge_slashes
    host, _, port = args.upstream.rpartition(":")
    if not host or not port.isdigit():
        sys.exit(f"--upstream {args.upstream!r}: expected HOST:PORT")
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    quota = None
    if args.quota_objects or args.quota_bytes:
        quota = Quota(args.quota_objects or 2 ** 62, args.quota_bytes or 2 ** 62)
        if args.log and os.path.exists(args.log):  # a resumed wave: what the store already holds counts
            with open(args.log, "rb") as f:
                quota.preload(_log_lines(f))
    sys.exit(asyncio.run(FaultProxy(host, int(port), args.log, quota).serve(args.port, args.control_port)))


def _log_lines(f):
    for line in f:
        try:
            yield orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
