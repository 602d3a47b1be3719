"""Hollow sandboxes, for the scale bench only (issue 45; kubemark's hollow nodes): never a product mode.

A hollow sandbox is a coroutine in its host's own event loop that follows the runner protocol of the durable
runner at near-zero cost: it reads its attempt's key where its credential file is, and for each step announces its
windows in the checkpoint file, asks the real model endpoint, commits the step's journal record to the real store
through the real fault proxy (SigV4-signed with the attempt's own key, `If-None-Match: *`), does the tool in its
workspace (a plain directory, no tmpfs), and posts an effect when the tool is `publish`. No process, namespace,
cgroup or mount is made, so one machine holds thousands of them while the head (driver, store, proxy, ledger,
sweep actor) meets every request of a large cluster.

Switched on only by the bench's environment variable `SANDFLEET_BENCH_HOLLOW_NODES=N` (cluster/raycluster.py):
the fleet then runs N sandbox host actors, each a real `SandboxHost` whose backend is this one. A hollow runner
lists its journal and reads its first record as the durable runner starts, but does not replay it on a retry (a
killed attempt's task starts its steps again), takes no workspace snapshots (the durable runner's multipart upload
every 3rd step), and answers `run_command` without running anything: no fault is meant for a hollow wave.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from urllib.parse import quote

from fleet.markers import ATTEMPT_CREDENTIALS
from fleet.sandbox import Sandbox, SandboxBackend, SandboxSpec

ENV_NODES = "SANDFLEET_BENCH_HOLLOW_NODES"  # the fleet's hollow nodes (bench only)
ENV_HOLD = "SANDFLEET_BENCH_HOLLOW_HOLD_S"  # a pause after each step (default 0: the model's think_ms paces it)
MAX_STEPS = 64  # a hollow runner stops here whatever the model says


def hollow_nodes() -> int:
    """The bench's hollow node count, 0 when unset; a bad value is an error naming it."""
    raw = os.environ.get(ENV_NODES, "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise ValueError(f"{ENV_NODES}={raw!r}: a whole number of hollow nodes from 1 to 1000 (bench only)")
    return int(raw)


class HollowBackend(SandboxBackend):
    """The host's backend for hollow sandboxes: `_start` starts the protocol coroutine, `_kill` cancels it."""

    name = "hollow"
    hollow = True

    def __init__(self, hold_s: float | None = None):
        super().__init__()
        self.hold_s = float(os.environ.get(ENV_HOLD, "0")) if hold_s is None else hold_s
        self.tasks: dict[str, asyncio.Task] = {}
        self.paused: dict[str, asyncio.Event] = {}

    def listing(self, wave_id: str) -> list[str]:
        """The sandbox ids of `wave_id` held here (a hollow sandbox's stand-in for its cgroup marker)."""
        return sorted(sb.spec.sandbox_id for sb in self.sandboxes.values() if sb.spec.wave_id == wave_id)

    def scan(self, wave_ids: list[str]) -> dict:
        """`scan_here`'s answer for this host's hollow sandboxes: each shows as a marked cgroup of its wave."""
        return {"waves": {w: {"processes": [], "cgroups": self.listing(w), "mounts": [], "containers": [],
                              "mount_sandboxes": {}} for w in wave_ids if self.listing(w)}, "errors": []}

    async def close(self) -> None:
        """(Nothing is pooled: each request is its own connection, as the durable runner's urllib calls are.)"""

    async def _start(self, sb: Sandbox) -> None:
        spec = sb.spec
        ws = spec.workspace
        os.makedirs(spec.state_dir, exist_ok=True)
        shutil.rmtree(ws, ignore_errors=True)
        for rel in list(spec.files) + [".sandfleet/checkpoints"]:
            full = os.path.join(ws, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(spec.files.get(rel, ""))
        self.paused[spec.key] = ev = asyncio.Event()
        ev.set()
        self.tasks[spec.key] = asyncio.create_task(self._play(spec, ev))

    async def _wait(self, sb: Sandbox) -> int:
        try:
            return await self.tasks[sb.spec.key]
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise
            return -9

    async def _kill(self, sb: Sandbox, grace_s: float) -> dict:
        t = self.tasks.get(sb.spec.key)
        if t is not None and not t.done():
            t.cancel()
        self.paused.get(sb.spec.key, asyncio.Event()).set()
        return {"sigterm_at": None, "sigkill": True}

    async def _terminate(self, sb: Sandbox) -> bool:
        return await self._kill(sb, 0.0) is not None

    async def _freeze(self, sb: Sandbox) -> None:
        self.paused[sb.spec.key].clear()

    async def _thaw(self, sb: Sandbox) -> None:
        self.paused[sb.spec.key].set()

    async def _cleanup(self, sb: Sandbox) -> None:
        t = self.tasks.pop(sb.spec.key, None)
        if t is not None and not t.done():
            t.cancel()
        self.paused.pop(sb.spec.key, None)
        shutil.rmtree(sb.spec.workspace, ignore_errors=True)

    async def _play(self, spec: SandboxSpec, go: asyncio.Event) -> int:
        """The durable runner's protocol, step by step, against the real services; the exit code."""
        log = open(spec.log_path, "a")
        try:
            return await HollowRunner(spec, log, go, self.hold_s).run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a runner failure, as a real runner's traceback would be
            log.write(f"{time.time():.3f} hollow runner failed: {type(exc).__name__}: {str(exc)[:300]}\n")
            return 1
        finally:
            log.close()


class HollowRunner:
    """One hollow attempt: the env is the runner contract's, the relays' in-sandbox ports mapped to their targets."""

    def __init__(self, spec: SandboxSpec, log, go: asyncio.Event, hold_s: float):
        self.spec, self.log, self.go, self.hold_s = spec, log, go, hold_s
        e = spec.env
        self.task_id, self.fence, self.attempt = e["SANDFLEET_TASK_ID"], int(e["SANDFLEET_FENCE"]), \
            int(e["SANDFLEET_ATTEMPT"])
        self.model_url, self.model_key = self._out(e["OPENAI_BASE_URL"]).rstrip("/"), e["OPENAI_API_KEY"]
        self.effects_url, self.effects_key = self._out(e["SANDFLEET_EFFECTS_URL"]).rstrip("/"), \
            e["SANDFLEET_EFFECTS_KEY"]
        self.s3_url = self._out(e["SANDFLEET_S3_ENDPOINT"]).rstrip("/")
        self.bucket, self.prefix, self.region = e["SANDFLEET_S3_BUCKET"], e["SANDFLEET_S3_PREFIX"], \
            e.get("AWS_DEFAULT_REGION", "us-east-1")
        self.creds_path = next((os.path.join(host, ATTEMPT_CREDENTIALS) for host, inside in spec.ro_mounts.items()
                                if e.get("AWS_CONFIG_FILE", "").startswith(inside.rstrip("/") + "/")), None)

    def _out(self, url: str) -> str:
        """A URL as the sandbox sees it (127.0.0.1:<relay port>) -> where that relay goes."""
        head, _, rest = url.partition("://")
        addr, slash, path = rest.partition("/")
        port = int(addr.rpartition(":")[2])
        return f"{head}://{self.spec.relays.get(port, addr)}{slash}{path}"

    def say(self, msg: str) -> None:
        self.log.write(f"{time.time():.3f} {msg}\n")
        self.log.flush()

    def announce(self, name: str) -> None:
        self.say(f"checkpoint {name}")
        with open(self.spec.checkpoint_path, "a") as f:
            f.write(json.dumps({"t": time.time(), "name": name, "attempt": self.attempt}) + "\n")

    async def post(self, url: str, key: str, payload: dict, headers: dict | None = None) -> dict:
        for n in range(20):  # transient errors retried (bounded), as the runner's `transient` does
            status, body = await request("POST", url, json.dumps(payload).encode(), {
                "Content-Type": "application/json", "Authorization": f"Bearer {key}", **(headers or {})})
            if status < 300:
                return json.loads(body)
            if status not in (408, 409, 429) and status < 500:
                raise RuntimeError(f"POST {url}: HTTP {status}: {body[:200]!r}")
            await asyncio.sleep(min(0.5, 0.05 * 2 ** n))
        raise RuntimeError(f"POST {url}: still failing after 20 tries")

    async def s3(self, method: str, path: str, body: bytes = b"", headers: dict | None = None,
                 ok: tuple = ()) -> int:
        """One request to the store through the proxy, signed with the attempt's current key; its status (a 2xx or
        one of `ok`; anything else is retried, bounded, as the runner's `transient` does)."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        for n in range(20):
            with open(self.creds_path, "rb") as f:  # (CR1 rotates it: read at each try, as credential_process)
                c = json.loads(f.read())
            url = f"{self.s3_url}/{self.bucket}/{path}"
            req = AWSRequest(method, url, data=body, headers=headers or {})
            S3SigV4Auth(Credentials(c["AccessKeyId"], c["SecretAccessKey"]), "s3", self.region).add_auth(req)
            status, _ = await request(method, url, body, dict(req.headers.items()))
            if status < 300 or status in ok:
                return status
            await asyncio.sleep(min(0.5, 0.05 * 2 ** n))
        raise RuntimeError(f"{method} {path}: still failing after 20 tries")

    def tool(self, call: dict) -> str:
        name = call["function"]["name"]
        args = json.loads(call["function"]["arguments"] or "{}")
        repo = os.path.join(self.spec.workspace, "repo")
        if name == "apply_patch":
            path = os.path.join(repo, args["path"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a") as f:
                f.write(args["append"] + "\n")
            return "ok"
        if name == "apply_edits":
            for edit in args["edits"]:
                path = os.path.join(repo, edit["path"])
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(text.replace(edit["old"], edit["new"]))
            return "ok"
        return "exit 0\n" if name == "run_command" else "ok"

    async def run(self) -> int:
        self.say(f"hollow runner attempt={self.attempt} fence={self.fence}")
        messages = [{"role": "system", "content": "hollow"},
                    {"role": "user", "content": f"Task {self.task_id}: carry out the plan step by step."}]
        # as the durable runner starts: its journal listed, its first record read (none on a first attempt)
        await self.s3("GET", f"?list-type=2&prefix={quote(self.prefix + 'journal/', safe='')}")
        await self.s3("GET", f"{self.prefix}journal/0000.json", ok=(404,))
        for step in range(MAX_STEPS):
            await self.go.wait()
            self.announce(f"before-model:{step}")
            out = await self.post(self.model_url + "/chat/completions", self.model_key,
                                  {"model": self.spec.env.get("OPENAI_MODEL", "sandfleet-script"),
                                   "messages": messages})
            reply = out["choices"][0]["message"]
            if not reply.get("tool_calls"):
                self.say("final")
                return 0
            c = reply["tool_calls"][0]
            call = {"id": c["id"], "type": "function",
                    "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
            self.announce(f"before-commit:{step}")
            record = {"step": step, "call": call, "fence": self.fence, "attempt": self.attempt}
            await self.s3("PUT", f"{self.prefix}journal/{step:04d}.json", json.dumps(record).encode(),
                          {"If-None-Match": "*"}, ok=(412,))
            self.announce(f"after-commit:{step}")
            if call["function"]["name"] == "publish":
                args = json.loads(call["function"]["arguments"] or "{}")
                got = await self.post(self.effects_url + "/effects", self.effects_key, args,
                                      {"Idempotency-Key": f"{self.task_id}:{args.get('effect_id')}"})
                result = json.dumps({"receipt": got.get("receipt")})
            else:
                result = self.tool(call)
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": result}]
            await asyncio.sleep(self.hold_s)
        self.say(f"stopped at {MAX_STEPS} steps")
        return 0



async def request(method: str, url: str, body: bytes, headers: dict, timeout_s: float = 60.0) -> tuple[int, bytes]:
    """One HTTP/1.1 request on its own connection (closed after): (status, body)."""
    rest = url.partition("://")[2]
    addr, _, path = rest.partition("/")
    host, _, port = addr.rpartition(":")
    r, w = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() not in ("host", "content-length"))
        w.write(f"{method} /{path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n{head}\r\n".encode() + body)
        await w.drain()
        raw = await asyncio.wait_for(r.read(), timeout_s)
    finally:
        w.close()
    top, _, rest_ = raw.partition(b"\r\n\r\n")
    status = int(top.split(b" ", 2)[1]) if top.startswith(b"HTTP/") else 599
    if b"transfer-encoding: chunked" in top.lower():
        out, data = b"", rest_
        while data:
            size, _, data = data.partition(b"\r\n")
            n = int(size.split(b";")[0] or b"0", 16)
            if n == 0:
                break
            out, data = out + data[:n], data[n + 2:]
        rest_ = out
    return status, rest_
