"""Access: what a runner is given to reach the harness, and when it is taken back.

Each attempt gets its own store key (scoped to its task's prefix, at the embedded store), published as the file
its AWS `credential_process` prints, in a directory the sandbox sees read-only; and a model/effects key that
dies with the attempt's lease. `runner_env` is the runner contract's environment (docs/runner-contract.md) as
seen inside the sandbox, where loopback ports relay to the harness's services.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

from cluster import results
from cluster.wave.timeline import Event
from fleet.model_endpoint import MODEL_ID
from fleet.records import PlannedTask
from fleet.runners import HERE as BUILTIN_DIR
from fleet.sandbox import RUN_IN, SANDBOX_UID, WORKSPACE_IN
from storage.credentials import CredentialSource

CONTRACT_VERSION = "1"
# Inside every sandbox's own network namespace: loopback ports relayed to the harness services.
PORT_S3, PORT_MODEL, PORT_EFFECTS = 18000, 18001, 18002
CREDS_IN = f"{RUN_IN}/creds"
RUNNERS_DIR = BUILTIN_DIR


def runtime_binds(runner: dict, never: list) -> tuple[list[str], list[str]]:
    """What a runner needs to see read-only (its code, its interpreter's prefix), and what to hide in it.

    An absolute argv[0] in a `bin` dir, or the interpreter its `#!` line names, brings its installation prefix (a
    venv, and the interpreter a venv points to); any other absolute path on the command line brings its directory
    (a script in /tmp/x brings /tmp/x; a directory brings itself; a path right under a top-level dir such as
    `/tmp/agent.py` or `/tmp/x` brings only itself: never all of /tmp); `workdir` comes whole. Anything under /usr
    or /etc is already there. Paths in `never` (results, the wave's private dir) are covered by an empty tmpfs if a
    bind would show them."""
    binds: set[str] = {RUNNERS_DIR}
    if runner.get("workdir"):
        binds.add(runner["workdir"])
    exe, args = runner["command"][0], runner["command"][1:]
    for a, executable in [(exe, True)] + [(x, True) for x in _interpreter(exe)] + [(x, False) for x in args]:
        if not (os.path.isabs(a) and os.path.exists(a)):
            continue
        for p in {os.path.abspath(a), os.path.realpath(a)}:
            if not executable and os.path.isdir(p):
                want = p  # a directory named on the command line: itself, not the one above it
            else:
                d = os.path.dirname(p)
                want = os.path.dirname(d) if executable and os.path.basename(d) == "bin" else d
            if want in ("/", "") or p.startswith(("/bin/", "/sbin/", "/lib")):
                continue  # the system's own (/bin/true), already there
            # a top-level dir (/tmp, /root, /home, /opt, ...) is everyone's: only the path itself is shown
            binds.add(p if _top_level(want) else want)
    for b in list(binds):
        cfg = os.path.join(b, "pyvenv.cfg")
        if os.path.isfile(cfg):
            for line in open(cfg):
                k, _, v = line.partition("=")
                if k.strip() == "home" and v.strip():
                    binds.add(os.path.dirname(os.path.realpath(v.strip())))
    binds = {b for b in binds
             if b not in ("/", "") and not b.startswith(("/usr/", "/etc/")) and b not in ("/usr", "/etc")}
    hide = sorted({str(n) for n in never for b in binds if str(n).startswith(b.rstrip("/") + "/") or str(n) == b})
    return sorted(binds), hide


def _top_level(d: str) -> bool:
    return d in ("/", "") or os.path.dirname(d.rstrip("/")) == "/"


def _interpreter(exe: str) -> list[str]:
    """The interpreter a script's `#!` line names by its absolute path (`#!/opt/venv/bin/python`), as a second
    argv[0]: the sandbox must see it too. `#!/usr/bin/env python3` names a PATH lookup: nothing more to show."""
    try:
        with open(exe, "rb") as f:
            line = f.readline(512)
    except OSError:
        return []
    if not line.startswith(b"#!"):
        return []
    words = line[2:].decode(errors="replace").split()
    return [words[0]] if words and os.path.isabs(words[0]) and not words[0].startswith(("/usr/", "/bin/")) else []


class Access:
    def __init__(self, parts, wave_id: str, private: Path, runner: dict, timeline):
        """`parts`: the wave's Parts (registry, per-attempt keys, store endpoint); `private`: the wave's mode-0700
        dir (the credential files live under it); `runner`: the plan's runner spec."""
        self.parts = parts
        self.wave_id = wave_id
        self.private = private
        self.runner = runner
        self.timeline = timeline
        self.akids: dict[str, str] = {}  # sandbox id -> its attempt key's id (per-attempt keys only)
        # sandbox id -> every key id it was ever given (CR1 rotates one mid-attempt): a request signed with any of
        # them, its dead rotated-away key too, is that attempt's doing
        self.key_ids: dict[str, list[str]] = {}
        self._ahead: dict = {}  # sandbox id -> the key issued before its lease was taken (issue_ahead)
        self.secrets: list[str] = []  # the store secrets this wave's attempts were given (kept in memory only)

    def _owner(self, sandbox_id: str) -> str:
        """Who holds an attempt's key at the store: a lent fleet's store holds every wave's keys."""
        return f"{self.wave_id}/{sandbox_id}"

    def akids_of(self, sandbox_id: str) -> tuple[str, ...]:
        """Every key id the attempt was given, the ones rotated away or revoked too."""
        return tuple(self.key_ids.get(sandbox_id, ()))

    def creds_dir(self, sandbox_id: str) -> Path:
        return self.private / "creds" / sandbox_id

    def issue_ahead(self, tid: str, sandbox_id: str) -> None:
        """Issue the attempt's key before its lease is taken, for `attempt_credentials`/`remote_credentials` to
        hand out: thousands of attempts starting at once wait their turn at the store's key book, and a lease
        taken first ran out its TTL in that wait (87 s at 10,000 hollow sandboxes; issue 45)."""
        if sandbox_id not in self._ahead:  # kept from a try that found the lease busy (PK6): the same attempt's
            self._ahead[sandbox_id] = self._issue(tid, sandbox_id)  # key, not a new one per try

    def has_ahead(self, sandbox_id: str) -> bool:
        return sandbox_id in self._ahead

    def drop_ahead(self, sandbox_id: str) -> None:
        """The key issued ahead for an attempt that did not get its lease dies unused."""
        if self._ahead.pop(sandbox_id, None) is not None and self.parts.keys is not None:
            self.parts.keys.revoke(self._owner(sandbox_id))

    def _issue(self, tid: str, sandbox_id: str):
        """The attempt's own key, scoped to the task's prefix (the wave's key at an external store)."""
        ahead = self._ahead.pop(sandbox_id, None)
        if ahead is not None:
            return ahead
        creds = self.parts.endpoint.creds
        if self.parts.keys is not None:
            creds = self.parts.keys.issue(self._owner(sandbox_id), self.parts.bucket,
                                          results.task_prefix(self.wave_id, tid))
            self.secrets.append(creds.secret_key)
            self.akids[sandbox_id] = creds.access_key  # the key id (not the secret) attributes its requests
            self.key_ids.setdefault(sandbox_id, []).append(creds.access_key)
        return creds

    def attempt_credentials(self, tid: str, sandbox_id: str) -> str:
        """The attempt's own key in a directory the sandbox sees read-only."""
        creds = self._issue(tid, sandbox_id)
        d = self.creds_dir(sandbox_id)
        d.mkdir(parents=True, exist_ok=True)
        src = CredentialSource(d / results.ATTEMPT_CREDENTIALS)
        src.publish(creds, owner_uid=SANDBOX_UID)
        src.write_aws_config(d / "aws-config", self.parts.endpoint.region,
                             source_path=f"{CREDS_IN}/{results.ATTEMPT_CREDENTIALS}")
        os.chmod(d, 0o755)
        return str(d)

    def remote_credentials(self, tid: str, sandbox_id: str) -> dict:
        """The attempt's own key for a host on another machine: it travels in the Ray call and the host writes it
        on its node (fleet/host/); nothing of it is written here."""
        creds = self._issue(tid, sandbox_id)
        return {"access_key": creds.access_key, "secret_key": creds.secret_key, "region": self.parts.endpoint.region,
                "mount": CREDS_IN}

    async def rotate(self, task_id: str, sandbox_id: str | None, still_current, delay_s: float,
                     publish=None) -> dict:
        """CR1: rotate the running attempt's key at the store, then publish the new key to its credential source
        only `delay_s` later (until then credential_process still prints the dead key). `still_current()` says
        whether that attempt still runs when the new key is to be published; `publish(new)` (a remote attempt:
        through its host) publishes it and says whether it could."""
        if sandbox_id is None:
            return {"applied": False, "why": "the task had no running attempt at the planned time"}
        keys = self.parts.keys
        if keys is None:
            return {"applied": False, "why": "the store has no per-attempt keys (an external store): nothing to "
                                             "rotate at the store"}
        t0 = time.time()
        got = await asyncio.to_thread(keys.rotate, self._owner(sandbox_id))
        if got is None:
            return {"applied": False, "why": f"attempt {sandbox_id} holds no key (it ended meanwhile)"}
        old, new = got
        self.secrets.append(new.secret_key)
        rotated_at = time.time()
        self.akids[sandbox_id] = new.access_key
        self.key_ids.setdefault(sandbox_id, []).append(new.access_key)
        self.timeline(Event.KEY_ROTATED, task=task_id, sandbox=sandbox_id, akid=new.access_key, old_akid=old.access_key)
        await asyncio.sleep(delay_s)
        d = self.creds_dir(sandbox_id)
        published = False
        if publish is not None:
            published = still_current() and bool(await publish(new))
        elif d.exists() and still_current():
            CredentialSource(d / results.ATTEMPT_CREDENTIALS).publish(new, owner_uid=SANDBOX_UID)
            published = True
        return {"applied": True, "at": t0, "sandbox_id": sandbox_id, "rotated_at": rotated_at,
                "published_at": time.time() if published else None, "old_akid": old.access_key,
                "new_akid": new.access_key, "store_switch_ms": round((rotated_at - t0) * 1000, 1)}

    def issued_secrets(self) -> tuple:
        """Every secret handed to a runner in this wave (model/effects keys, store secrets), for redaction by
        value in the evidence; never written anywhere."""
        out = self.parts.registry.issued_keys()
        out |= set(self.secrets)
        if self.parts.endpoint is not None:
            out.add(self.parts.endpoint.creds.secret_key)
        return tuple(sorted(out))

    def revoke(self, sandbox_id: str, keep_files: bool = False) -> None:
        """The attempt's keys die: at the services and the store. `keep_files` leaves its (now dead) credential
        file in place, as on a frozen machine's disk: a thawed zombie then signs with its revoked key and is refused
        by the store, where it can be seen; the file goes when the zombie ends."""
        self.parts.registry.revoke_attempt(sandbox_id)  # its model and effects key
        if self.parts.keys is not None:
            self.parts.keys.revoke(self._owner(sandbox_id))
        if not keep_files:
            shutil.rmtree(self.creds_dir(sandbox_id), ignore_errors=True)

    def runner_env(self, task: PlannedTask, attempt: int, fence: int, sandbox_id: str,
                   workspace: str = WORKSPACE_IN) -> dict:
        """The runner contract's environment (docs/runner-contract.md), as seen inside the sandbox."""
        runner, registry = self.runner, self.parts.registry
        registry.register(task.task_id, task.seed, task.steps, task.workload)
        key = registry.attempt_key(task.task_id, attempt, sandbox_id)  # dies with the attempt's lease
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
               "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", **runner["env"]}
        s3 = f"http://127.0.0.1:{PORT_S3}"
        env.update({
            "HOME": workspace,
            "TMPDIR": "/tmp",
            "AWS_CONFIG_FILE": f"{CREDS_IN}/aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL_S3": s3,
            "AWS_DEFAULT_REGION": self.parts.endpoint.region,
            "OPENAI_BASE_URL": f"http://127.0.0.1:{PORT_MODEL}/v1",
            "OPENAI_API_KEY": key,
            "OPENAI_MODEL": MODEL_ID,
            # the same endpoint and key for Anthropic's SDKs and Claude Code (they append /v1 themselves)
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{PORT_MODEL}",
            "ANTHROPIC_API_KEY": key,
            "SANDFLEET_CONTRACT": CONTRACT_VERSION,
            "SANDFLEET_TASK_ID": task.task_id,
            "SANDFLEET_ATTEMPT": str(attempt),
            "SANDFLEET_FENCE": str(fence),
            "SANDFLEET_REPO": os.path.join(workspace, "repo"),
            "SANDFLEET_S3_ENDPOINT": s3,
            "SANDFLEET_S3_BUCKET": self.parts.bucket,
            "SANDFLEET_S3_PREFIX": results.task_prefix(self.wave_id, task.task_id),
            "SANDFLEET_EFFECTS_URL": f"http://127.0.0.1:{PORT_EFFECTS}/v1",
            "SANDFLEET_EFFECTS_KEY": key,
            "SANDFLEET_GRACE_S": "1.0",
        })
        if runner.get("workdir"):
            env["SANDFLEET_RUNNER_DIR"] = runner["workdir"]
        return env
