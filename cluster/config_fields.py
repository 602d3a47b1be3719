"""The parts of a wave config (the workload, the runner, the sandbox, the store, the health watch, a fault's
timing), each a strict pydantic model: an unknown field is an error. `cluster/config.py` composes them into
`WaveConfig`."""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError, field_validator,
                      model_validator)

from cluster.config_errors import shown
from fleet.runners import BUILTIN, builtin_command


class ConfigError(ValueError):
    pass


class FieldError(ValueError):
    """A check's error about one place inside the field it validates (`env` -> `env.<KEY>`): `loc` is that place
    relative to the field, `value` what was given there. `format_error` names it, and `errors` holds one
    (loc, value, message) per place when a check collected several."""

    def __init__(self, loc: tuple, value, msg: str, errors: list[tuple[tuple, object, str]] | None = None):
        super().__init__(msg)
        self.loc, self.value = tuple(loc), value
        self.errors = errors or [(self.loc, value, msg)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkloadConfig(Strict):
    name: str = Field("patch-repo", description="the workload the model endpoint scripts")
    steps: int = Field(8, strict=True, ge=1, le=500, description="patch steps per task")
    think_ms: int = Field(150, strict=True, ge=0, le=60000, description="model endpoint think time per call")


class VolatilePath(Strict):
    """A path of the artifact a runner legitimately writes differently on every run (a build stamp, a session id):
    `resume_equivalent` leaves it out of the comparison and shows `why` in the grade."""

    glob: str = Field(..., min_length=1, max_length=512, pattern=r"^[^\x00-\x1f]+$",
                      description="a glob of paths relative to the artifact's root (repo/), fnmatch rules: `*` also "
                                  "matches `/`; e.g. BUILD_INFO, logs/*.txt")
    why: str = Field("declared volatile", min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$",
                     description="shown in every grade that left it out")

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, v):
        return {"glob": v} if isinstance(v, str) else v

    @field_validator("glob", "why")
    @classmethod
    def _printable(cls, v: str, info):
        if not v.isprintable():
            raise ValueError(f"{info.field_name} {v!r}: printable characters only (no control, format or bidi "
                             "character)")
        if info.field_name == "glob" and (v.startswith("/") or ".." in v.split("/") or v.strip("*/") == ""):
            raise ValueError(f"glob {v!r}: a path inside the artifact's repo/ naming some files (not absolute, "
                             "no '..', not everything)")
        return v


class GatewayConfig(Strict):
    """The head's gate for sandboxes on other nodes (fleet/gateway.py): the one port of the driver's machine those
    nodes must reach, beside Ray's own."""

    port: int = Field(0, strict=True, ge=0, le=65535,
                      description="TCP port on the driver's cluster address; 0 picks a free one (open it in a "
                                  "security group only when fixed)")


class RunnerSpec(Strict):
    """A runner is any command: it follows docs/runner-contract.md and never imports sandfleet."""

    name: str | None = Field(None, description="shown in reports; defaults to the command's file name")
    command: list[str] | str = Field(..., description="argv list, or one shell-quoted string")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    workdir: str | None = Field(None, description="directory of the runner's code (read-only for the runner)")

    @field_validator("command")
    @classmethod
    def _command(cls, v):
        if isinstance(v, str):
            try:
                v = shlex.split(v)
            except ValueError as exc:
                raise ValueError(f"command is not a valid shell-quoted string: {exc}") from None
        if not v or not all(isinstance(a, str) and a for a in v):
            raise ValueError("command must be a non-empty list of non-empty strings, or one shell-quoted string")
        if any("\0" in a for a in v):  # no argv can hold one: exec would cut it there, and run something else
            raise ValueError("command has a NUL byte in an argument; an argument is a C string and cannot hold one")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict):
        for k, val in v.items():
            if not k or "=" in k:
                raise FieldError(("env", k), val, f"env name {k!r}: a variable's name is not empty and holds no "
                                 "'='")
            if k.startswith("SANDFLEET_") or k in CONTRACT_VARS:
                raise FieldError(("env", k), val, f"env may not set {k!r}: the harness sets the contract's "
                                 f"variables (SANDFLEET_*, {', '.join(sorted(CONTRACT_VARS))})")
            ctl = next((c for c in k + val if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F), None)
            if ctl is not None:
                raise FieldError(("env", k), val, f"env {k!r}: {'the name' if ctl in k else 'the value'} holds the "
                                 f"control character {ctl!r} (U+{ord(ctl):04X}); names and values are text without "
                                 "control characters (a NUL cannot reach a process's environment at all)")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v):
        if v is not None and not Path(v).is_dir():
            raise ValueError(f"workdir {v!r} is not a directory")
        return None if v is None else str(Path(v).resolve())

    def resolved(self) -> dict:
        """The spec as the plan records it: relative paths of files in workdir made absolute."""
        argv = list(self.command)
        if self.workdir:
            argv = [str(Path(self.workdir) / a) if not os.path.isabs(a) and (Path(self.workdir) / a).exists()
                    else a for a in argv]
        name = self.name or os.path.basename(self.workdir or "") or os.path.basename(argv[-1])
        return {"name": name, "command": argv, "env": dict(self.env), "workdir": self.workdir, "builtin": None}


CONTRACT_VARS = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "AWS_CONFIG_FILE",
                 "AWS_SHARED_CREDENTIALS_FILE", "HOME", "TMPDIR", "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED",
                 "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}


def resolve_runner(runner: "str | RunnerSpec") -> dict:
    if isinstance(runner, str):
        return {"name": runner, "command": builtin_command(runner), "env": {}, "workdir": None, "builtin": runner}
    return runner.resolved()


def parse_runner(v):
    """A built-in runner name, or a runner mapping validated into a RunnerSpec (one clear message)."""
    if isinstance(v, str) and v not in BUILTIN:
        raise ValueError(f"unknown runner {v!r}; valid built-in runners: {', '.join(sorted(BUILTIN))} "
                         "(or a mapping with `command`, or --runner-cmd)")
    if isinstance(v, dict):
        try:
            return RunnerSpec.model_validate(v)
        except ValidationError as err:
            errors = []
            for e in err.errors():
                loc, value = tuple(e["loc"]), e.get("input")
                inner = (e.get("ctx") or {}).get("error")
                if isinstance(inner, FieldError):  # a check that names a place inside its field (env.<KEY>)
                    loc, value = tuple(e["loc"]) + inner.loc[len(e["loc"]):], inner.value
                if e["type"] == "extra_forbidden":
                    msg = f"unknown field; allowed fields: {', '.join(sorted(RunnerSpec.model_fields))}"
                else:
                    msg = e["msg"].removeprefix("Value error, ")
                errors.append((loc, value, msg))
            text = "; ".join(f"runner.{'.'.join(str(p) for p in loc)} (value {shown(value, loc)}): {msg}"
                             for loc, value, msg in errors)
            raise FieldError(errors[0][0], errors[0][1], text, errors) from None
    if not isinstance(v, (str, RunnerSpec)):
        raise ValueError("runner must be a built-in name or a mapping with `command`, `env`, `workdir`, `name`")
    return v


class ModelConfig(Strict):
    """How the scripted model speaks (fleet/dialects.py): detected per request unless pinned."""

    dialect: Literal["auto", "tools", "shell", "text"] = Field(
        "auto", description="tools: calls of the workload's tools; shell: calls of the agent's one command tool; "
                            "text: one fenced bash block per answer; auto: from each request")
    finish: str | None = Field(None, min_length=1, max_length=500,
                               description="text dialect: the command the last answer runs to finish, as the "
                                           "agent's protocol defines it (default: echo "
                                           "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT, mini-swe-agent's)")

    @field_validator("finish")
    @classmethod
    def _finish(cls, v):
        if v is not None and ("\0" in v or "```" in v):
            raise ValueError("finish is one shell command: no NUL byte and no ``` fence")
        return v


class SandboxConfig(Strict):
    backend: Literal["process", "docker"] = Field(
        "process", description="process: namespaces + cgroups (bubblewrap); docker: containers of a local image")
    image: str | None = Field(None, min_length=1, max_length=300, pattern=r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?$",
                              description="docker: a local image to run in (never pulled); default: the base image "
                                          "built from Debian's python3 packages")
    workspace_mb: int = Field(64, strict=True, ge=1, le=4096, description="size of the workspace tmpfs (the only "
                              "writable place); at most memory_mb: what a runner writes there counts in its memory")
    memory_mb: int = Field(512, strict=True, ge=64, le=65536, description="memory limit of each sandbox (its cgroup)")
    pids_max: int = Field(256, strict=True, ge=16, le=65536, description="process limit of each sandbox (its cgroup)")
    cpu_shares: int = Field(256, strict=True, ge=2, le=262144, description="cgroup cpu.shares of each sandbox")
    cpu_cores: float = Field(1.0, strict=True, ge=0.01, le=256,
                             description="CPU quota of each sandbox, in cores (at least 0.01: the kernel's smallest "
                                         "quota is 1 ms per 100 ms)")
    disk: Literal["wipe", "keep", "move", "lose-unsynced", "torn"] = Field(
        "wipe", description="what an interruption leaves of the task's disk (its workspace and HOME): wipe = the next "
                            "attempt starts on a fresh one (a new machine); keep = on the same one, everything "
                            "written still there (a restarted container, a rebooted VM); lose-unsynced = a power "
                            "loss: only what was fsynced stays (a create or rename once its directory was fsynced); "
                            "torn = lose-unsynced, and the write in flight keeps a seeded prefix; move = a node "
                            "loss (PK3) re-attaches it to the next attempt on another node, as a network disk; a "
                            "fault's own fault_timing.<id>.disk overrides it")

    @model_validator(mode="after")
    def _image(self):
        if self.image and self.backend != "docker":
            raise ValueError(f"sandbox.image {self.image!r} is for backend docker, not {self.backend!r}")
        if self.workspace_mb > self.memory_mb:  # tmpfs pages count in the memory cgroup of the sandbox writing them
            raise ValueError(f"sandbox.workspace_mb {self.workspace_mb} is more than memory_mb {self.memory_mb}: "
                             "the workspace is a tmpfs charged to the sandbox's memory, so filling it would be an "
                             "out-of-memory kill, never the `workspace full` it should be; give workspace_mb <= "
                             "memory_mb")
        return self


REDACTED = "<redacted>"
STORE_SECRET_ENV = "SANDFLEET_STORE_SECRET_KEY"


class StoreConfig(Strict):
    url: str | None = Field(None, description="existing S3 endpoint, http://HOST[:PORT] (port 1-65535, no path; "
                                              "no https: the fault proxy speaks plain HTTP); empty = embedded "
                                              "SeaweedFS")
    access_key: str | None = Field(None, description="with url (only): the key id")
    secret_key: str | None = Field(None, description="with url: the secret (never written to plan.json; resume "
                                                     "and replay read it from $SANDFLEET_STORE_SECRET_KEY)")
    # the per-task quota, enforced at the fault proxy (storage/quota.py): a write past it is answered
    # 403 QuotaExceeded and the task's grade says so (`within_store_quota`)
    quota_objects: int = Field(10000, strict=True, ge=1, le=100_000_000,
                               description="objects one task's prefix may hold (1 to 100,000,000)")
    quota_mb: int = Field(1024, strict=True, ge=1, le=100_000_000,
                          description="MiB one task's prefix may hold, open multipart parts included "
                                      "(1 to 100,000,000)")
    audit_max_objects: int = Field(10000, strict=True, ge=1, le=100_000_000,
                                   description="objects the end-of-wave store audit reads back at most; past it, a "
                                               "sample of this many seeded by the wave's seed (1 to 100,000,000)")

    @field_validator("url", "access_key", "secret_key")
    @classmethod
    def _text(cls, v, info):
        """A control character in the URL or a key would reach a request line or a signature as it is (runner.env
        refuses them too); the error names the character and where, never the key."""
        if v is None:
            return v
        at, ctl = next(((i, c) for i, c in enumerate(v) if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), (None, None))
        if ctl is not None:
            raise ValueError(f"store.{info.field_name} holds the control character U+{ord(ctl):04X} at position "
                             f"{at}; it is text without control characters"
                             + (f"; allowed: {STORE_URL_FORM}" if info.field_name == "url" else ""))
        if info.field_name != "url" and not v.isprintable():
            raise ValueError(f"store.{info.field_name} holds a character that is not printable (a format or bidi "
                             "character); a key is printable text")
        return v

    @model_validator(mode="after")
    def _keys(self):
        if self.secret_key == REDACTED:
            raise ValueError(f"store.secret_key is {REDACTED} (a wave's plan.json never holds it): give it again in "
                             f"${STORE_SECRET_ENV}")
        if self.url:
            from urllib.parse import urlsplit

            try:
                userinfo = urlsplit(self.url).password is not None or "@" in urlsplit(self.url).netloc
            except ValueError:
                userinfo = False
            if userinfo:  # the URL is written to plan.json and reports: a password in it would be kept verbatim
                raise ValueError("store.url holds a user or password (user:pass@host); give the key id in "
                                 "store.access_key and the secret in store.secret_key, and the URL without them")
        if not self.url and (self.access_key or self.secret_key):  # they would be ignored: the embedded store
            # makes its own keys
            given = "store.access_key" if self.access_key else "store.secret_key"
            raise ValueError(f"{given} is given without store.url: keys are for an existing S3 store at store.url "
                             "(the embedded SeaweedFS makes its own); give store.url too, or drop the keys")
        if self.url:
            problem = _endpoint_problem(self.url)
            if problem:
                raise ValueError(f"store.url {self.url!r}: {problem}; allowed: {STORE_URL_FORM}")
        if self.url and not (self.access_key and self.secret_key):
            raise ValueError(f"store.url {self.url!r} needs store.access_key and store.secret_key "
                             "(or leave store.url empty for the embedded SeaweedFS)")
        return self


STORE_URL_FORM = "http://HOST[:PORT], port 1-65535 (default 80), no path, query or fragment " \
                 "(e.g. http://127.0.0.1:8333)"


def _endpoint_problem(url: str) -> str | None:
    """Why `url` is not an S3 endpoint the store clients can use (a scheme, a host, a port in range, nothing
    after it), or None."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port out of range or not a number, an unclosed [IPv6
        return f"not a usable URL ({exc})"
    if parts.scheme.lower() == "https":  # storage/proxy connects to HOST:PORT over plain TCP
        return "the fault proxy in front of the store speaks plain HTTP to it (no TLS), so https would be sent in " \
               "clear text, to port 80 unless one is given"
    if parts.scheme.lower() != "http":
        return f"scheme {parts.scheme or '(none)'!r} is not http"
    if not parts.hostname or any(c.isspace() for c in parts.netloc):
        return "it names no host"
    host = parts.netloc.rpartition("@")[2]
    if not re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?", host):  # one form, as the proxy dials it
        return "the host is letters, digits, '.' and '-' (or a [IPv6] address), then an optional :PORT of digits " \
               "(no empty port, percent-escape or non-ASCII character)"
    if port == 0:
        return "port 0 is not a port a store listens on"
    if parts.path not in ("", "/") or parts.query or parts.fragment or url.endswith(("?", "#")):
        return "the store clients address buckets under the endpoint's root, so it takes no path, query or fragment"
    return None


class HealthConfig(Strict):
    """How long the wave waits on a silent part of the harness before it ends as a harness fault (exit 2): a part
    that died is seen at once; one that stopped answering after `strikes` probes in a row that each got no answer
    within `answer_s` (services: store, proxy, model endpoint, effects service, docker engine) or `actor_timeout_s`
    (Ray actors: the ledger, the sandbox hosts). Larger values wait longer on a loaded machine before calling a part
    hung; smaller ones end a hung wave sooner."""

    answer_s: float = Field(3.0, strict=True, gt=0, le=600,
                            description="a service's answer to one probe (HTTP or docker ping)")
    strikes: int = Field(3, strict=True, ge=1, le=100, description="unanswered service probes in a row")
    actor_timeout_s: float = Field(5.0, strict=True, gt=0, le=600, description="an actor's answer to one ping")
    actor_strikes: int = Field(3, strict=True, ge=1, le=100, description="unanswered actor pings in a row")


S3_OPS = ("PutObject", "UploadPart", "CreateMultipartUpload", "CompleteMultipartUpload", "AbortMultipartUpload",
          "DeleteObject", "DeleteObjects", "GetObject", "HeadObject", "ListParts", "ListObjectsV2", "ListObjects",
          "ListMultipartUploads", "PostObject")


class RequestTrigger(Strict):
    ops: list[str] | None = Field(None, description="S3 operation names, e.g. [UploadPart]")
    key_prefix: str = Field("", max_length=500, description="under the task's prefix, e.g. snapshots/")
    methods: list[Literal["GET", "PUT", "POST", "DELETE", "HEAD"]] | None = Field(None, description="HTTP methods")

    @field_validator("ops")
    @classmethod
    def _ops(cls, v):
        bad = [o for o in v or [] if o not in S3_OPS]
        if bad:
            raise ValueError(f"unknown S3 operation {bad[0]!r}; valid: {', '.join(S3_OPS)}")
        return v

    @field_validator("key_prefix")
    @classmethod
    def _prefix(cls, v):
        if v.startswith("/") or ".." in v.split("/"):
            raise ValueError(f"key_prefix {v!r} must stay under the task's prefix (no leading '/', no '..')")
        return v


SPAN = {"allowed": "0 <= lo <= hi < 1e6"}  # a [lo, hi] of seconds (checked in FaultTiming._range; shown in the docs)
COUNT_SPAN = {"allowed": "1 <= lo <= hi < 1e6"}  # a [lo, hi] of boundaries: the 1st is the first
Span = tuple[StrictFloat, StrictFloat]  # a [lo, hi] of seconds: numbers only (`true` or "3" is refused, never cast)
Count = tuple[StrictInt, StrictInt]  # a boundary's [lo, hi]: integers only (`true` or "3" is refused, never cast)
DISK_BOUNDARIES = ("after_disk_writes", "after_disk_fsyncs", "after_disk_renames")  # counted by the lazy layer
STRENGTH_FAULTS = ("ST1", "ST2", "ST3", "ST4", "ST5", "ST7", "ST8", "CR1", "DF1")


class FaultTiming(Strict):
    at_s: Span | None = Field(None, description="fire a seeded [lo, hi] s after the runner started",
                                             json_schema_extra=SPAN)
    window_s: Span | None = Field(
        None, description="how long the fault lasts, seeded in [lo, hi] s (PK3: the drain's deadline; PK6: thaw "
                          "this long after the new attempt started; NP1: the cut)", json_schema_extra=SPAN)
    after_model_calls: Count | None = Field(
        None, description="PK1: kill right after the Nth model answer is delivered, N seeded in [lo, hi]; the "
                          "storage faults, CR1 and DF1: armed right after it instead of at a clock time (where in "
                          "the run the fault lands then does not move with the machine's load; campaigns arm their "
                          "storage fault so by default)", json_schema_extra=COUNT_SPAN)
    after_effects: Count | None = Field(
        None, description="PK1: kill right after the Nth external effect was answered, N seeded in [lo, hi]",
        json_schema_extra=COUNT_SPAN)
    after_store_writes: Count | None = Field(
        None, description="PK1: kill at the Nth store write answered 2xx, N seeded in [lo, hi] (see variant)",
        json_schema_extra=COUNT_SPAN)
    after_disk_writes: Count | None = Field(
        None, description="PK1 on a crash-mode disk (lose-unsynced, torn): kill while the runner's Nth write to its "
                          "disk is in flight (DCP-2.0's SENTINEL_WRITE), N counted over the volume's life, seeded",
        json_schema_extra=COUNT_SPAN)
    after_disk_fsyncs: Count | None = Field(
        None, description="PK1 on a crash-mode disk: kill right before the Nth fsync returns (its data persisted)",
        json_schema_extra=COUNT_SPAN)
    after_disk_renames: Count | None = Field(
        None, description="PK1 on a crash-mode disk: kill right after the Nth rename was applied",
        json_schema_extra=COUNT_SPAN)
    after_checkpoints: Count | None = Field(
        None, description="PK5: kill right after the runner's Nth named window announced through "
                          "SANDFLEET_CHECKPOINT (whose name starts with `window`), N seeded in [lo, hi]",
        json_schema_extra=COUNT_SPAN)
    window: str | None = Field(None, min_length=1, max_length=200,
                               description="PK5: count only announcements whose name starts with this")
    at_request: RequestTrigger | None = Field(
        None, description="PK1: kill at the task's next store request matching this (held by the proxy, never "
                          "forwarded, while the sandbox is killed)")
    kills: int | None = Field(None, ge=1, le=50, strict=True,
                              description="PK1/PK5 at a boundary: K kills in one task, at K distinct seeded N in "
                                          "[lo, hi], one after the other; PK4: K attempts killed")
    strength: float | None = Field(None, strict=True, gt=0, le=1e6, description=(
        "one knob per fault, for campaigns: ST1/ST5 window seconds, ST2 added latency ms, ST3 error share "
        "(0-1), ST7 lag seconds, ST8 PUTs throttled, CR1 seconds the old key is still served"))
    hits: int | None = Field(None, ge=1, le=100000, strict=True,
                             description="storage faults: end the window after this many hit requests "
                                         "(1 = once); default: the whole window")
    mode: Literal["abrupt", "drain"] | None = Field(
        None, description="PK3: 'abrupt' = the node's raylet and host die at once; 'drain' = a Ray drain with reason "
                          "PREEMPTION and a deadline (window_s), a notice to every sandbox there, then the loss; "
                          "default: seeded per task")
    down_s: Span | None = Field(
        None, description="PK3: the lost node comes back (a new Ray node with the same name) a seeded [lo, hi] s "
                          "later; default [2, 6]", json_schema_extra=SPAN)
    fencing: bool | None = Field(
        None, description="NP1: false leaves the cut-off attempts' keys valid (a negative control: their zombies' "
                          "writes land, and the wave must fail); default true")
    disk: Literal["wipe", "keep", "move", "lose-unsynced", "torn"] | None = Field(
        None, description="what this interruption leaves of the task's disk when it ends an attempt (wipe, keep, "
                          "move, lose-unsynced, torn; the fault's own disk_modes); default: sandbox.disk")
    variant: Literal["after", "ambiguous"] | None = Field(
        None, description="after_store_writes: 'after' = once the runner got the answer; 'ambiguous' = the store "
                          "applied the write but the proxy holds its answer")

    @field_validator("at_s", "window_s", "after_model_calls", "after_effects", "after_store_writes",
                     "after_checkpoints", "after_disk_writes", "after_disk_fsyncs", "after_disk_renames", "down_s")
    @classmethod
    def _range(cls, v, info):
        if v is not None and not (0 <= v[0] <= v[1] < 1e6):
            raise ValueError(f"must be [lo, hi] with 0 <= lo <= hi < 1e6 (finite), got {list(v)}")
        if v is not None and info.field_name.startswith("after_") and v[0] < 1:
            raise ValueError(f"counts boundaries from the 1st: [lo, hi] with 1 <= lo <= hi, got {list(v)} (a 0th "
                             "boundary never comes)")
        return v

    @model_validator(mode="after")
    def _one_boundary(self):
        kinds = [k for k in ("after_model_calls", "after_effects", "after_store_writes", "after_checkpoints",
                             "at_request", *DISK_BOUNDARIES) if getattr(self, k)]
        if len(kinds) > 1:
            raise ValueError(f"give one boundary per fault, not {' and '.join(kinds)}")
        if self.at_request is not None and self.kills and self.kills > 1:
            raise ValueError("at_request fires once (the next matching request); kills applies to the N-th triggers")
        if self.kills and self.kills > 1 and kinds and kinds[0] != "at_request":
            lo, hi = getattr(self, kinds[0])
            if hi - lo + 1 < self.kills:
                raise ValueError(f"kills {self.kills} needs that many distinct N in {kinds[0]} {[lo, hi]}")
        if self.window and not self.after_checkpoints:
            raise ValueError("window applies to after_checkpoints only")
        if self.variant and not self.after_store_writes:
            raise ValueError("variant applies to after_store_writes only")
        return self


