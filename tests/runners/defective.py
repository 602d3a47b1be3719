"""A runner with one planted defect, chosen by $DEFECT; otherwise the durable pattern.

It follows the runner contract and imports nothing of the harness (only the
built-in runners' own toolkit, by path). The defects are planted deterministically
(the first attempt crashes at the defect's gap) so a test is caught by the grader
on every run, not by the luck of a kill's timing:

- double_effect: sends `publish` with no Idempotency-Key BEFORE committing the
  step, and attempt 1 dies right after the first effect; attempt 2 sends it again.
- recall: attempt 1 dies right after committing its 3rd step; attempt 2 replays the
  journal but asks the model again for that last recorded step.
- noise: an uninterrupted run appends a random line (not deterministic).
- slow_start: spends 2 s "importing" before its first call (like a big agent framework); otherwise
  the durable pattern. A kill in that time tests nothing: `not_exercised`.
- leak_upload: starts a multipart upload under its prefix and never completes or aborts it;
  otherwise the durable pattern (the store audit must pin the leak on this task).
- torn_apply: keeps its workspace as a per-file mirror in the store, commits a step to the journal
  BEFORE applying it, and on resume restores the mirror instead of replaying the journal. A
  multi-file apply (`apply_edits`) mirrors file by file; attempt 1 dies after the 2nd file (except in a
  reference run, `ref-*`), so the resumed attempt trusts a half-renamed tree (`no_torn_apply`).
- stale_creds: never resolves credentials again after a 403 (keeps its first client), so a key rotated
  at the store (CR1) leaves it retrying a dead key until its deadline.
- key_cache: reads its store key once, at its start, into its environment (`AWS_ACCESS_KEY_ID`, which boto3
  prefers to `credential_process`), so re-resolving finds the same key; a failed store call is retried every
  `KEY_CACHE_RETRY_S` (1 s) for `KEY_CACHE_TRIES` (8) tries, then it gives up (exit 1). Under CR1 its attempt sends
  the rotated-away key to its end; the next attempt gets a fresh key and finishes: the hollow pass that
  `credentials_reresolved` names.
- notice: the durable pattern, plus a SIGTERM handler that reads `$SANDFLEET_NOTICE` (PK2) and logs it.
- notice_exit0: the durable pattern, plus a SIGTERM handler that logs the notice and exits 0 at once, within the
  grace ("shut down cleanly"): exit 0 says the task is done, so the harness takes its unfinished workspace as the
  artifact (a spot notice the runner handled: the receipt says it exited in the grace, no SIGKILL).
- daemon: the durable pattern, but it first starts a detached process (its own session) that is still
  running when it exits 0 (`no_outliving_process`).
- storm: the durable pattern, but a failed store call is retried at once, with no backoff: an outage (ST1)
  turns into hundreds of identical failing requests a second (`retry_loop`'s retry storm).
- hang: attempt 1 (not a reference) goes silent for good right after committing its 2nd step: no model call,
  effect or store request (the harness must end it at `liveness_s`, not at the deadline).
- hang_always: every attempt, references too, goes silent for good after its 2nd step (its own fault-free run
  fails: the runner's failure, exit 1, not a broken positive control).
- flood: the first attempts of tasks t000 and t001 flood the model endpoint and the effects service with
  their own valid keys before the durable pattern: 8 MiB bodies from 16 threads each, a `Content-Length: -1` and a chunked body
  streamed for as long as the service reads, for 4 s, then 200 idle connections; it logs what each got (the
  tasks beside it must pass, and the harness's heap stay bounded). Every other task is durable.
- effect_gap: sends `publish` with no Idempotency-Key BEFORE committing the step, and
  never dies by itself: only a kill that lands in that gap shows it (boundary
  enumeration must find it every time).
"""
from __future__ import annotations

import json
import os
import secrets
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "fleet", "runners"))

from agentkit import (Env, TaskStore, apply_edits, apply_patch, chat, log, main_guard, publish,  # noqa: E402
                      tool_messages)
from durable import run_tool  # noqa: E402

DEFECT = os.environ.get("DEFECT", "")


def _on_notice(signum, frame) -> None:
    """DEFECT=notice: on SIGTERM read the spot notice the harness announced, log it, exit like a killed job
    (notice_exit0: exit 0, as a runner that "shuts down cleanly" does)."""
    path = os.environ.get("SANDFLEET_NOTICE", "")
    try:
        with open(path) as f:
            log(f"notice: {f.read().strip()}")
    except OSError as exc:
        log(f"notice: unreadable: {exc}")
    os._exit(0 if DEFECT == "notice_exit0" else 143)


def _cache_key() -> None:
    """DEFECT=key_cache: the key `credential_process` prints now, kept for good in the environment (boto3 reads
    AWS_ACCESS_KEY_ID before the config's credential_process: re-resolving finds the same key); store calls are
    retried every KEY_CACHE_RETRY_S for KEY_CACHE_TRIES tries."""
    import boto3
    import tenacity

    creds = boto3.session.Session().get_credentials().get_frozen_credentials()
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = creds.access_key, creds.secret_key
    for name in ("keys", "get", "put", "delete", "put_new"):
        r = getattr(TaskStore, name).retry
        r.wait = tenacity.wait_fixed(float(os.environ.get("KEY_CACHE_RETRY_S", "1")))
        r.stop = tenacity.stop_after_attempt(int(os.environ.get("KEY_CACHE_TRIES", "8")))
    log(f"read the store key {creds.access_key[:8]}... once")


def _flood(env: Env, seconds: float = 4.0) -> None:
    """DEFECT=flood: hostile traffic from inside the sandbox, bounded in time; logs a count of each outcome."""
    import collections
    import select
    import socket
    import threading
    import time
    import urllib.parse

    got: collections.Counter = collections.Counter()
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def note(what: str) -> None:
        with lock:
            got[what] += 1

    def connect(url: str) -> socket.socket:
        u = urllib.parse.urlsplit(url)
        s = socket.create_connection((u.hostname, u.port), timeout=5)
        s.settimeout(5)
        return s

    def answer(s: socket.socket) -> str:
        try:
            head = s.recv(64)
        except OSError as exc:
            return type(exc).__name__
        return head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/") else "closed"

    def request(url: str, key: str, path: str, length: str, body_bytes: int) -> str:
        try:
            s = connect(url)
        except OSError as exc:  # (a loaded machine: the relay did not take it within the timeout)
            return f"connect {type(exc).__name__}"
        try:
            s.sendall(f"POST {urllib.parse.urlsplit(url).path}{path} HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {key}\r\n{length}\r\n\r\n".encode())
            # a service that refuses without reading answers at once (and closes): take that answer first
            if select.select([s], [], [], 0.3)[0]:
                return answer(s)
            sent, chunk = 0, b"x" * (1 << 20)
            while sent < body_bytes and time.monotonic() < stop:
                s.sendall(chunk)
                sent += len(chunk)
            return answer(s)
        except OSError as exc:
            return type(exc).__name__
        finally:
            s.close()

    targets = [(env.model_url, env.model_key, "/chat/completions"), (env.effects_url, env.effects_key, "/effects")]

    def big_bodies(i: int) -> None:
        url, key, path = targets[i % 2]
        while time.monotonic() < stop:
            note(f"8MiB:{request(url, key, path, f'Content-Length: {8 << 20}', 8 << 20)}")

    def unbounded(length: str, tag: str) -> None:
        for url, key, path in targets:
            note(f"{tag}:{request(url, key, path, length, 1 << 30)}")

    threads = [threading.Thread(target=big_bodies, args=(i,)) for i in range(16)]
    threads += [threading.Thread(target=unbounded, args=("Content-Length: -1", "negative")),
                threading.Thread(target=unbounded, args=("Transfer-Encoding: chunked", "chunked"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    idle = []  # then connections held open and idle (the sandbox's relay closes those past its cap)
    for _ in range(200):
        try:
            idle.append(connect(env.model_url))
        except OSError:
            note("idle:refused")
    time.sleep(0.5)
    closed = 0
    for s in idle:
        s.setblocking(False)
        try:
            closed += s.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    got["idle:closed by the harness"] += closed
    got["idle:held"] += len(idle) - closed
    log("flood: " + ", ".join(f"{k} x{v}" for k, v in sorted(got.items())))


def run() -> None:
    if DEFECT in ("notice", "notice_exit0"):
        import signal

        signal.signal(signal.SIGTERM, _on_notice)
    if DEFECT == "slow_start":
        import time

        time.sleep(2.0)
    if DEFECT == "daemon":
        import subprocess

        subprocess.Popen(["sleep", "300"], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if DEFECT == "storm":
        import tenacity

        for name in ("keys", "get", "put", "delete", "put_new"):
            getattr(TaskStore, name).retry.wait = tenacity.wait_none()
    if DEFECT == "key_cache":
        _cache_key()
    env = Env.load()
    store = TaskStore(env)
    if DEFECT == "flood" and env.task_id in ("t000", "t001") and env.attempt == 1:
        _flood(env)
    if DEFECT == "stale_creds":  # keeps its first client: a rejected key is never resolved again
        import agentkit

        agentkit.s3 = lambda _env: store.client
    if DEFECT == "leak_upload" and env.attempt == 1:
        store.client.create_multipart_upload(Bucket=env.bucket, Key=f"{env.prefix}snapshot.tar")
        log("started a multipart upload and walked away")
    messages = env.first_messages()
    records = [json.loads(store.get(k)) for k in store.keys("journal/")]
    repo = os.path.join(env.workspace, "repo")
    if DEFECT == "torn_apply":  # restore the mirror; recorded steps are taken as done (the defect)
        for key in store.keys("mirror/"):
            with open(os.path.join(repo, key[len(env.prefix + "mirror/"):]), "wb") as f:
                f.write(store.get(key))
        for rec in records:
            messages += tool_messages(rec["call"], "ok (restored)")
    else:
        for rec in records:
            messages += tool_messages(rec["call"], run_tool(env, rec["call"]))
    if DEFECT == "recall" and records:
        log("re-asking the model for the last recorded step")
        chat(env, messages[:-2])  # the planted recall: that step's result is already recorded
    step = len(records)
    while True:
        reply = chat(env, messages)
        if not reply.get("tool_calls"):
            break
        call = reply["tool_calls"][0]
        call = {"id": call["id"], "type": "function", "function": call["function"]}
        if DEFECT == "effect_gap" and call["function"]["name"] == "publish":
            publish(env, json.loads(call["function"]["arguments"]), idempotency_key=None)  # effect before commit
            result = "sent"
        elif DEFECT == "double_effect" and call["function"]["name"] == "publish":
            publish(env, json.loads(call["function"]["arguments"]), idempotency_key=None)  # effect before commit
            if env.attempt == 1:
                log("dying between the effect and its commit")
                os._exit(3)
            result = "sent"
        elif DEFECT == "torn_apply":
            store.put_new(f"{env.prefix}journal/{step:04d}.json",
                          json.dumps({"step": step, "call": call, "fence": env.fence}).encode())
            args = json.loads(call["function"]["arguments"] or "{}")
            touched = [e["path"] for e in args.get("edits", [])] or ([args["path"]] if "path" in args else [])
            for i, path in enumerate(touched):
                if call["function"]["name"] == "apply_edits":
                    apply_edits(env, {"edits": [args["edits"][i]]})
                elif call["function"]["name"] == "apply_patch":
                    apply_patch(env, args)
                with open(os.path.join(repo, path), "rb") as f:
                    store.put(f"{env.prefix}mirror/{path}", f.read())
                # the planted kill; a reference (uninterrupted) run, `ref-*`, is left alone
                if call["function"]["name"] == "apply_edits" and i == 1 and env.attempt == 1 \
                        and not env.task_id.startswith("ref-"):
                    log("dying halfway through a multi-file apply")
                    os._exit(3)
            result = "ok" if touched else run_tool(env, call)
            messages += tool_messages(call, result)
            step += 1
            continue
        else:
            result = None
        store.put_new(f"{env.prefix}journal/{step:04d}.json",
                      json.dumps({"step": step, "call": call, "fence": env.fence}).encode())
        if DEFECT == "recall" and env.attempt == 1 and step == 2:
            log("dying right after a commit")
            os._exit(3)
        if (DEFECT == "hang" and env.attempt == 1 and step == 1 and not env.task_id.startswith("ref-")) or \
                (DEFECT == "hang_always" and step == 1):
            import time

            log("hanging, silent")
            time.sleep(3600)
        messages += tool_messages(call, result if result is not None else run_tool(env, call))
        step += 1
    if DEFECT == "noise":
        with open(os.path.join(env.workspace, "repo", "NOISE"), "w") as f:
            f.write(secrets.token_hex(8) + "\n")


if __name__ == "__main__":
    main_guard(run)
