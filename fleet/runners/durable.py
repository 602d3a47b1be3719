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
from fleet.runners.common import RunnerEnv, TaskStore, announce, ask_model, log, main_guard, write_workspace


def run() -> None:
    env = RunnerEnv.from_environ()
    store = TaskStore(env)
    jprefix = f"{env.prefix}journal/"

    def commit(key: str, record: dict) -> dict:
        """One conditional commit; on 412 the record already there wins."""
        if store.put_new(key, json.dumps(record).encode()):
            return record
        log(f"commit {key} lost the race; adopting the committed record")
        return json.loads(store.get(key))

    files = workload.fixture(env.seed)
    done = 0
    for key in store.keys("journal/"):
        rec = json.loads(store.get(key))
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
    store.write_artifact(files)


def main() -> None:
    main_guard(run)


if __name__ == "__main__":
    main()
