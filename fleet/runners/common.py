"""What every built-in runner shares: the runner contract's environment, an S3
client that takes its key from the AWS config's `credential_process`, the model
client, kill-window announcements, and retries for transient store errors."""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from dataclasses import dataclass

import boto3
import botocore.exceptions
from botocore.config import Config
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

TRANSIENT_CODES = {"ServiceUnavailable", "SlowDown", "InternalError", "RequestTimeout", "503", "500",
                   "Throttling", "RequestTimeTooSkewed", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                   "AccessDenied"}


@dataclass
class RunnerEnv:
    task_id: str
    attempt: int
    fence: int
    workspace: str
    endpoint: str
    bucket: str
    prefix: str
    model_url: str
    checkpoint: str
    seed: int
    steps: int

    @classmethod
    def from_environ(cls) -> "RunnerEnv":
        e = os.environ
        return cls(task_id=e["SANDFLEET_TASK_ID"], attempt=int(e["SANDFLEET_ATTEMPT"]),
                   fence=int(e["SANDFLEET_FENCE"]), workspace=e["SANDFLEET_WORKSPACE"],
                   endpoint=e["SANDFLEET_S3_ENDPOINT"], bucket=e["SANDFLEET_S3_BUCKET"],
                   prefix=e["SANDFLEET_S3_PREFIX"], model_url=e["SANDFLEET_MODEL_URL"],
                   checkpoint=e.get("SANDFLEET_CHECKPOINT", ""), seed=int(e["SANDFLEET_SEED"]),
                   steps=int(e["SANDFLEET_STEPS"]))


def log(msg: str) -> None:
    print(f"{time.time():.3f} {msg}", flush=True)


def announce(env: RunnerEnv, name: str) -> None:
    """Announce a named kill window (PK5 fires exactly here)."""
    log(f"checkpoint {name}")
    if env.checkpoint:
        with open(env.checkpoint, "a") as f:
            f.write(json.dumps({"t": time.time(), "name": name, "attempt": env.attempt}) + "\n")


def s3(env: RunnerEnv):
    session = boto3.session.Session()  # AWS_CONFIG_FILE -> credential_process
    return session.client("s3", endpoint_url=env.endpoint, config=Config(
        retries={"max_attempts": 1, "mode": "standard"}, s3={"addressing_style": "path"},
        connect_timeout=2, read_timeout=10,
        request_checksum_calculation="when_required", response_checksum_validation="when_required"))


def error_code(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return type(exc).__name__


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        return error_code(exc) in TRANSIENT_CODES
    return isinstance(exc, (botocore.exceptions.BotoCoreError, OSError))


def _note_retry(state) -> None:
    log(f"retry {state.fn.__name__ if state.fn else '?'} after {error_code(state.outcome.exception())}")


# Transient store and model errors are retried for up to two minutes; the task deadline ends it sooner.
transient = retry(retry=retry_if_exception(_transient), wait=wait_exponential(multiplier=0.05, max=0.5),
                  stop=stop_after_delay(120), reraise=True, before_sleep=_note_retry)


@transient
def ask_model(env: RunnerEnv, step: int) -> dict:
    body = json.dumps({"task_id": env.task_id, "seed": env.seed, "step": step,
                       "attempt": env.attempt}).encode()
    req = urllib.request.Request(env.model_url + "/v1/step", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def write_workspace(env: RunnerEnv, files: dict[str, str]) -> None:
    for path, text in files.items():
        full = os.path.join(env.workspace, "repo", path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)


class TaskStore:
    """The task's prefix in the bucket, with transient errors retried on every call."""

    def __init__(self, env: RunnerEnv):
        self.env = env
        self.client = s3(env)

    @transient
    def keys(self, under: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.env.bucket, Prefix=self.env.prefix + under)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    @transient
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        try:
            return self.client.get_object(Bucket=self.env.bucket, Key=key)["Body"].read()
        except Exception as exc:  # noqa: BLE001
            if is_missing(exc):
                return None
            raise

    @transient
    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.env.bucket, Key=key, Body=body)

    @transient
    def put_new(self, key: str, body: bytes) -> bool:
        """Conditional create (`IfNoneMatch="*"`); False when the key already exists."""
        try:
            self.client.put_object(Bucket=self.env.bucket, Key=key, Body=body, IfNoneMatch="*")
            return True
        except Exception as exc:  # noqa: BLE001
            if error_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise

    def write_artifact(self, files: dict[str, str]) -> None:
        """Every artifact file, then the manifest last: the manifest marks the artifact complete."""
        from fleet import workload

        env = self.env
        for path, text in sorted(files.items()):
            self.put(f"{env.prefix}artifact/{path}", text.encode())
        manifest = {"files": sorted(files), "fingerprint": workload.fingerprint(files), "fence": env.fence,
                    "attempt": env.attempt}
        self.put(f"{env.prefix}artifact.manifest.json", json.dumps(manifest).encode())
        log("done")


def is_missing(exc: BaseException) -> bool:
    return isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in ("NoSuchKey", "404", "NotFound")


def main_guard(fn) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - a runner reports and exits non-zero
        log(f"runner failed: {type(exc).__name__}: {exc}")
        sys.exit(1)
