"""A runner that floods the store with small objects under its own prefix until the store refuses one, says in its
log what it got, deletes its flood in one DeleteObjects, then works as the durable reference does.

It pins the per-task store quota (storage/quota.py): the refusal must be a real S3 error a runner can read (403
`QuotaExceeded` through boto3), the flood's objects must be freed by a DeleteObjects (the durable work after it
needs the room), and the wave must grade the task that hit the quota (`within_store_quota`), never let it pass
silently. A reference run (`ref-*`) does not flood. `FLOOD_MAX` bounds the flood (objects; default 400) when no
quota stops it. It imports nothing of the harness (only the built-in runners' toolkit, by path)."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "fleet", "runners"))

import botocore.exceptions  # noqa: E402
from agentkit import Env, error_code, log, main_guard, s3  # noqa: E402
from durable import run  # noqa: E402


def flood(env: Env) -> None:
    client, stored, limit = s3(env), [], int(os.environ.get("FLOOD_MAX", "400"))
    got = f"no error after {limit} objects"
    for i in range(limit):
        key = f"{env.prefix}flood/{i:06d}"
        try:
            client.put_object(Bucket=env.bucket, Key=key, Body=b"flood %06d" % i)
        except botocore.exceptions.ClientError as exc:
            meta = exc.response.get("ResponseMetadata", {})
            got = f"{meta.get('HTTPStatusCode')} {error_code(exc)}: {exc.response.get('Error', {}).get('Message')}"
            break
        stored.append(key)
    log(f"flood: stored {len(stored)} objects, then {got}")
    for i in range(0, len(stored), 1000):
        out = client.delete_objects(Bucket=env.bucket, Delete={"Objects": [{"Key": k} for k in stored[i:i + 1000]],
                                                               "Quiet": True})
        log(f"flood: deleted {len(stored[i:i + 1000]) - len(out.get('Errors') or [])} objects")


def main() -> None:
    env = Env.load()
    if env.attempt == 1 and not env.task_id.startswith("ref-"):
        flood(env)
    run()


if __name__ == "__main__":
    main_guard(main)
