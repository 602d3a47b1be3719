"""A plain OpenAI-SDK agent with a journal in the store: the pattern we recommend.

It never imports sandfleet. `OpenAI()` reads OPENAI_BASE_URL and OPENAI_API_KEY;
`boto3.client("s3")` reads AWS_ENDPOINT_URL_S3 and AWS_CONFIG_FILE. Every tool
call the model asks for is committed to `<prefix>journal/<step>.json` with a
conditional write (IfNoneMatch="*", carrying the fence) BEFORE it runs; on resume
the journal rebuilds the workspace and the conversation, so the model is never
asked again for a recorded step, and every external effect carries an
Idempotency-Key derived from the task and the effect, so re-running it after a
kill is a deduplicated retry.
"""
from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

import boto3
import botocore.exceptions
from botocore.config import Config
from openai import OpenAI
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

TASK = os.environ["SANDFLEET_TASK_ID"]
FENCE = int(os.environ["SANDFLEET_FENCE"])
BUCKET, PREFIX = os.environ["SANDFLEET_S3_BUCKET"], os.environ["SANDFLEET_S3_PREFIX"]
REPO = os.environ["SANDFLEET_REPO"]
EFFECTS, EFFECTS_KEY = os.environ["SANDFLEET_EFFECTS_URL"], os.environ["SANDFLEET_EFFECTS_KEY"]
MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
TRANSIENT = {"ServiceUnavailable", "SlowDown", "InternalError", "RequestTimeout", "503", "500"}


def transient(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code")) in TRANSIENT
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return isinstance(exc, (botocore.exceptions.BotoCoreError, OSError))


retrying = retry(retry=retry_if_exception(transient), wait=wait_exponential(multiplier=0.05, max=1),
                 stop=stop_after_delay(120), reraise=True)
s3 = boto3.client("s3", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                      request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required"))
llm = OpenAI()


@retrying
def journal_keys() -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX + "journal/")
    return sorted(o["Key"] for p in pages for o in p.get("Contents", []))


@retrying
def get(key: str) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


@retrying
def commit(key: str, record: dict) -> dict:
    """Conditional create; if the step is already committed (412), the stored record wins."""
    try:
        s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(record).encode(), IfNoneMatch="*")
        return record
    except botocore.exceptions.ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) in ("PreconditionFailed", "412"):
            return get(key)
        raise


@retrying
def publish(args: dict) -> str:
    req = urllib.request.Request(EFFECTS + "/effects", data=json.dumps(args).encode(), method="POST", headers={
        "Authorization": f"Bearer {EFFECTS_KEY}", "Content-Type": "application/json",
        "Idempotency-Key": f"{TASK}:{args['effect_id']}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def run_tool(name: str, args: dict) -> str:
    if name == "apply_patch":
        path = os.path.join(REPO, args["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            f.write(args["append"] + "\n")
        return "ok"
    if name == "publish":
        return publish(args)
    if name == "run_tests":
        return "ok"
    return f"unknown tool {name}"


def main() -> None:
    messages = [{"role": "system", "content": "You are a coding agent. Use the tools, one call at a time."},
                {"role": "user", "content": f"Task {TASK}: carry out the plan."}]
    records = [get(k) for k in journal_keys()]
    for rec in records:  # resume: rebuild workspace and conversation from the journal
        call = rec["call"]
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"],
                      "content": run_tool(call["function"]["name"], json.loads(call["function"]["arguments"]))}]
    step = len(records)
    print(f"resumed with {step} recorded steps (fence {FENCE})", flush=True)
    while True:
        msg = llm.chat.completions.create(model=MODEL, messages=messages).choices[0].message
        if not msg.tool_calls:
            print("done:", msg.content, flush=True)
            return
        tc = msg.tool_calls[0]
        call = {"id": tc.id, "type": "function", "function": {"name": tc.function.name,
                                                               "arguments": tc.function.arguments}}
        rec = commit(f"{PREFIX}journal/{step:04d}.json", {"step": step, "call": call, "fence": FENCE})
        call = rec["call"]
        result = run_tool(call["function"]["name"], json.loads(call["function"]["arguments"]))
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": result}]
        step += 1


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # noqa: BLE001 - a failed attempt exits non-zero; the harness starts the next
        print(f"failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
