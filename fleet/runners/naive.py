"""The negative control. It patches the artifact in the store in place after every
step, saves its progress only every 3 steps, and on resume starts again from the
saved progress, asking the model again for every step since. An interruption
between two progress saves therefore applies steps twice and re-asks the model."""
from __future__ import annotations

import json

from fleet import workload
from fleet.runners.common import RunnerEnv, TaskStore, announce, ask_model, log, main_guard, write_workspace

CHECKPOINT_EVERY = 3


def run() -> None:
    env = RunnerEnv.from_environ()
    store = TaskStore(env)

    def get_text(key: str) -> str | None:
        body = store.get(key)
        return None if body is None else body.decode()

    progress = json.loads(get_text(f"{env.prefix}naive/progress.json") or '{"done": 0}')
    done = progress["done"]
    files = workload.fixture(env.seed)
    for path in files:  # whatever is in the store now, including uncheckpointed in-place writes
        text = get_text(f"{env.prefix}artifact/{path}")
        if text is not None:
            files[path] = text
    log(f"resumed attempt={env.attempt} from progress={done}")
    write_workspace(env, files)
    for step in range(done, env.steps):
        announce(env, f"before-model:{step}")
        answer = ask_model(env, step)
        files = workload.apply(files, answer["decision"])
        path = answer["decision"]["file"]
        store.put(f"{env.prefix}artifact/{path}", files[path].encode())
        write_workspace(env, files)
        log(f"step {step} applied in place")
        if (step + 1) % CHECKPOINT_EVERY == 0:
            store.put(f"{env.prefix}naive/progress.json", json.dumps({"done": step + 1}).encode())
            log(f"progress saved at {step + 1}")
    store.write_artifact(files)


def main() -> None:
    main_guard(run)


if __name__ == "__main__":
    main()
