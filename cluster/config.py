"""Wave configuration (YAML), validated with pydantic. Unknown fields are errors.

`load_config` raises `ConfigError` whose message names the field, the value and
what is allowed; the CLI turns it into exit code 254.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from faults.base import CATALOG
from fleet.runners import BUILTIN, builtin_command
from fleet.workloads import WORKLOADS


class ConfigError(ValueError):
    pass


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkloadConfig(Strict):
    name: str = Field("patch-repo", description="the workload the model endpoint scripts")
    steps: int = Field(8, strict=True, ge=1, le=500, description="patch steps per task")
    think_ms: int = Field(150, strict=True, ge=0, le=60000, description="model endpoint think time per call")


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
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict):
        bad = [k for k in v if k.startswith("SANDFLEET_") or k in CONTRACT_VARS or not k or "=" in k]
        if bad:
            raise ValueError(f"env may not set {bad[0]!r}: the harness sets the contract's variables "
                             f"(SANDFLEET_*, {', '.join(sorted(CONTRACT_VARS))})")
        for k, val in v.items():
            ctl = next((c for c in k + val if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F), None)
            if ctl is not None:
                raise ValueError(f"env {k!r}: {'the name' if ctl in k else 'the value'} holds the control character "
                                 f"{ctl!r} (U+{ord(ctl):04X}); names and values are text without control characters "
                                 "(a NUL cannot reach a process's environment at all)")
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


CONTRACT_VARS = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "HOME",
                 "TMPDIR", "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED",
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
            msgs = []
            for e in err.errors():
                where = ".".join(str(p) for p in e["loc"])
                if e["type"] == "extra_forbidden":
                    msg = f"unknown field; allowed fields: {', '.join(sorted(RunnerSpec.model_fields))}"
                else:
                    msg = e["msg"].removeprefix("Value error, ")
                msgs.append(f"runner.{where} (value {e.get('input')!r}): {msg}")
            raise ValueError("; ".join(msgs)) from None
    if not isinstance(v, (str, RunnerSpec)):
        raise ValueError("runner must be a built-in name or a mapping with `command`, `env`, `workdir`, `name`")
    return v


class SandboxConfig(Strict):
    backend: Literal["process", "docker"] = Field(
        "process", description="process: namespaces + cgroups (bubblewrap); docker: containers of a local image")
    image: str | None = Field(None, min_length=1, max_length=300, pattern=r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?$",
                              description="docker: a local image to run in (never pulled); default: the base image "
                                          "built from Debian's python3 packages")
    workspace_mb: int = Field(64, ge=1, le=4096)
    memory_mb: int = Field(512, ge=64, le=65536)
    pids_max: int = Field(256, ge=16, le=65536)
    cpu_shares: int = Field(256, ge=2, le=262144, description="cgroup cpu.shares of each sandbox")
    cpu_cores: float = Field(1.0, ge=0.01, le=256, description="CPU quota of each sandbox, in cores (at least 0.01: "
                                                                 "the kernel's smallest quota is 1 ms per 100 ms)")

    @model_validator(mode="after")
    def _image(self):
        if self.image and self.backend != "docker":
            raise ValueError(f"sandbox.image {self.image!r} is for backend docker, not {self.backend!r}")
        return self


REDACTED = "<redacted>"
STORE_SECRET_ENV = "SANDFLEET_STORE_SECRET_KEY"


class StoreConfig(Strict):
    url: str | None = Field(None, description="existing S3 endpoint; empty = embedded SeaweedFS")
    access_key: str | None = None
    secret_key: str | None = None

    @model_validator(mode="after")
    def _keys(self):
        if self.secret_key == REDACTED:
            raise ValueError(f"store.secret_key is {REDACTED} (a wave's plan.json never holds it): give it again in "
                             f"${STORE_SECRET_ENV}")
        if self.url and not (self.access_key and self.secret_key):
            raise ValueError(f"store.url {self.url!r} needs store.access_key and store.secret_key "
                             "(or leave store.url empty for the embedded SeaweedFS)")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"store.url {self.url!r} must start with http:// or https://")
        return self


class HealthConfig(Strict):
    """How long the wave waits on a silent part of the harness before it ends as a harness fault (exit 2): a part
    that died is seen at once; one that stopped answering after `strikes` probes in a row that each got no answer
    within `answer_s` (services: store, proxy, model endpoint, effects service, docker engine) or `actor_timeout_s`
    (Ray actors: the ledger, the sandbox hosts). Larger values wait longer on a loaded machine before calling a part
    hung; smaller ones end a hung wave sooner."""

    answer_s: float = Field(3.0, gt=0, le=600, description="a service's answer to one probe (HTTP or docker ping)")
    strikes: int = Field(3, strict=True, ge=1, le=100, description="unanswered service probes in a row")
    actor_timeout_s: float = Field(5.0, gt=0, le=600, description="an actor's answer to one ping")
    actor_strikes: int = Field(3, strict=True, ge=1, le=100, description="unanswered actor pings in a row")


S3_OPS = ("PutObject", "UploadPart", "CreateMultipartUpload", "CompleteMultipartUpload", "AbortMultipartUpload",
          "DeleteObject", "DeleteObjects", "GetObject", "HeadObject", "ListParts", "ListObjectsV2", "ListObjects",
          "ListMultipartUploads", "PostObject")


class RequestTrigger(Strict):
    ops: list[str] | None = Field(None, description="S3 operation names, e.g. [UploadPart]")
    key_prefix: str = Field("", max_length=500, description="under the task's prefix, e.g. snapshots/")
    methods: list[Literal["GET", "PUT", "POST", "DELETE", "HEAD"]] | None = None

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


STRENGTH_FAULTS = ("ST1", "ST2", "ST3", "ST4", "ST5", "ST7", "ST8", "CR1", "DF1")


class FaultTiming(Strict):
    at_s: tuple[float, float] | None = None
    window_s: tuple[float, float] | None = None
    after_model_calls: tuple[int, int] | None = Field(
        None, description="PK1: kill right after the Nth model answer is delivered, N seeded in [lo, hi]")
    after_effects: tuple[int, int] | None = Field(
        None, description="PK1: kill right after the Nth external effect was answered, N seeded in [lo, hi]")
    after_store_writes: tuple[int, int] | None = Field(
        None, description="PK1: kill at the Nth store write answered 2xx, N seeded in [lo, hi] (see variant)")
    after_checkpoints: tuple[int, int] | None = Field(
        None, description="PK5: kill right after the runner's Nth named window announced through "
                          "SANDFLEET_CHECKPOINT (whose name starts with `window`), N seeded in [lo, hi]")
    window: str | None = Field(None, min_length=1, max_length=200,
                               description="PK5: count only announcements whose name starts with this")
    at_request: RequestTrigger | None = Field(
        None, description="PK1: kill at the task's next store request matching this (held by the proxy, never "
                          "forwarded, while the sandbox is killed)")
    kills: int | None = Field(None, ge=1, le=50, strict=True,
                              description="PK1/PK5 at a boundary: K kills in one task, at K distinct seeded N in "
                                          "[lo, hi], one after the other")
    strength: float | None = Field(None, gt=0, le=1e6, description=(
        "one knob per fault, for campaigns: ST1/ST5 window seconds, ST2 added latency ms, ST3 error share "
        "(0-1), ST7 lag seconds, ST8 PUTs throttled, CR1 seconds the old key is still served"))
    hits: int | None = Field(None, ge=1, le=100000, strict=True,
                             description="storage faults: end the window after this many hit requests "
                                         "(1 = once); default: the whole window")
    mode: Literal["abrupt", "drain"] | None = Field(
        None, description="PK3: 'abrupt' = the node's raylet and host die at once; 'drain' = a Ray drain with reason "
                          "PREEMPTION and a deadline (window_s), a notice to every sandbox there, then the loss; "
                          "default: seeded per task")
    down_s: tuple[float, float] | None = Field(
        None, description="PK3: the lost node comes back (a new Ray node with the same name) a seeded [lo, hi] s "
                          "later; default [2, 6]")
    variant: Literal["after", "ambiguous"] | None = Field(
        None, description="after_store_writes: 'after' = once the runner got the answer; 'ambiguous' = the store "
                          "applied the write but the proxy holds its answer")

    @field_validator("at_s", "window_s", "after_model_calls", "after_effects", "after_store_writes",
                     "after_checkpoints", "down_s")
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
                             "at_request") if getattr(self, k)]
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


class WaveConfig(Strict):
    name: str = Field("wave", pattern=r"^[a-z0-9][a-z0-9-]{0,30}$")
    tasks: int = Field(4, ge=1, le=100000, strict=True)
    concurrency: int = Field(4, ge=1, le=4096, strict=True)
    seed: int = Field(1, ge=0, lt=2**63, strict=True, description="0 to 2^63-1 (it names the wave's directories)")
    runner: str | RunnerSpec = Field("durable", description="a built-in name or {command, env, workdir, name}")
    faults: list[str] = Field(default_factory=list)
    fault_timing: dict[str, FaultTiming] = Field(default_factory=dict)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    deadline_s: float = Field(120.0, gt=0, le=86400, description="per task, from its first launch")
    max_attempts: int = Field(6, strict=True, ge=1, le=100)
    liveness_s: float = Field(30.0, gt=0, le=86400, description="longest silence inside an attempt (no model call, "
                                                               "effect or store request) before it counts as hung")
    retry_loop_n: int = Field(3, strict=True, ge=1, le=100,
                              description="attempts ending the same way more than this many times in a row fail "
                                          "`retry_loop`")
    lease_ttl_s: float = Field(6.0, gt=0.5, le=3600)
    address: str = Field("local", description="'local' starts a private Ray; else an existing cluster")
    nodes: int = Field(1, ge=1, le=16, strict=True,
                       description="Ray nodes of a simulated cluster on this machine (address 'local' only): node-0 "
                                   "is the head (harness), the others run the sandboxes")
    enumerate_boundaries: bool = Field(False, description="run one uninterrupted task, count its boundaries K, "
                                                          "then plan one PK1 task per boundary and variant")
    boundaries: int | None = Field(None, ge=1, le=100000, strict=True,
                                   description="with enumerate_boundaries: a seeded sample of at most this many")

    def public_dump(self) -> dict:
        """The config as plan.json holds it: an external store's secret key redacted (resume and replay take it
        from $SANDFLEET_STORE_SECRET_KEY again)."""
        out = self.model_dump(mode="json")
        if out.get("store", {}).get("secret_key"):
            out["store"]["secret_key"] = REDACTED
        return out

    @model_validator(mode="after")
    def _nodes(self):
        if self.nodes > 1 and self.address != "local":
            raise ValueError(f"nodes {self.nodes} simulates a cluster on this machine and needs address 'local'; "
                             f"with address {self.address!r} the wave uses that cluster's nodes")
        wants = sorted({f for item in self.faults for f in item.split("+")} | set(self.fault_timing)) if \
            isinstance(self.faults, list) else []
        if "PK3" in wants and self.nodes < 3:
            raise ValueError(f"faults: PK3 loses a sandbox node and needs nodes >= 3 (a head and two sandbox nodes: "
                             f"one is lost while the other runs the tasks), got nodes {self.nodes} (use --nodes 3)")
        for fid, t in self.fault_timing.items():
            if fid != "PK3" and (t.mode is not None or t.down_s is not None):
                raise ValueError(f"fault_timing.{fid}: mode and down_s are PK3 knobs, not {fid}'s")
        return self

    @model_validator(mode="after")
    def _enumeration(self):
        if self.boundaries is not None and not self.enumerate_boundaries:
            raise ValueError("boundaries is a sample size for enumerate_boundaries; set that too")
        if self.enumerate_boundaries and [f for f in self.faults if f != "PK1"]:
            raise ValueError(f"enumerate_boundaries plans PK1 at every boundary; faults {self.faults} cannot be "
                             "combined with it (use faults: none or [PK1])")
        return self

    @field_validator("address")
    @classmethod
    def _address(cls, v: str):
        if v in ("local", "auto"):
            return v
        host, _, port = v.split("://", 1)[-1].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected 'local' (a private Ray), 'auto', or HOST:PORT of a Ray head's GCS, "
                             "e.g. 127.0.0.1:6379")
        return v

    @field_validator("runner", mode="before")
    @classmethod
    def _runner(cls, v):
        return parse_runner(v)

    def runner_spec(self) -> dict:
        return resolve_runner(self.runner)

    @field_validator("faults", mode="before")
    @classmethod
    def _faults(cls, v):
        if isinstance(v, str):
            if v.strip().lower() == "none":
                return []
            if not v.strip():
                raise ValueError("an empty fault list must be said explicitly: `none` (or give fault ids, "
                                 f"e.g. PK1,ST1; valid fault ids: {', '.join(sorted(CATALOG))})")
            items = [s.strip() for s in v.split(",")]
            if any(not s for s in items):
                raise ValueError(f"an empty fault id in {v!r}; give comma-separated ids without gaps, e.g. PK1,ST1")
            v = items
        if not isinstance(v, list):
            raise ValueError("faults must be a list of fault ids")
        if any(str(item).strip().lower() == "none" for item in v) and v != ["none"]:
            raise ValueError(f"`none` stands alone (no faults); {v!r} mixes it with fault ids: drop it, or give "
                             "only `none`")
        if v == ["none"]:
            return []
        bad = [f for item in v for f in str(item).split("+") if f not in CATALOG]
        if bad:
            raise ValueError(f"unknown fault id {bad[0]!r}; valid fault ids: {', '.join(sorted(CATALOG))} "
                             "(A+B puts both on one task, e.g. ST1+PK1)")
        twice = [item for item in v if len(set(str(item).split("+"))) != len(str(item).split("+"))]
        if twice:
            raise ValueError(f"{twice[0]!r} names a fault twice; several kills in one task: fault_timing "
                             "<F>.kills")
        return v

    @field_validator("workload")
    @classmethod
    def _workload(cls, v: WorkloadConfig):
        if v.name not in WORKLOADS:
            raise ValueError(f"unknown workload {v.name!r}; valid workloads: {', '.join(sorted(WORKLOADS))}")
        fixed = getattr(WORKLOADS[v.name], "fixed_steps", None)
        if fixed is not None:
            if "steps" in v.model_fields_set and v.steps != fixed:
                raise ValueError(f"workload.steps {v.steps} does not fit workload {v.name!r}: it always has {fixed} "
                                 "steps (leave steps out)")
            v.steps = fixed
        elif v.steps < 2 and v.name != "patch-repo":
            raise ValueError(f"workload.steps {v.steps}: workload {v.name!r} needs at least 2 steps")
        return v

    @field_validator("fault_timing")
    @classmethod
    def _timing(cls, v: dict):
        bad = [f for f in v if f not in CATALOG]
        if bad:
            raise ValueError(f"unknown fault id {bad[0]!r}; valid fault ids: {', '.join(sorted(CATALOG))}")
        for fid, t in v.items():
            boundary = [k for k in ("after_model_calls", "after_effects", "after_store_writes", "at_request")
                        if getattr(t, k)]
            for rule in (_pk5_trigger, _strength_and_hits, _trigger_of_its_kind, _kills):
                rule(fid, t, boundary)
        return v

    def fault_params(self) -> dict[str, dict]:
        return {k: {kk: vv for kk, vv in t.model_dump().items() if vv is not None}
                for k, t in self.fault_timing.items()}


# fault_timing's rules across fields, one family each; each raises ValueError("<fault id>: ...") naming the field
def _pk5_trigger(fid: str, t, boundary: list[str]) -> None:
    if fid == "PK5" and (boundary or t.at_s):
        raise ValueError(f"PK5: {(boundary or ['at_s'])[0]} is not its trigger: PK5 fires at a named window: "
                         "give after_checkpoints (and window)")
    if t.after_checkpoints and fid != "PK5":
        raise ValueError(f"{fid}: after_checkpoints is PK5's trigger (named windows)")


def _strength_and_hits(fid: str, t, boundary: list[str]) -> None:
    if t.strength is not None:
        if fid not in STRENGTH_FAULTS:
            raise ValueError(f"{fid}: strength is a campaign knob of {', '.join(STRENGTH_FAULTS)} only")
        if fid == "ST3" and t.strength > 1:
            raise ValueError(f"ST3: strength {t.strength} is a share of requests, at most 1")
    if t.hits and not fid.startswith("ST"):
        raise ValueError(f"{fid}: hits applies to the storage faults (ST*) only")


def _trigger_of_its_kind(fid: str, t, boundary: list[str]) -> None:
    armed_only = fid in ("CR1", "DF1") or fid.startswith("ST")  # armed at a clock time or a model answer
    wrong = [k for k in ("after_effects", "after_store_writes", "at_request") if getattr(t, k)]
    if armed_only and (wrong or (t.kills and fid in ("CR1", "DF1"))):
        raise ValueError(f"{fid}: {(wrong or ['kills'])[0]} is not one of its triggers: give at_s or "
                         "after_model_calls (when it is armed), and window_s")
    if boundary and fid not in ("PK1", "PK2", "PK3", "PK5", "PK6") and not armed_only:
        raise ValueError(f"{fid}: {boundary[0]} applies to PK1, PK2, PK3, PK6 (and after_model_calls to CR1, "
                         "DF1 and the storage faults ST*) only")


def _kills(fid: str, t, boundary: list[str]) -> None:
    if t.kills and fid not in ("PK1", "PK2", "PK4", "PK5"):
        raise ValueError(f"{fid}: kills applies to PK1, PK2, PK4 and PK5 only")
    if t.kills and t.kills > 1 and fid in ("PK1", "PK2", "PK5") and not (boundary or t.after_checkpoints):
        raise ValueError(f"{fid}: kills {t.kills}: several kills in one task need a boundary "
                         "(after_model_calls, after_effects, after_store_writes or after_checkpoints): a clock "
                         "time after launch would land while the next attempt starts")


def _format(err: ValidationError, source: str) -> str:
    lines = [f"invalid wave config ({source}):"]
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        path, value = tuple(e["loc"]), e.get("input")
        if e["type"] == "value_error" and isinstance(value, dict):  # a check across fields: name the one it is about
            key = msg.split(":", 1)[0]
            if path == ("fault_timing",) and isinstance(value.get(key), dict):  # "PK5: ...": about fault_timing.PK5
                path, value = path + (key,), value[key]
            field = _named_field(path, msg)
            if field is not None:
                path, value = path + (field,), value.get(field)
        loc = ".".join(str(p) for p in path) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = _allowed_fields(e["loc"])
            msg = f"unknown field; allowed fields here: {', '.join(allowed)}"
        lines.append(f"  field `{loc}`: value {value!r}: {msg}")
    return "\n".join(lines)


def _model_at(loc: tuple) -> type[BaseModel]:
    """The config model at `loc` (a mapping's key, as in fault_timing.PK1, is stepped over)."""
    import typing

    model: type[BaseModel] = WaveConfig
    parts = list(loc)
    while parts:
        field = model.model_fields.get(str(parts.pop(0)))
        ann = getattr(field, "annotation", None) if field else None
        args = typing.get_args(ann) if typing.get_origin(ann) is dict else ()
        if args and isinstance(args[-1], type) and issubclass(args[-1], BaseModel):
            ann = args[-1]
            if parts:
                parts.pop(0)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            break
        model = ann
    return model


def _allowed_fields(loc: tuple) -> list[str]:
    return sorted(_model_at(tuple(loc)[:-1]).model_fields)


def _named_field(loc: tuple, msg: str) -> str | None:
    """The first field of the model at `loc` that a cross-field check's message names (`nodes 3 ...`,
    `sandbox.image ...`, `give one boundary per fault, not after_model_calls and ...`)."""
    import re

    fields = _model_at(loc).model_fields
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", msg):
        name = word.rsplit(".", 1)[-1]
        if name in fields:
            return name
    return None


def build_config(data: dict, overrides: dict | None = None, source: str = "config") -> "WaveConfig":
    data = dict(data or {})
    store = data.get("store")
    if isinstance(store, dict) and store.get("url") and store.get("secret_key") in (None, REDACTED) and \
            os.environ.get(STORE_SECRET_ENV):  # an external store's secret from the environment (resume, replay)
        data["store"] = dict(store, secret_key=os.environ[STORE_SECRET_ENV])
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        if k in ("workload_name", "workload_steps"):  # --workload / --steps refine the workload mapping
            wl = data.get("workload")
            wl = dict(wl) if isinstance(wl, dict) else {}
            wl["name" if k == "workload_name" else "steps"] = v
            data["workload"] = wl
        else:
            data[k] = v
    try:
        return WaveConfig(**data)
    except ValidationError as err:
        raise ConfigError(_format(err, source)) from None
    except TypeError as err:
        raise ConfigError(f"invalid wave config ({source}): {err}") from None


MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_NODES = 100_000  # values in the document once its aliases are expanded (a config has a few hundred)


def _expanded_size(node, memo: dict) -> int:
    """How many values a YAML node stands for once every alias in it is expanded (an alias is a shared node)."""
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, yaml.ScalarNode):
        n = 1
    elif isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded_size(c, memo) for c in node.value)
    else:
        n = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[id(node)] = n
    return n


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (the last one would win silently), and
    a document that stands for more than MAX_YAML_NODES values once its aliases are expanded is refused before
    it is built (an alias bomb of 1.5 KB made the CLI run out of memory instead of answering)."""

    def construct_document(self, node):
        n = _expanded_size(node, {})
        if n > MAX_YAML_NODES:
            raise yaml.constructor.ConstructorError(None, None, f"its aliases (*name) expand to {n} values, more than "
                                                    f"the {MAX_YAML_NODES} a config may hold; write the values out",
                                                    node.start_mark)
        return super().construct_document(node)

    def construct_yaml_int(self, node):
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > 40:  # Python refuses past 4300 digits with a traceback; no field of a config needs 40
            raise yaml.constructor.ConstructorError(None, None, f"an integer of {digits} digits; a config's integers "
                                                    "have at most 40", node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice in one mapping "
                                                        "(the last one would win silently)", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)


def load_yaml(text: str):
    """Parse a config file's YAML; raises yaml.YAMLError (duplicate keys included)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_config(path: str | Path | None, overrides: dict | None = None) -> WaveConfig:
    data: dict = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file {str(p)!r} is a directory; give a YAML file (e.g. configs/quickstart.yaml)")
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            if p.stat().st_size > MAX_CONFIG_BYTES:
                raise ConfigError(f"config file {str(p)!r} is {p.stat().st_size} bytes; a config is at most "
                                  f"{MAX_CONFIG_BYTES} bytes")
            data = load_yaml(p.read_text())
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {err}") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"config file {str(p)!r} cannot be read: {err}") from None
        except ConfigError:
            raise
        except (ValueError, RecursionError) as err:  # an integer past Python's 4300-digit limit; nesting too deep
            raise ConfigError(f"config file {str(p)!r} has a value that cannot be read: "
                              f"{err or type(err).__name__}") from None
        if data is None:
            raise ConfigError(f"config file {str(p)!r} is empty; give at least one field (e.g. `tasks: 4`), "
                              "or run without a config file for the defaults")
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(p)!r}: top level must be a mapping, got {type(data).__name__}")
        source = str(p)
    return build_config(data, overrides, source)
