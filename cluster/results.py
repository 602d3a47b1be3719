"""The results layout, defined once: every file a wave, a league or a campaign writes, and the naming rules.

A wave writes `results/<wave id>/` (and points `results/latest` at it); nothing else in the product spells a
file name of it. Readers and writers go through `ResultsDir` (one property per file) and `read_jsonl`; the
names of the wave's things in the store, the ledger and the sandbox hosts (bucket, task prefix, lease key,
sandbox id) come from the functions at the bottom. `LAYOUT` lists every file with what it holds:
`docs/architecture.md` renders it as a table, and a unit test checks the two agree.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from pathlib import Path

import orjson

# -- the files of a wave's results directory --------------------------------------------------------------
PLAN = "plan.json"
TIMELINE = "timeline.jsonl"
TIMELINE_PNG = "timeline.png"
FAULTS = "faults.json"
MODEL_CALLS = "model-calls.jsonl"
EFFECTS = "effects.jsonl"
PROXY_REQUESTS = "proxy-requests.jsonl"
FENCED = "fenced.jsonl"
HOST_LOAD = "host-load.jsonl"
LEDGER = "ledger.jsonl"
SANDBOX_SWEEP = "sandbox-sweep.json"
SWEEPER = "sweeper.json"
STORE_AUDIT = "store-audit.json"
RAY_ERRORS = "ray-errors.log"
NODES = "nodes.json"
SUMMARY = "SUMMARY.md"
VERDICT = "verdict.json"
SEAL_MANIFEST = "MANIFEST.json"  # cluster/seal.py: every file's sha256
SEAL = "SEAL.json"  # its Ed25519 signature and public key
INDEX_HTML = "index.html"
PAGES = "pages"
EVIDENCE_RUNNER_LOGS = "runner-logs.txt"
GRADE_SUFFIX = ".grade.json"
ARTIFACTS = "artifacts"
ARTIFACT_MANIFEST = "artifact.json"
ARTIFACT_FILES = "files"
SANDBOXES = "sandboxes"
RUNNER_LOG = "runner.log"
EVIDENCE = "evidence"
EVIDENCE_GRADE = "grade.json"
EVIDENCE_ATTEMPTS = "attempts.json"
EVIDENCE_STORE_WRITES = "store-writes.json"
EVIDENCE_AROUND_FAULTS = "around-faults.json"
LATEST = "latest"
REFERENCE_CACHE = ".reference-cache"

# -- a league's and a campaign's own directory ------------------------------------------------------------
LEAGUE_MD = "LEAGUE.md"
LEAGUE_JSON = "league.json"
LEAGUE_PNG = "league.png"
CAMPAIGN_MD = "CAMPAIGN.md"
CAMPAIGN_JSON = "campaign.json"
CAMPAIGN_PNG = "campaign.png"

# -- the wave's private directory (never in results: keys, the store's data, the driver's pid) --------------
# (its driver and Ray records are named in fleet/markers.py, which the sweeps read and fleet/ may not import this)
from fleet.markers import ATTEMPT_CREDENTIALS, DRIVER_RECORD, RAY_RECORD  # noqa: E402,F401
LEDGER_DB = "ledger.db"

# every file of a wave's results directory and what it holds (docs/architecture.md renders this table)
LAYOUT: list[tuple[str, str]] = [
    (PLAN, "the plan: config, every task with its seed and faults, references, placement, the runner's digest, "
           "and the manifest (what the wave ran on: cluster/manifest.py)"),
    (TIMELINE, "what happened, one event a line (wave, parts, attempts, faults, nodes, harness faults)"),
    (FAULTS, "one receipt per planned fault: applied / not_applied / unknown, with what it hit"),
    (NODES, "the wave's Ray nodes: name, Ray node id, address, head or not; isolated nodes also the inode numbers "
            "of their network, mount and pid namespaces and their cgroup"),
    (MODEL_CALLS, "every model call the endpoint answered (task, step, attempt)"),
    (EFFECTS, "every external effect the effects service took (effect id, task, attempt)"),
    (PROXY_REQUESTS, "every store request through the fault proxy (method, key, status, bytes, rule)"),
    (FENCED, "calls refused because their attempt was fenced (a zombie's)"),
    (HOST_LOAD, "the host's load, sampled through the wave (liveness: a silence under overload is unknown)"),
    (LEDGER, "the wave's lease rows and their history (fences, releases)"),
    (SANDBOX_SWEEP, "the hosts' sweep at the wave's end: leaked sandboxes, active leases, problems"),
    (SWEEPER, "the sweep actor's report: leaks it reaped, dangling leases, expired-but-running"),
    (STORE_AUDIT, "the store audit: every object (or a seeded sample past a cap) read back and checked, "
                  "stray keys, open uploads; or, when it failed, what failed (`error`: the call, bucket, prefix, "
                  "key and error)"),
    (RAY_ERRORS, "what Ray said about the nodes it lost (PK3)"),
    ("<task>" + GRADE_SUFFIX, "one task's verdict, every check with its reason, the inputs' digests"),
    (f"{ARTIFACTS}/<task>/", "the workspace as the harness captured it (artifact.json + files/)"),
    (f"{SANDBOXES}/<sandbox>/{RUNNER_LOG}", "one attempt's runner output"),
    (f"{EVIDENCE}/<task>/", "redacted evidence: grade, attempts, store writes, events around each fault, log tails"),
    (SUMMARY, "the human summary: verdict, cells, controls, replay commands"),
    (VERDICT, "the wave's verdict and each task's verdict, cell and signature, in one small file (`sandfleet serve` "
              "lists waves from it)"),
    (TIMELINE_PNG, "the timeline as a picture"),
    (INDEX_HTML, "the report as a self-contained web page: verdict, timeline, fault x outcome, tasks (filterable)"),
    (f"{PAGES}/<task>.html", "one task's page: attempts, receipts, checks, redacted log tails, replay command"),
    (SEAL_MANIFEST, "the sha256 of every other file of the wave, written last (`sandfleet verify` checks them)"),
    (SEAL, "the manifest's Ed25519 signature and the sealer's public key (nothing secret: cluster/seal.py)"),
]


class ResultsDir:
    """One wave's results directory: a property per file, so a name is spelled only here."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __truediv__(self, other: str) -> Path:
        return self.path / other

    def __fspath__(self) -> str:
        return str(self.path)

    plan = property(lambda self: self.path / PLAN)
    timeline = property(lambda self: self.path / TIMELINE)
    timeline_png = property(lambda self: self.path / TIMELINE_PNG)
    faults = property(lambda self: self.path / FAULTS)
    model_calls = property(lambda self: self.path / MODEL_CALLS)
    effects = property(lambda self: self.path / EFFECTS)
    proxy_requests = property(lambda self: self.path / PROXY_REQUESTS)
    fenced = property(lambda self: self.path / FENCED)
    host_load = property(lambda self: self.path / HOST_LOAD)
    ledger = property(lambda self: self.path / LEDGER)
    sandbox_sweep = property(lambda self: self.path / SANDBOX_SWEEP)
    sweeper = property(lambda self: self.path / SWEEPER)
    store_audit = property(lambda self: self.path / STORE_AUDIT)
    ray_errors = property(lambda self: self.path / RAY_ERRORS)
    summary = property(lambda self: self.path / SUMMARY)
    index_html = property(lambda self: self.path / INDEX_HTML)
    artifacts = property(lambda self: self.path / ARTIFACTS)
    sandboxes = property(lambda self: self.path / SANDBOXES)
    evidence_root = property(lambda self: self.path / EVIDENCE)

    def grade(self, task_id: str) -> Path:
        return self.path / f"{task_id}{GRADE_SUFFIX}"

    def grades(self) -> list[Path]:
        return sorted(self.path.glob("*" + GRADE_SUFFIX))

    def artifact(self, task_id: str) -> Path:
        return self.path / ARTIFACTS / task_id

    def artifact_manifest(self, task_id: str) -> Path:
        return self.artifact(task_id) / ARTIFACT_MANIFEST

    def sandbox(self, sandbox_id: str) -> Path:
        return self.path / SANDBOXES / sandbox_id

    def runner_log(self, sandbox_id: str) -> Path:
        return self.sandbox(sandbox_id) / RUNNER_LOG

    def runner_logs(self, task_id: str) -> list[Path]:
        """Every attempt's runner log of a task, in attempt order."""
        logs = [p for p in (self.path / SANDBOXES).glob(f"{task_id}-a*/{RUNNER_LOG}") if attempt_of(p.parent.name)]
        return sorted(logs, key=lambda p: attempt_of(p.parent.name)[1])

    def runner_logs_by_task(self) -> dict[str, list[Path]]:
        """task id -> its attempts' runner logs in attempt order, from one listing of the sandboxes folder (what
        `runner_logs` gives each task)."""
        out: dict[str, list[tuple[int, Path]]] = {}
        try:
            names = [e.name for e in os.scandir(self.path / SANDBOXES)]
        except OSError:
            return {}
        for name in names:
            got = attempt_of(name)
            p = self.path / SANDBOXES / name / RUNNER_LOG
            if got is not None and os.path.lexists(p):
                out.setdefault(got[0], []).append((got[1], p))
        return {t: [p for _, p in sorted(v)] for t, v in out.items()}

    def runner_log_tails(self, task_id: str, lines: int = 3, logs: list[Path] | None = None) -> dict[int, str]:
        """attempt -> the last `lines` lines of its runner log (of its last 4 KiB), as the grader and the HTML
        report show them; a log that cannot be read is left out. `logs`: the task's logs, when already listed."""
        out = {}
        for p in self.runner_logs(task_id) if logs is None else logs:
            try:
                n = attempt_of(p.parent.name)[1]
                out[n] = b"\n".join(tail_bytes(p, 4096).splitlines()[-lines:]).decode(errors="replace")
            except (ValueError, OSError):
                continue
        return out

    def evidence(self, task_id: str) -> Path:
        return self.path / EVIDENCE / task_id


class StoredPathError(ValueError):
    """A file of the wave's folder cannot be written where it goes (a directory stands there): named, never forced."""


class JsonlError(ValueError):
    """A line of a JSON-lines file that is neither valid JSON nor a record with the required keys."""

    def __init__(self, line: int, why: str):
        super().__init__(f"line {line}: {why}")
        self.line, self.why = line, why


def request_span(rec: dict) -> tuple[float, float]:
    """(start, end) wall time of a request in the fault proxy's log (`t`, and `ms` for as long as the proxy held it:
    a throttle or a hold is the harness's time, not the runner's silence); a bad `ms` counts as none."""
    ms = rec.get("ms")
    return rec["t"], rec["t"] + (ms / 1000 if isinstance(ms, (int, float)) and 0 <= ms < 1e9 else 0.0)


def one_line(text: str) -> str:
    """`terminal_safe`, and a newline or tab shown escaped too: a name or an id a runner chose (a file name holds
    any byte but / and NUL) that must not start a line of its own (a forged `intact` line under `verify`)."""
    return terminal_safe(text).replace("\n", "\\n").replace("\t", "\\t")


def terminal_safe(text: str) -> str:
    """Text that may hold what a runner wrote (a tool name, a file name, a log line, an exit message), made safe for a
    terminal, SUMMARY.md or a log: every control and format character but newline and tab (ESC, BEL, C1 codes,
    bidi overrides) is shown escaped (`\x1b`), so nothing reaches a terminal raw (OSC 52 writes the clipboard)."""
    import unicodedata

    if text.isprintable():
        return text
    out = []
    for c in text:
        if c in "\n\t" or (c.isprintable() and unicodedata.category(c) not in ("Cc", "Cf")) or c == " ":
            out.append(c)
        else:
            out.append(repr(c)[1:-1] if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
    return "".join(out)


# What the harness reads of each JSON-lines file, by type. A runner shapes what its requests, calls and effects put
# into these logs (a request line `GARBAGE` is logged with `"key": null`; a tool name can be anything), so every
# reader (the grader, the reports, the league) is total over them: a record whose field has another type is left
# out (and named in the grades: `Inputs.skipped`), never a traceback that erases the wave's grade. NUM excludes
# bool (True is an int in Python).
NUM, INT, STR, BOOL, LIST, NONE, DICT = "num", "int", "str", "bool", "list", "none", "object"
WALL = "wall"  # a wall clock's time: seconds since 1970, before the year 5000 (cluster/receipts.py)
SHAPES: dict[str, dict[str, tuple[str, ...]]] = {
    PROXY_REQUESTS: {"t": (NUM,), "method": (STR,), "cut": (BOOL, NONE), "key": (STR, NONE), "bucket": (STR, NONE),
                     "akid": (STR, NONE), "status": (INT, NONE), "ms": (NUM, NONE), "prefix": (STR, NONE),
                     "part": (INT, NONE), "upload_id": (STR, NONE), "req_bytes": (INT, NONE),
                     "resp_bytes": (INT, NONE), "sha": (STR, NONE), "fault": (STR, NONE), "keys": (LIST, NONE)},
    MODEL_CALLS: {"task": (STR,), "step": (INT, NONE), "t": (NUM,), "attempt": (INT, NONE), "tokens": (INT, NONE),
                  "t_done": (NUM, NONE), "delivered": (BOOL, NONE), "kind": (STR, NONE)},
    EFFECTS: {"task": (STR,), "effect_id": (STR,), "t": (NUM,), "step": (INT, NONE), "attempt": (INT, NONE),
              "deduped": (BOOL, NONE), "same_effect_as_key": (BOOL, NONE)},
    TIMELINE: {"event": (STR,), "task": (STR, NONE), "attempt": (INT, NONE), "wall": (NUM, NONE),
               "exit_code": (INT, NONE), "akid": (STR, NONE), "old_akid": (STR, NONE), "sandbox": (STR, NONE),
               "ended_at": (NUM, NONE), "started_at": (NUM, NONE), "state": (STR, NONE), "cause": (STR, NONE),
               "killed_by": (STR, NONE), "error": (STR, NONE), "start_error": (STR, NONE), "node": (STR, NONE),
               "signal": (STR, NONE), "why": (STR, NONE), "part": (STR, NONE), "fault_id": (STR, NONE),
               "t": (NUM,), "since_wall": (NUM, NONE), "outlived": (LIST, NONE)},
    FENCED: {"task": (STR, NONE)},
    HOST_LOAD: {"t": (NUM,), "running": (NUM,), "cores": (NUM, NONE)},
}
_IS = {NUM: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
       INT: lambda v: isinstance(v, int) and not isinstance(v, bool), STR: lambda v: isinstance(v, str),
       BOOL: lambda v: isinstance(v, bool), LIST: lambda v: isinstance(v, list), NONE: lambda v: v is None,
       DICT: lambda v: isinstance(v, dict),
       "list of records": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
       "list of strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
       "object of lists of records": lambda v: isinstance(v, dict) and all(
           isinstance(x, list) and all(isinstance(r, dict) for r in x) for x in v.values()),
       WALL: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 95_617_584_000}


# The harness's own reports (written by the driver at the wave's end) as the grader and the reports read them: a
# damaged or hand-edited one is named with its field, and what reads it is unknown (never a traceback). REQUIRED:
# a field the report always has (the sweep actor's, unless it was `unavailable`).
RECORDS, STRINGS, RECORD_LISTS = "list of records", "list of strings", "object of lists of records"
REPORT_SHAPES: dict[str, dict[str, tuple[str, ...]]] = {
    STORE_AUDIT: {"tasks": (RECORD_LISTS,), "incomplete_uploads": (RECORDS, NONE), "aborted_uploads": (LIST, NONE),
                  "findings": (RECORDS, NONE), "objects_listed": (INT, NONE), "objects_checked": (INT, NONE),
                  "error": (STR, DICT, NONE), "failed": (STR, NONE)},  # a failed audit: what failed, named
    SANDBOX_SWEEP: {"leaked": (LIST,), "problems": (LIST, NONE)},
    SWEEPER: {"scans": (INT,), "settle_s": (NUM,), "scan_ms_p50": (NUM, NONE), "leaked": (LIST,),
              "reaped": (RECORDS,), "left_at_end": (RECORDS,), "dangling_leases": (LIST,),
              "expired_but_running": (LIST,), "errors": (STRINGS, NONE), "nodes_scanned": (STRINGS, NONE),
              "unanswered_nodes": (DICT, NONE)},
}
REPORT_REQUIRED = {SWEEPER: ("scans", "settle_s", "scan_ms_p50", "leaked", "reaped", "left_at_end", "dangling_leases",
                             "expired_but_running")}
_FINDING_KEYS = ("signature", "key", "detail")


def report_misfit(name: str, doc) -> str | None:
    """Why the harness report `name` (store-audit.json, sandbox-sweep.json, sweeper.json) does not have the shape
    the grader and the reports read (its field named), or None."""
    if not isinstance(doc, dict):
        return f"a JSON {type(doc).__name__}, not the harness's report"
    if name == SWEEPER and doc.get("unavailable"):
        return misfit(doc, {"errors": (STRINGS, NONE)})
    lacks = [k for k in REPORT_REQUIRED.get(name, ()) if k not in doc]
    if lacks:
        return f"no field {', '.join(f'`{k}`' for k in lacks)}"
    why = misfit(doc, REPORT_SHAPES.get(name, {}))
    if why is not None:
        return "field " + why
    if name == STORE_AUDIT:
        for i, u in enumerate(doc.get("incomplete_uploads") or []):
            if not isinstance(u.get("key"), str):
                return f"field incomplete_uploads[{i}] has no `key` string"
        for i, f in enumerate(doc.get("findings") or []):
            if not all(k in f for k in _FINDING_KEYS):
                return f"field findings[{i}] has no {', '.join(k for k in _FINDING_KEYS if k not in f)}"
    return None


def misfit(rec: dict, shape: dict[str, tuple[str, ...]]) -> str | None:
    """Why a record does not have the shape the grader reads (a field of another type), or None."""
    for k, kinds in shape.items():
        if k in rec and not any(_IS[kind](rec[k]) for kind in kinds):
            if "wall" in kinds and _IS[NUM](rec[k]):
                return f"{k} is {rec[k]!r:.40}, not a wall time (seconds since 1970)"
            return f"{k} is a JSON {type(rec[k]).__name__}, not {' or '.join(kinds)}"
    return None


def fit(recs: list[dict], name: str) -> tuple[list[dict], list[str]]:
    """(the records of file `name` with the shape the harness reads, "record N: why" of each left out)."""
    shape = SHAPES.get(name)
    if shape is None:
        return recs, []
    out, left = [], []
    for i, rec in enumerate(recs):
        why = misfit(rec, shape)
        if why is None:
            out.append(rec)
        else:
            left.append(f"record {i + 1}: {why}")
    return out, left


@contextlib.contextmanager
def _regular(path: str | Path, follow: bool = False):
    """A stored file opened for reading, with its fstat, only when it is a regular file: never a FIFO (which would
    hang the reader) or a device (ValueError naming it), and never through a link unless `follow`."""
    fd = os.open(path, os.O_RDONLY | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{Path(path).name}: not a regular file")
        yield f, st


def regular_bytes(path: str | Path, follow: bool = False) -> bytes:
    """A stored file's bytes, read only when it is a regular file: never a FIFO (which would hang the reader) or a
    device (ValueError naming it), and never through a link unless `follow`. FileNotFoundError when it is missing."""
    with _regular(path, follow) as (f, _):
        return f.read()


def own_dir(root: str | Path, *parts: str) -> Path:
    """A directory inside the wave's folder `root` that this process writes into (`evidence`, `<task>`; `pages`): a
    link or a file left in the place of any of `parts` is removed first, never written through (`root` itself, which
    may be reached through a link such as results/latest, is left as it is)."""
    p = Path(root)
    for part in parts:
        p = p / part
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            p.unlink()
        p.mkdir(exist_ok=True)
    return p


def tail_bytes(path: str | Path, limit: int) -> bytes:
    """The last `limit` bytes of a stored regular file, never through a link (the file's or its folder's) and never
    from a FIFO or a device (ValueError naming it); OSError when missing."""
    path = Path(path)
    if path.parent.is_symlink():
        raise ValueError(f"{path.parent.name}: a link, not read")
    with _regular(path) as (f, st):
        f.seek(max(0, st.st_size - limit))
        return f.read(limit)


def write_stored(path: str | Path, data: bytes | str) -> None:
    """Write a file of the wave's folder whole (a temporary file renamed over it): a reader never sees it half
    written, and a FIFO or a link left in its place is replaced, never written through (a FIFO would hang us); a
    directory there is StoredPathError."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():  # os.replace cannot, and what is in it is not ours to remove
        raise StoredPathError(f"{path.name}: a directory stands where this file goes (left as it is)")
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def parse_jsonl(data: bytes, required: tuple[str, ...] = (), skip_bad: bool = False) -> list[dict]:
    """The records of JSON-lines bytes. A torn last line (a writer killed mid-line, or one still writing) is left
    out; any other line that is not JSON, or not a record with the `required` keys, raises JsonlError (`skip_bad`:
    it is left out too)."""
    out = []
    raw = data.splitlines()
    for i, line in enumerate(raw):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if i == len(raw) - 1 or skip_bad:
                continue
            raise JsonlError(i + 1, str(exc)) from None
        if not isinstance(rec, dict) or any(k not in rec for k in required):
            if skip_bad:
                continue
            raise JsonlError(i + 1, f"not a record with {', '.join(required)}")
        out.append(rec)
    return out


def read_jsonl(path: str | Path, required: tuple[str, ...] = (), skip_bad: bool = False) -> list[dict]:
    """`parse_jsonl` of a file ([] when it is missing), less the records that do not have the shape the harness reads
    of that file (`fit`); a damaged line raises ValueError naming the file and the line."""
    try:
        data = regular_bytes(path, follow=True)
    except FileNotFoundError:
        return []
    try:
        return fit(parse_jsonl(data, required, skip_bad), Path(path).name)[0]
    except JsonlError as exc:
        why = exc.why if required or not exc.why.startswith("not a record") else "not a record with fields"
        raise ValueError(f"{path} line {exc.line}: {why}") from None


def link_latest(root: str | Path, wave_dir: str | Path) -> None:
    """Point `<root>/latest` at the wave's directory (atomically; a real directory named latest is left)."""
    root = Path(root)
    latest = root / LATEST
    if latest.is_symlink() or not latest.exists():
        tmp = root / f".latest-{secrets.token_hex(3)}"
        os.symlink(Path(wave_dir).name, tmp)
        os.replace(tmp, latest)


# -- naming rules ---------------------------------------------------------------------------------------
def bucket_name(wave_id: str) -> str:
    """The wave's bucket in the store (S3 bucket names: short, lower case)."""
    return "sf-" + hashlib.sha256(wave_id.encode()).hexdigest()[:16]


def task_prefix(wave_id: str, task_id: str) -> str:
    """The task's key prefix in the wave's bucket: its attempts' keys may touch only this."""
    return f"{wave_id}/{task_id}/"


def lease_key(wave_id: str, task_id: str) -> str:
    """The task's lease in the ledger (one ledger serves many waves)."""
    return f"{wave_id}/{task_id}"


def sandbox_id(task_id: str, attempt: int) -> str:
    return f"{task_id}-a{attempt}"


def attempt_of(sandbox_id: str) -> tuple[str, int] | None:
    """(task id, attempt number) of a sandbox id, or None when it is not one."""
    task, sep, n = sandbox_id.rpartition("-a")
    if not sep or not task or not n.isdigit():
        return None
    return task, int(n)
