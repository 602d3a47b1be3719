"""The end of a wave, in order: every fault cleared at the proxy, the hosts sweep what no lease covers (a stopped
wave ends all its sandboxes and leases), the sweep actor's last pass, the store audited (every object, or a seeded
sample past a cap, read back and checked against what its writer sent), then the parts stopped and the wave's
private dir removed. A part that is lost gets no grace; a lost host or ledger does not stop the sweep (the driver
then reaps by marker). The health watch runs on until the parts are stopped, and every wait on a part has a bound
and ends early once the watch finds that part (or the wave's Ray) lost."""
from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from typing import Callable

import orjson

from cluster import results
from cluster.wave.errors import HarnessError
from cluster.wave.timeline import Event


class _NamedCalls:
    """The audit's second client, remembering the S3 call it made last (and its key): an audit that fails names
    what failed, as `failure` words it, never only the client's exception (a refused connection reads as a pool's
    URL)."""

    CALLS = {"list_objects": "ListObjectsV2 (listing the objects)", "get_object": "GetObject (reading an object back)",
             "_list_multipart_uploads": "ListMultipartUploads (listing the incomplete uploads)",
             "_abort_multipart_upload": "AbortMultipartUpload"}

    def __init__(self, mc):
        self._mc, self.call, self.key = mc, "connecting", None

    def __getattr__(self, name: str):
        fn = getattr(self._mc, name)
        if name not in self.CALLS:
            return fn

        def named(*args, **kw):
            self.call = self.CALLS[name]
            self.key = args[1] if len(args) > 1 and name in ("get_object", "_abort_multipart_upload") else None
            return fn(*args, **kw)
        return named

    def failure(self, bucket: str, prefix: str, exc: BaseException) -> dict:
        """The failed call, its bucket, prefix and key, and the error, escaped (a key is a runner's words)."""
        safe = results.terminal_safe
        why = safe(f"{type(exc).__name__}: {str(exc)[:400]}")
        key = None if self.key is None else safe(str(self.key)[:300])
        return {"call": self.call, "bucket": bucket, "prefix": prefix, "key": key, "error": why,
                "message": f"store audit: {self.call} of bucket {bucket!r}, prefix {prefix or '(the whole bucket)'!r}"
                           + (f", key '{key}'" if key is not None else "") + f" failed: {why}"}


class Teardown:
    def __init__(self, parts, health, timeline, out: results.ResultsDir, wave_id: str, runs: dict, private,
                 own_fleet: bool, settle_s: float, interrupted: Callable[[], str | None], harness_cg=None):
        """`interrupted()`: the signal that stopped the wave, or None; `settle_s`: the sweep actor's settle window;
        `harness_cg`: the driver's own harness cgroup, left at the end."""
        self.parts = parts
        self.health = health
        self.timeline = timeline
        self.out = out
        self.wave_id = wave_id
        self.runs = runs
        self.private = private
        self.own_fleet = own_fleet
        self.sweep_settle_s = settle_s
        self.interrupted = interrupted
        self.harness_cg = harness_cg

    def _get(self, refs, timeout: float, *parts: str):
        """`ray.get(refs)` within `timeout` s, cut short (TimeoutError naming the part) once the health watch finds
        one of `parts` lost: a call to a lost part would only wait its bound out."""
        import ray

        many = isinstance(refs, list)
        pending = list(refs) if many else [refs]
        deadline = time.monotonic() + timeout
        while pending:
            lost = next((p for p in parts if self.health.lost(p)), None)
            if lost:
                raise TimeoutError(f"not waited for: the {lost} is lost (harness fault)")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer within {timeout:g} s")
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(0.25, left))
        return ray.get(refs, timeout=5)

    def clear_faults(self) -> None:
        """Belt and braces after the per-fault clears: no proxy rule survives the wave."""
        if self.health.lost("fault proxy"):
            self.timeline(Event.PROXY_RULES_NOT_CLEARED, why="the fault proxy is lost; it is stopped instead")
        elif self.parts.proxy is not None and self.parts.proxy.proc is not None:
            try:
                left = self.parts.proxy.control().close_all()
                if left:
                    self.timeline(Event.PROXY_RULES_FORCE_CLOSED, rules=[r["rule_id"] for r in left])
            except Exception as exc:  # noqa: BLE001
                self.timeline(Event.PROXY_CLEAR_FAILED, error=str(exc))

    def sweep_actor_report(self) -> None:
        """The sweep actor's last pass for this wave (after its settle window if anything still looks leaked);
        its report is `sweeper.json`. A lost sweep actor is recorded, never fatal: the host sweep ran already."""
        import ray

        sweeper = getattr(self.parts.fleet, "sweeper", None) if self.parts.fleet is not None else None
        if sweeper is None or self.parts.ledger is None:
            return
        lost = next((p for p in ("sweep actor", "lease ledger") if self.health.lost(p)), None)
        if lost:  # dead or hung: its last pass (which reads the ledger's leases) would only wait for the timeout
            if lost == "sweep actor" and not self.parts.fleet.attached:  # (a fleet's actor serves other waves)
                try:
                    ray.kill(sweeper)
                except Exception:  # noqa: BLE001
                    pass
            rep = {"wave_id": self.wave_id, "errors": [f"the {lost} is lost (harness fault): "
                                                       f"{self.health.harness_fault.why[:200]}"],
                   "unavailable": True}
            self._write_sweeper(rep)
            return
        try:
            engine = self.health.harness_fault.why[:200] if self.health.lost("docker engine") else None
            rep = self._get(sweeper.final.remote(self.wave_id, engine), self.sweep_settle_s + 60, "sweep actor",
                            "lease ledger")
        except Exception as exc:  # noqa: BLE001
            rep = {"wave_id": self.wave_id, "errors": [f"the sweep actor did not report: {type(exc).__name__}: "
                                                       f"{str(exc)[:200]}"], "unavailable": True}
        self._write_sweeper(rep)

    def _write_sweeper(self, rep: dict) -> None:
        self.out.sweeper.write_bytes(orjson.dumps(rep, option=orjson.OPT_INDENT_2, default=str))
        self.timeline(Event.SWEEP_ACTOR, scans=rep.get("scans"), leaked=len(rep.get("leaked") or []),
                      reaped=len(rep.get("reaped") or []), dangling=len(rep.get("dangling_leases") or []),
                      expired_but_running=len(rep.get("expired_but_running") or []), errors=rep.get("errors"))

    def sweep(self) -> dict:
        """End what is left of the wave and record it. A stopped wave (signal, harness fault) ends all its
        sandboxes and leases; otherwise sandboxes with no active lease are leaks. A host or ledger that is
        gone does not stop the sweep: the driver then reaps the wave's sandboxes by their markers itself."""
        fault = self.health.harness_fault
        stopping = self.interrupted() or (fault and f"harness fault ({fault.part})")
        problems: list[str] = []
        self._end_lost_actors(problems)
        active = self._active_leases(problems)
        live = [l["sandbox_id"] for l in active or []]
        if stopping:  # the wave is being stopped: every sandbox of it goes and its leases end
            self._stop_everything(stopping, active, problems)
            live = []
        reports = []
        for n, h in self._live_hosts():
            try:
                reports.append(self._get(h.sweep.remote(self.wave_id, live), 60, f"sandbox host {n}"))
            except Exception as exc:  # noqa: BLE001
                problems.append(f"sweep on {n}: {type(exc).__name__}: {str(exc)[:200]}")
        out = {"wave_id": self.wave_id, "active_leases": active or [], "nodes": reports,
               "leaked": [r for rep in reports for r in rep["reaped"]], "problems": problems,
               "reaped_by_driver": self._reap_by_marker() if problems else []}
        self.out.sandbox_sweep.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
        if problems and not self.health.harness_fault:
            raise HarnessError("; ".join(problems))
        return out

    def _live_hosts(self) -> list[tuple]:
        """(node, host) of each sandbox node whose host is neither lost nor on a node PK3 took."""
        return [(n, h) for n, h in zip(self.parts.fleet.node_ids, self.parts.hosts)
                if not self.health.lost(f"sandbox host {n}") and n not in self.parts.fleet.down]

    def _end_lost_actors(self, problems: list[str]) -> None:
        """A hung or dead ledger or host is ended now rather than waited on for each call's timeout."""
        import ray

        fleet = self.parts.fleet  # (its actor handles: `ray.kill` takes no WaveHost)
        for part, actor in [("lease ledger", self.parts.ledger)] + [(f"sandbox host {n}", h) for n, h in
                                                               zip(fleet.node_ids, fleet.hosts) if n not in fleet.down]:
            if self.health.lost(part):
                problems.append(f"{part} lost (harness fault)")
                if fleet.attached:  # a `sandfleet up` fleet's actor serves other waves: a wave never ends it
                    continue
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001
                    pass

    def _active_leases(self, problems: list[str]) -> list[dict] | None:
        try:
            if self.health.lost("lease ledger"):
                raise RuntimeError("the lease ledger is lost")
            return [l for l in self._get(self.parts.ledger.active.remote(), 30, "lease ledger")
                    if l["task_id"].startswith(self.wave_id + "/")]
        except Exception as exc:  # noqa: BLE001
            problems.append(f"ledger: {type(exc).__name__}: {str(exc)[:200]}")
            return None

    def _stop_everything(self, stopping: str, active: list[dict] | None, problems: list[str]) -> None:
        """Every host cancels the wave's sandboxes; every active lease of the wave is released."""
        for n, h in self._live_hosts():
            engine = self.health.harness_fault.why[:200] if self.health.lost("docker engine") else None
            try:
                self._get(h.cancel_wave.remote(self.wave_id, 20.0, engine), 30, f"sandbox host {n}")
            except Exception as exc:  # noqa: BLE001
                problems.append(f"cancel on host: {type(exc).__name__}")
        for lease in active or []:
            try:
                self._get(self.parts.ledger.release.remote(lease["task_id"], lease["fence"], None,
                                                           f"wave stopped: {stopping}"), 10, "lease ledger")
            except Exception as exc:  # noqa: BLE001
                problems.append(f"release {lease['task_id']}: {type(exc).__name__}")
                break

    def _reap_by_marker(self) -> list[dict]:
        """A part is gone: reap the wave's sandboxes here, by marker (same machine)."""
        from fleet import cgroups
        from fleet.backends import reap_leftover

        out = []
        for wid, sid in cgroups.list_sandboxes(self.wave_id):
            try:
                out.append(reap_leftover(wid, sid))
            except Exception as exc:  # noqa: BLE001
                out.append({"sandbox_id": sid, "error": str(exc)})
        return out

    def audit_store(self, max_objects: int | None = None, seed: int = 0) -> None:
        """The store audit (storage/audit.py, a second client): every object read back and checked against
        what its writer sent (at most `max_objects`, a sample seeded by `seed` past it), keys outside task
        prefixes, incomplete uploads reported then aborted."""
        from storage.audit import MAX_OBJECTS, audit, client_for

        log = []
        try:
            if not self.health.lost("fault proxy"):
                self.parts.proxy.control().flush()
        except (RuntimeError, OSError):
            pass
        try:
            self.out.proxy_requests.stat()  # no log at all: the audit cannot match writes to writers
            log += results.read_jsonl(self.out.proxy_requests, skip_bad=True)
        except OSError:
            log = None
        creds = self.parts.endpoint.creds
        scope = f"{self.wave_id}/" if self.parts.store_lent else ""
        mc = _NamedCalls(client_for(self.parts.endpoint.url, creds.access_key, creds.secret_key,
                                    getattr(self.parts.endpoint, "region", None) or "us-east-1"))
        try:
            out = audit(mc, self.parts.bucket, self.wave_id, sorted(self.runs), log,
                        shared=self.parts.store_lent, max_objects=max_objects or MAX_OBJECTS, seed=seed)
        except Exception as exc:  # noqa: BLE001 - named (call, bucket, prefix, key, error), kept, and raised on
            err = mc.failure(self.parts.bucket, scope, exc)
            self.out.store_audit.write_bytes(orjson.dumps(
                {"bucket": self.parts.bucket, "scope": scope, "client": "minio", "error": err,
                 "failed": err["message"]}, option=orjson.OPT_INDENT_2))
            raise RuntimeError(err["message"]) from None
        self.out.store_audit.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))

    def stop_parts(self) -> None:
        """Keep what the parts know (Ray's node losses, fenced calls, host load, the ledger, renewals, service
        counts), then stop them in order: services, the wave's keys at a lent store, proxy and own store, an own
        fleet; the private dir goes last. A step that fails is named in `teardown_errors`; the others still run."""
        errors: list[str] = []
        self._keep_records()
        self._dump_ledger(errors)
        self._record_counts()
        self.health.stop_watch()  # the parts stop now: from here, each step's own bound holds
        for svc in (self.parts.gateway, self.parts.model, self.parts.effects):
            if svc is not None:
                self._try(errors, f"stop {type(svc).__name__}", svc.stop)
        if self.parts.store_lent and self.parts.keys is not None and not self.health.lost("store"):
            self._try(errors, "revoke keys", self._revoke_lent_keys)
        if self.parts.keys is not None:
            self._try(errors, "count keys", self._record_keys)
        # the proxy, the wave's own store and an own fleet share nothing: they stop side by side (each mostly
        # waits on its processes' exits; one after the other was the wave's longest teardown phase)
        steps = []
        for name, part in (("fault proxy", self.parts.proxy),
                           ("store", None if self.parts.store_lent else self.parts.store)):
            if part is not None:
                # a lost part gets no grace, and neither does the wave's own store: the audit has read it back,
                # its data dir goes with the private dir below, and weed's graceful stop took 1.2-5 s per wave
                # (a SIGKILLed weed keeps its committed objects anyway: DESIGN.md, "Real parts")
                grace = {"grace_s": 0.0} if self.health.lost(name) or name == "store" else {}
                steps.append((f"stop {type(part).__name__}", lambda part=part, grace=grace: part.stop(**grace)))
        if self.own_fleet and self.parts.fleet is not None:
            steps.append(("fleet stop", self.parts.fleet.stop))
        side_by_side(errors, steps)
        if self.own_fleet and self.parts.fleet is not None:
            tmp = self.parts.fleet.ray_session.tmpdir
            if tmp and any(e.startswith("fleet stop: still running") for e in errors):
                # the process ends before that stop does: the wave's own Ray goes now, by its temp dir (its marker)
                from cluster.raysession import end_leftovers

                self.parts.fleet.ray_session.ended_leftovers += end_leftovers(tmp)
            ended = self.parts.fleet.ray_session.ended_leftovers
            if ended:  # a dead GCS orphans its agents: they were ended by the session's temp dir (its marker)
                self.timeline(Event.RAY_LEFTOVERS_ENDED, processes=ended)
        shutil.rmtree(self.private, ignore_errors=True)
        from fleet import cgroups

        cgroups.leave_harness(self.harness_cg)
        if errors:
            self.timeline(Event.TEARDOWN_ERRORS, errors=errors)

    _try = staticmethod(lambda errors, what, fn: try_step(errors, what, fn))

    def _keep_records(self) -> None:
        elog = getattr(getattr(self.parts.fleet, "ray_session", None), "error_log", None)
        if elog and os.path.exists(elog):  # what Ray said about the nodes it lost (PK3)
            shutil.copyfile(elog, self.out.ray_errors)
        if self.parts.fenced_log is not None:
            self.parts.fenced_log.close()
        with open(self.out.host_load, "ab") as f:  # appended: a resumed wave keeps the first part
            f.write(b"".join(orjson.dumps(x) + b"\n" for x in self.health.load_samples))

    def _dump_ledger(self, errors: list[str]) -> None:
        """The wave's leases and their history, from the ledger actor or (lost) its SQLite file."""
        if self.parts.ledger is None:
            return
        try:
            try:
                if self.health.lost("lease ledger"):
                    raise RuntimeError("the lease ledger actor is lost")
                dump = self._get(self.parts.ledger.dump.remote(), 60, "lease ledger")
            except Exception:  # noqa: BLE001 - read its SQLite file directly (WAL: consistent after a kill)
                from fleet.ledger import LeaseLedger

                led = LeaseLedger(os.path.join(self.parts.fleet.state_dir, results.LEDGER_DB))
                dump = led.dump()
                led.close()
            mine = self.wave_id + "/"
            with open(self.out.ledger, "wb") as f:
                for kind, rows in (("lease", dump["leases"]), ("event", dump["history"])):
                    f.write(b"".join(orjson.dumps({"kind": kind, **row}) + b"\n" for row in rows
                                     if row["task_id"].startswith(mine)))
        except Exception as exc:  # noqa: BLE001
            errors.append(f"ledger dump: {exc}")

    def _record_counts(self) -> None:
        try:  # how the hosts' lease renewals went (cumulative over a lent fleet's life)
            self.timeline(Event.LEASE_RENEWALS, hosts=self._get([h.renewals.remote() for h in self.parts.hosts], 10,
                                                            "sandbox host"))
        except Exception:  # noqa: BLE001 - a lost host has no figures
            pass
        counts = {}
        for key, svc in (("model", self.parts.model), ("effects", self.parts.effects)):
            if svc is not None:
                per: dict = {}
                for r in svc.log.snapshot():
                    per[r["task"]] = per.get(r["task"], 0) + 1
                counts[key] = per
        if counts:
            self.timeline(Event.SERVICE_COUNTS, **counts)

    def _record_keys(self) -> None:
        """The attempts' store keys since the wave began (a lent fleet's waves at once share its book): issued,
        revoked, identity writes, canary probes; `held`: this wave's keys still live now, after a lent store's
        revoke (the wave's own store stops next, and its keys with it)."""
        keys, before = self.parts.keys, self.parts.keys_before
        self.timeline(Event.STORE_KEYS, **{k: n - before.get(k, 0) for k, n in keys.counts().items()},
                      held=keys.held(f"{self.wave_id}/"), store="lent" if self.parts.store_lent else "own")

    def _revoke_lent_keys(self) -> None:
        """Keys of attempts that did not end in order (a lost host's): a lent store outlives the wave."""
        left = self.parts.keys.revoke_all(prefix=f"{self.wave_id}/")
        if left:
            self.timeline(Event.KEYS_REVOKED_AT_END, owners=left)

    REVOKE_AT_ONCE_S = 10.0

    def _revoke_at_once(self) -> str | None:
        """A stop at once at a lent store: the wave's keys revoked in one write, from a thread of its own (this runs
        in the signal handler, on the main thread, which may be inside the key book); waited for 10 s at most.
        None once none is left, else what is left and why."""
        errors: list[str] = []
        out: dict = {}

        def revoke() -> None:
            self._try(errors, "revoke", self._revoke_lent_keys)
            out["held"] = self.parts.keys.held(f"{self.wave_id}/")

        t = threading.Thread(target=revoke, daemon=True)
        t.start()
        t.join(self.REVOKE_AT_ONCE_S)
        if t.is_alive():
            return f"the revoke did not finish within {self.REVOKE_AT_ONCE_S:g} s"
        if errors or out.get("held"):
            return "; ".join(errors + ([f"{out['held']} still held"] if out.get("held") else []))
        return None

    def stop_at_once(self, name: str) -> None:
        """A second signal: kill what the wave started, by PID and by its markers, and exit now."""
        from fleet.backends import reap_leftover
        from fleet import cgroups

        if self.health is not None:
            self.health.stop_watch(1.0)
        own_store = None if self.parts.store_lent else self.parts.store
        keys_left = None
        for part in (self.parts.proxy, own_store):
            proc = getattr(part, "proc", None)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(5)
        if own_store is not None:
            own_store.remove_sockets()
        elif self.parts.keys is not None and not (self.health is not None and self.health.lost("store")):
            # a lent store outlives the wave: its keys die now, in one write, from a thread of its own (this is the
            # signal handler, on the main thread, which may hold the key book's lock); waited for 10 s at most: the
            # fleet's own stop (`sandfleet down`) ends its store, and the keys, otherwise
            keys_left = self._revoke_at_once()
        for wid, sid in cgroups.list_sandboxes(self.wave_id):
            try:
                reap_leftover(wid, sid)
            except Exception:  # noqa: BLE001
                pass
        if self.own_fleet and self.parts.fleet is not None:
            try:
                self.parts.fleet.stop()
            except Exception:  # noqa: BLE001
                pass
        cgroups.leave_harness(self.harness_cg)
        shutil.rmtree(self.private, ignore_errors=True)
        try:
            self.timeline(Event.WAVE_STOPPED_AT_ONCE, signal=name, **({"keys_left": keys_left} if keys_left else {}))
            self.out.summary.write_text(
                f"# Wave {self.wave_id}\n\n**Stopped at once by a second {name}**: not graded. What was stored "
                f"so far can be graded with `sandfleet grade {self.out.path}` (unfinished tasks are unknown).\n")
        except Exception:  # noqa: BLE001
            pass
        sys.stderr.write(f"{name} again: stopped at once; results so far in {self.out.path}\n")
        if keys_left:
            sys.stderr.write(f"the wave's keys at the fleet's store were not all revoked ({keys_left}): they work "
                             "until `sandfleet down`\n")
        os._exit(130 if name == "SIGINT" else 143)


def try_step(errors: list[str], what: str, fn) -> None:
    """One teardown step: a failure is named in `errors`, and the teardown goes on."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - named, and the teardown goes on
        errors.append(f"{what}: {exc}")


STEP_BOUND_S = 120.0  # past every bound inside a step (a fleet's stop: 30 s for its hosts, then Ray's own stop)


def side_by_side(errors: list[str], steps: list[tuple[str, object]], bound_s: float = STEP_BOUND_S) -> None:
    """Teardown steps that share nothing, each in a thread of its own; returns when every one has ended, or at
    `bound_s`, naming each step still running in `errors` (its thread is a daemon: it never holds the exit)."""
    threads = [threading.Thread(target=try_step, args=(errors, what, fn), name=f"teardown: {what}", daemon=True)
               for what, fn in steps]
    for t in threads:
        t.start()
    deadline = time.monotonic() + bound_s
    for (what, _), t in zip(steps, threads):
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            errors.append(f"{what}: still running after {bound_s:g} s (left to end with the process)")
