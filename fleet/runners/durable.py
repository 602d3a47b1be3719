"""The reference runner. For each step it asks the model once, then records the
decision and its effect in the store in one conditional commit
(`IfNoneMatch="*"` on `journal/<step>`, carrying the fence). On resume it rebuilds
the repository from the journal and never asks the model again for a recorded
step. If a commit loses the race (412: a zombie or an earlier attempt committed
that step), it adopts the committed record. The artifact is written last, from
the journal, so every attempt writes the same bytes."""
from __future__ import annotations

import hashlib
import json

from fleet import workload
from fleet.runners.common import (RunnerEnv, announce, ask_model, error_code, log, main_guard, s3,
                                  transient, write_artifact, write_workspace)


def run() -> None:
    env = RunnerEnv.from_environ()
    client = s3(env)
    jprefix = f"{env.prefix}journal/"

    @transient
    def list_journal() -> list[str]:
        keys, token = [], None
        while True:
            kw = {"Bucket": env.bucket, "Prefix": jprefix}
            if token:
                kw["ContinuationToken"] = token
            page = client.list_objects_v2(**kw)
            keys += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return sorted(keys)
            token = page["NextContinuationToken"]

    @transient
    def get(key: str) -> dict:
        return json.loads(client.get_object(Bucket=env.bucket, Key=key)["Body"].read())

    @transient
    def commit(key: str, record: dict) -> dict:
        """One conditional commit; on 412 the record already there wins."""
        try:
            client.put_object(Bucket=env.bucket, Key=key, Body=json.dumps(record).encode(), IfNoneMatch="*")
            return record
        except Exception as exc:  # noqa: BLE001
            if error_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                log(f"commit {key} lost the race; adopting the committed record")
                return get(key)
            raise

    @transient
    def put(key: str, body: bytes) -> None:
        client.put_object(Bucket=env.bucket, Key=key, Body=body)

    files = workload.fixture(env.seed)
    done = 0
    for key in list_journal():
        rec = get(key)
        if rec["step"] != done:
            raise RuntimeError(f"journal gap: expected step {done}, found {rec['step']} at {key}")
        files = workload.apply(files, rec["decision"])
        done += 1
    log(f"resumed attempt={env.attempt} fence={env.fence} recorded_steps={done}")
    write_workspace(env, files)

    for step in range(done, env.steps):
        announce(env, f"before-model:{step}")
        answer = ask_model(env, step)
        after = workload.apply(files, answer["decision"])
        record = {"step": step, "decision": answer["decision"], "nonce": answer["nonce"],
                  "tokens": answer["tokens"], "fence": env.fence, "attempt": env.attempt,
                  "effect": {"file": answer["decision"]["file"],
                             "sha256": hashlib.sha256(after[answer["decision"]["file"]].encode()).hexdigest()}}
        announce(env, f"before-commit:{step}")
        record = commit(f"{jprefix}{step:04d}.json", record)
        files = workload.apply(files, record["decision"])
        write_workspace(env, files)
        log(f"step {step} committed fence={record['fence']}")
        announce(env, f"after-commit:{step}")

    announce(env, "before-artifact")
    write_artifact(env, put, files)


def main() -> None:
    main_guard(run)


if __name__ == "__main__":
    main()
