"""A small agent toolkit shared by the built-in runners. It follows the public runner
contract (docs/runner-contract.md) and nothing else: everything comes from the
environment, the model is an OpenAI-compatible endpoint, tools act on the
workspace or on the effects service, the store is S3 through boto3 with keys from
`credential_process`. It imports no sandfleet module: the built-in runners are
black boxes like any user's runner (they run as `python <this dir>/durable.py`).
"""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import boto3
import botocore.exceptions
from botocore.config import Config
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

TRANSIENT_CODES = {"ServiceUnavailable", "SlowDown", "InternalError", "RequestTimeout", "503", "500",
                   "Throttling", "RequestTimeTooSkewed"}
# a rejected key: resolve credentials again (credential_process prints the current key) and retry
CREDENTIAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "403",
                    "InvalidToken", "TokenRefreshRequired"}
MODEL = os.environ.get("OPENAI_MODEL", "sandfleet-script")
SYSTEM = ("You are a coding agent. Patch the repository in ./repo with the tools you are given, "
          "one tool call at a time, until the work is done.")


@dataclass
class Env:
    task_id: str
    attempt: int
    fence: int
    workspace: str
    s3_endpoint: str
    bucket: str
    prefix: str
    model_url: str
    model_key: str
    effects_url: str
    effects_key: str
    checkpoint: str

    @classmethod
    def load(cls) -> "Env":
        e = os.environ
        return cls(task_id=e["SANDFLEET_TASK_ID"], attempt=int(e["SANDFLEET_ATTEMPT"]),
                   fence=int(e["SANDFLEET_FENCE"]), workspace=e.get("SANDFLEET_WORKSPACE", os.getcwd()),
                   s3_endpoint=e["SANDFLEET_S3_ENDPOINT"], bucket=e["SANDFLEET_S3_BUCKET"],
                   prefix=e["SANDFLEET_S3_PREFIX"], model_url=e["OPENAI_BASE_URL"].rstrip("/"),
                   model_key=e["OPENAI_API_KEY"], effects_url=e["SANDFLEET_EFFECTS_URL"].rstrip("/"),
                   effects_key=e["SANDFLEET_EFFECTS_KEY"], checkpoint=e.get("SANDFLEET_CHECKPOINT", ""))

    def first_messages(self) -> list[dict]:
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Task {self.task_id}: carry out the plan step by step."}]


def log(msg: str) -> None:
    print(f"{time.time():.3f} {msg}", flush=True)


def announce(env: Env, name: str) -> None:
    """Announce a named kill window (the harness may fire a fault exactly here)."""
    log(f"checkpoint {name}")
    if env.checkpoint:
        with open(env.checkpoint, "a") as f:
            f.write(json.dumps({"t": time.time(), "name": name, "attempt": env.attempt}) + "\n")


# ------------------------------------------------------------------ retries
class HttpStatus(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:200]}")
        self.status = status


def error_code(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    if isinstance(exc, HttpStatus):
        return str(exc.status)
    return type(exc).__name__


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        return error_code(exc) in TRANSIENT_CODES | CREDENTIAL_CODES
    if isinstance(exc, HttpStatus):
        return exc.status in (408, 409, 429) or exc.status >= 500
    return isinstance(exc, (botocore.exceptions.BotoCoreError, OSError))


def _note_retry(state) -> None:
    log(f"retry {state.fn.__name__ if state.fn else '?'} after {error_code(state.outcome.exception())}")


# Transient errors are retried for up to two minutes; the task deadline ends it sooner.
transient = retry(retry=retry_if_exception(_transient), wait=wait_exponential(multiplier=0.05, max=0.5),
                  stop=stop_after_delay(120), reraise=True, before_sleep=_note_retry)


def _post(url: str, key: str, payload: dict, headers: dict | None = None, timeout: float = 60) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise HttpStatus(exc.code, exc.read().decode(errors="replace")) from None


# ------------------------------------------------------------------ model and tools
@transient
def chat(env: Env, messages: list[dict]) -> dict:
    """One chat completion; returns the assistant message."""
    out = _post(env.model_url + "/chat/completions", env.model_key, {"model": MODEL, "messages": messages})
    return out["choices"][0]["message"]


@transient
def publish(env: Env, args: dict, idempotency_key: str | None) -> dict:
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return _post(env.effects_url + "/effects", env.effects_key, args, headers)


def apply_patch(env: Env, args: dict) -> str:
    path = os.path.join(env.workspace, "repo", args["path"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(args["append"] + "\n")
    return "ok"


def apply_edits(env: Env, args: dict, after_file=None) -> str:
    """One change across several files, file by file, in place (a kill between two files tears it)."""
    done = []
    for edit in args["edits"]:
        path = os.path.join(env.workspace, "repo", edit["path"])
        with open(path) as f:
            body = f.read()
        if edit["old"] in body:
            with open(path, "w") as f:
                f.write(body.replace(edit["old"], edit["new"]))
            done.append(edit["path"])
        if after_file is not None:
            after_file(edit["path"])
    return f"edited {len(done)} of {len(args['edits'])} files: {', '.join(done)}"


def run_command(env: Env, args: dict) -> str:
    """A shell tool: `sh -c command` in the repository; its output is the result."""
    import subprocess

    proc = subprocess.run(["sh", "-c", args["command"]], cwd=os.path.join(env.workspace, "repo"),
                          capture_output=True, text=True, timeout=float(args.get("timeout_s") or 60))
    return f"exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"


def run_tests(env: Env) -> str:
    n = sum(len(fs) for _, _, fs in os.walk(os.path.join(env.workspace, "repo")))
    return f"ok: {n} files checked"


def tool_messages(call: dict, result: str) -> list[dict]:
    """The assistant tool-call message and its tool result, as a conversation records them."""
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": result}]


# ------------------------------------------------------------------ store
def s3(env: Env):
    session = boto3.session.Session()  # AWS_CONFIG_FILE -> credential_process
    return session.client("s3", endpoint_url=env.s3_endpoint, config=Config(
        retries={"max_attempts": 1, "mode": "standard"}, s3={"addressing_style": "path"},
        connect_timeout=2, read_timeout=10,
        request_checksum_calculation="when_required", response_checksum_validation="when_required"))


def is_missing(exc: BaseException) -> bool:
    return isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in ("NoSuchKey", "404", "NotFound")


def _refresh_on_403(fn):
    """A call whose key was rejected gets a new client (credentials resolved again) before it is retried."""
    import functools

    @functools.wraps(fn)
    def call(self, *a, **kw):
        try:
            return fn(self, *a, **kw)
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) in CREDENTIAL_CODES:
                log(f"store rejected the key ({error_code(exc)}); resolving credentials again")
                holder = getattr(self, "store", self)  # TaskStore, or Snapshots (which uses its store's client)
                holder.client = s3(holder.env)
            raise
    return call


class TaskStore:
    """The task's prefix in the bucket: transient errors retried on every call, a rejected key re-resolved."""

    def __init__(self, env: Env):
        self.env = env
        self.client = s3(env)

    @transient
    @_refresh_on_403
    def keys(self, under: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.env.bucket, Prefix=self.env.prefix + under)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    @transient
    @_refresh_on_403
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        try:
            return self.client.get_object(Bucket=self.env.bucket, Key=key)["Body"].read()
        except Exception as exc:  # noqa: BLE001
            if is_missing(exc):
                return None
            raise

    @transient
    @_refresh_on_403
    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.env.bucket, Key=key, Body=body)

    @transient
    @_refresh_on_403
    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.env.bucket, Key=key)

    @transient
    @_refresh_on_403
    def put_new(self, key: str, body: bytes) -> bool:
        """Conditional create (`IfNoneMatch="*"`); False when the key already exists."""
        try:
            self.client.put_object(Bucket=self.env.bucket, Key=key, Body=body, IfNoneMatch="*")
            return True
        except Exception as exc:  # noqa: BLE001
            if error_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise


# ------------------------------------------------------------------ workspace snapshots (multipart)
PART_SIZE = 5 * 1024 * 1024  # S3's smallest part but the last


def tar_repo(env: Env) -> bytes:
    """The repository as a deterministic tar (sorted, mtime 0, no owners): equal trees, equal bytes."""
    import io
    import tarfile

    repo = os.path.join(env.workspace, "repo")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for root, dirs, files in os.walk(repo):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                info = tarfile.TarInfo(os.path.relpath(path, repo))
                with open(path, "rb") as f:
                    data = f.read()
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def untar_repo(env: Env, blob: bytes) -> int:
    """Lay a snapshot over a fresh repo/: regular files only, never outside repo/."""
    import io
    import tarfile

    repo = os.path.realpath(os.path.join(env.workspace, "repo"))
    n = 0
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        for m in tar.getmembers():
            dest = os.path.realpath(os.path.join(repo, m.name))
            if not m.isfile() or not dest.startswith(repo + os.sep):
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(tar.extractfile(m).read())
            n += 1
    return n


def durable_write(path: str, data: bytes) -> None:
    """Crash-safe local state: write a temp file, fsync it, rename it over `path`, fsync the directory (a power loss
    keeps the old bytes or the new ones, never a torn or a missing file)."""
    d = os.path.dirname(path)
    _durable_dirs(d)
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(d)


def _fsync_dir(d: str) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable_dirs(d: str) -> None:
    """`mkdir -p` that survives a power loss: each directory made is made durable by an fsync of its parent."""
    if os.path.isdir(d):
        return
    _durable_dirs(os.path.dirname(d))
    try:
        os.mkdir(d)
    except FileExistsError:
        pass
    _fsync_dir(os.path.dirname(d))


def repo_base(env: Env) -> bytes:
    """The repository as the task handed it over, kept at the first attempt under `.durable/base.tar` (durably): on
    a kept disk (a restarted container) the repo holds an earlier attempt's work, and replaying the journal over it
    would apply every recorded step twice. Later attempts lay this base anew (`reset_repo`) before they replay."""
    path = os.path.join(env.workspace, ".durable", "base.tar")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        blob = tar_repo(env)
        durable_write(path, blob)
        return blob


def reset_repo(env: Env, blob: bytes) -> int:
    """Lay `blob` as the whole repo/: whatever an earlier attempt left there is removed first."""
    import shutil

    repo = os.path.join(env.workspace, "repo")
    shutil.rmtree(repo, ignore_errors=True)
    os.makedirs(repo, exist_ok=True)
    return untar_repo(env, blob)


class Snapshots:
    """Workspace snapshots in the store: `snapshots/<step>.tar` by multipart upload, then a manifest
    `snapshots/<step>.json` with its size and sha256 (a snapshot counts only once its manifest says so and
    the bytes read back match it). Uploads an attempt left incomplete are aborted on the next start."""

    def __init__(self, store: "TaskStore"):
        self.store, self.env = store, store.env
        self.base = f"{self.env.prefix}snapshots/"

    @transient
    @_refresh_on_403
    def _create(self, key: str) -> str:
        return self.store.client.create_multipart_upload(Bucket=self.env.bucket, Key=key)["UploadId"]

    @transient
    @_refresh_on_403
    def _part(self, key: str, upload_id: str, n: int, body: bytes) -> dict:
        r = self.store.client.upload_part(Bucket=self.env.bucket, Key=key, UploadId=upload_id, PartNumber=n,
                                          Body=body)
        return {"PartNumber": n, "ETag": r["ETag"]}

    @transient
    @_refresh_on_403
    def _complete(self, key: str, upload_id: str, parts: list[dict]) -> None:
        self.store.client.complete_multipart_upload(Bucket=self.env.bucket, Key=key, UploadId=upload_id,
                                                    MultipartUpload={"Parts": parts})

    @transient
    @_refresh_on_403
    def abort_stale(self) -> int:
        """Abort every incomplete upload under the task's prefix (left by a killed attempt)."""
        c, n = self.store.client, 0
        for page in c.get_paginator("list_multipart_uploads").paginate(Bucket=self.env.bucket,
                                                                      Prefix=self.env.prefix):
            for u in page.get("Uploads", []):
                c.abort_multipart_upload(Bucket=self.env.bucket, Key=u["Key"], UploadId=u["UploadId"])
                n += 1
        return n

    def save(self, step: int) -> bool:
        import hashlib

        blob = tar_repo(self.env)
        key = f"{self.base}{step:04d}.tar"
        upload_id = self._create(key)
        try:
            parts = [self._part(key, upload_id, i // PART_SIZE + 1, blob[i:i + PART_SIZE])
                     for i in range(0, max(1, len(blob)), PART_SIZE)]
            self._complete(key, upload_id, parts)
        except Exception:
            try:
                self.store.client.abort_multipart_upload(Bucket=self.env.bucket, Key=key, UploadId=upload_id)
            except Exception:  # noqa: BLE001 - the next attempt's abort_stale gets it
                pass
            raise
        manifest = {"step": step, "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        self.store.put(f"{self.base}{step:04d}.json", json.dumps(manifest).encode())
        return True

    def latest(self, below: int) -> tuple[int, bytes] | None:
        """The newest snapshot of a step < `below` whose bytes match its manifest."""
        import hashlib

        steps = sorted({int(k[len(self.base):].split(".")[0]) for k in self.store.keys("snapshots/")
                        if k.endswith(".json")}, reverse=True)
        for step in steps:
            if step >= below:
                continue
            try:
                m = json.loads(self.store.get(f"{self.base}{step:04d}.json") or b"")
                blob = self.store.get(f"{self.base}{step:04d}.tar")
            except ValueError:
                continue
            if blob is not None and len(blob) == m.get("size") and hashlib.sha256(blob).hexdigest() == m.get("sha256"):
                return step, blob
            log(f"snapshot {step} does not match its manifest; not used")
        return None


def main_guard(fn) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - a runner reports and exits non-zero
        log(f"runner failed: {type(exc).__name__}: {exc}")
        sys.exit(1)
