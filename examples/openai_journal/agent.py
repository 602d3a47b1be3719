"""A plain OpenAI-SDK agent that journals every step in the store: the pattern we recommend.

It imports nothing of sandfleet; everything comes from the runner contract's environment.
`OpenAI()` reads OPENAI_BASE_URL / OPENAI_API_KEY, `boto3.client("s3")` reads
AWS_ENDPOINT_URL_S3 / AWS_CONFIG_FILE (its `credential_process` prints the current key).

Per step:
  1. ask the model once for the next tool call;
  2. commit it to `<prefix>journal/<step>.json` with a conditional create
     (`IfNoneMatch="*"`, the record carries SANDFLEET_FENCE). If the key already exists
     (412: an earlier attempt, or a zombie, committed this step first) the stored
     record wins and is the one we act on;
  3. run the tool. `publish` sends an Idempotency-Key derived from the task and the
     effect, so running it again after a kill is a deduplicated retry.

On resume (a new attempt, fresh workspace) the journal is replayed: every recorded
call runs again (the patches rebuild the repo; a publish is a deduplicated retry)
and rebuilds the conversation, so the model is never asked again for a recorded
step. Store errors (503 outage, SlowDown, 5xx, dropped connections) are retried with
backoff for up to two minutes; a 403 makes the next try resolve credentials anew.
"""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

import boto3
import botocore.exceptions
import openai
from botocore.config import Config
from openai import OpenAI
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

TASK = os.environ["SANDFLEET_TASK_ID"]
ATTEMPT = int(os.environ["SANDFLEET_ATTEMPT"])
FENCE = int(os.environ["SANDFLEET_FENCE"])
REPO = os.environ["SANDFLEET_REPO"]
BUCKET = os.environ["SANDFLEET_S3_BUCKET"]
PREFIX = os.environ["SANDFLEET_S3_PREFIX"]
EFFECTS_URL = os.environ["SANDFLEET_EFFECTS_URL"].rstrip("/")
EFFECTS_KEY = os.environ["SANDFLEET_EFFECTS_KEY"]
MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
CHECKPOINT_FILE = os.environ.get("SANDFLEET_CHECKPOINT", "")

SYSTEM = "You are a coding agent. Patch the repository with the tools you are given, one call at a time."
TOOLS = [
    {"type": "function", "function": {
        "name": "apply_patch", "description": "Append one line to a file of the repository (path relative to repo/).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "append": {"type": "string"}},
                       "required": ["path", "append"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "publish", "description": "Send a message to a channel through the effects service.",
        "parameters": {"type": "object", "properties": {
            "effect_id": {"type": "string"}, "channel": {"type": "string"}, "text": {"type": "string"}},
            "required": ["effect_id", "channel", "text"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run the repository's checks; read-only.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
]

RETRY_CODES = {"ServiceUnavailable", "SlowDown", "InternalError", "RequestTimeout", "RequestTimeTooSkewed",
               "Throttling", "500", "502", "503", "504"}
AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "403"}
TAKEN_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}


def log(msg: str) -> None:
    print(f"{time.time():.3f} [{TASK} a{ATTEMPT}] {msg}", flush=True)


def announce(name: str) -> None:
    """Name a kill window (optional in the contract; the harness may aim a fault at it)."""
    if CHECKPOINT_FILE:
        with open(CHECKPOINT_FILE, "a") as f:
            f.write(json.dumps({"t": time.time(), "name": name, "attempt": ATTEMPT}) + "\n")


def code_of(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


# ------------------------------------------------------------------ store
def transient(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        return code_of(exc) in RETRY_CODES | AUTH_CODES
    return isinstance(exc, (botocore.exceptions.BotoCoreError, OSError))


def _before_retry(state) -> None:
    exc = state.outcome.exception()
    if code_of(exc) in AUTH_CODES:  # keys can rotate: the next try resolves them again
        state.args[0].reset()
    log(f"store retry {state.fn.__name__} after {code_of(exc) or type(exc).__name__}")


store_retry = retry(retry=retry_if_exception(transient), wait=wait_exponential(multiplier=0.05, max=1.0),
                    stop=stop_after_delay(120), reraise=True, before_sleep=_before_retry)


class Store:
    """The task's prefix in the bucket; every call is retried on transient errors for up to 2 minutes."""

    def __init__(self) -> None:
        self._client = None

    def reset(self) -> None:
        self._client = None

    @property
    def client(self):
        if self._client is None:  # a new session runs credential_process again
            self._client = boto3.session.Session().client("s3", config=Config(
                s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"},
                connect_timeout=2, read_timeout=10,
                request_checksum_calculation="when_required", response_checksum_validation="when_required"))
        return self._client

    @store_retry
    def keys(self, under: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX + under)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    @store_retry
    def get_json(self, key: str) -> dict:
        return json.loads(self.client.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    @store_retry
    def put_new(self, key: str, record: dict) -> bool:
        """Conditional create; False if the key already exists."""
        try:
            self.client.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(record).encode(), IfNoneMatch="*",
                                   ContentType="application/json")
            return True
        except botocore.exceptions.ClientError as exc:
            if code_of(exc) in TAKEN_CODES:
                return False
            raise


# ------------------------------------------------------------------ model and tools
llm = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY


@retry(retry=retry_if_exception(lambda e: isinstance(e, (openai.APIConnectionError, openai.RateLimitError,
                                                           openai.InternalServerError))),
       wait=wait_exponential(multiplier=0.1, max=2.0), stop=stop_after_delay(120), reraise=True)
def ask(messages: list[dict]):
    return llm.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS).choices[0].message


def _retryable_http(exc: BaseException) -> bool:
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (408, 409, 429) or exc.code >= 500
    return isinstance(exc, OSError)


@retry(retry=retry_if_exception(_retryable_http), wait=wait_exponential(multiplier=0.05, max=1.0),
       stop=stop_after_delay(120), reraise=True)
def publish(args: dict) -> str:
    req = urllib.request.Request(EFFECTS_URL + "/effects", data=json.dumps(args).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {EFFECTS_KEY}",
        "Idempotency-Key": f"{TASK}:{args['effect_id']}"})  # same task + effect -> same key, on every attempt
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read().decode()


def run_tool(call: dict) -> str:
    name = call["function"]["name"]
    args = json.loads(call["function"]["arguments"] or "{}")
    if name == "apply_patch":
        path = os.path.join(REPO, args["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            f.write(args["append"] + "\n")
        return "ok"
    if name == "publish":
        return publish(args)
    if name == "run_tests":
        n = sum(len(files) for _, _, files in os.walk(REPO))
        return f"ok: {n} files checked"
    return f"error: unknown tool {name}"


def exchange(call: dict, result: str) -> list[dict]:
    """The assistant's tool call and the tool's result, as the conversation records them."""
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": result}]


# ------------------------------------------------------------------ the loop
def main() -> None:
    store = Store()
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Task {TASK}: carry out the plan step by step."}]
    step = 0
    for key in store.keys("journal/"):  # resume: replay what earlier attempts committed
        record = store.get_json(key)
        if record["step"] != step:
            raise RuntimeError(f"journal gap: expected step {step}, found {record['step']} at {key}")
        messages += exchange(record["call"], run_tool(record["call"]))
        step += 1
    log(f"start fence={FENCE} replayed_steps={step}")

    while True:
        announce(f"before-model:{step}")
        msg = ask(messages)
        if not msg.tool_calls:
            log(f"final: {msg.content}")
            return
        tc = msg.tool_calls[0]
        call = {"id": tc.id, "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
        record = {"step": step, "call": call, "fence": FENCE, "attempt": ATTEMPT, "t": time.time()}
        key = f"{PREFIX}journal/{step:04d}.json"
        announce(f"before-commit:{step}")
        if not store.put_new(key, record):
            record = store.get_json(key)
            log(f"step {step} was already committed (fence {record.get('fence')}); adopting the stored record")
        announce(f"after-commit:{step}")
        messages += exchange(record["call"], run_tool(record["call"]))
        log(f"step {step} {record['call']['function']['name']} done")
        step += 1


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # noqa: BLE001 - a failed attempt exits non-zero; the harness starts the next one
        log(f"runner failed: {type(exc).__name__}: {exc}")
        sys.exit(1)
