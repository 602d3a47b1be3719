"""Wave configuration (YAML), validated with pydantic. Unknown fields are errors.

`load_config` raises `ConfigError` whose message names the field, the value and
what is allowed; the CLI turns it into exit code 254.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from cluster.config_fields import (CONTRACT_VARS, DISK_BOUNDARIES, REDACTED, S3_OPS, STORE_SECRET_ENV, STRENGTH_FAULTS,  # noqa: F401
                                   ConfigError, FaultTiming, GatewayConfig, HealthConfig, ModelConfig, RequestTrigger,
                                   RunnerSpec, SandboxConfig, StoreConfig, Strict, VolatilePath, WorkloadConfig,
                                   parse_runner, resolve_runner)
from cluster.config_errors import format_error, is_config_name, shown
from cluster.config_yaml import MAX_CONFIG_BYTES, MAX_YAML_NODES, load_yaml, yaml_problem  # noqa: F401
from faults.base import CATALOG
from fleet.workloads import WORKLOADS


class WaveConfig(Strict):
    name: str = Field("wave", pattern=r"^[a-z0-9][a-z0-9-]{0,30}$",
                      description="part of the wave id (results/<wave id>/)")
    tasks: int = Field(4, ge=1, le=100000, strict=True,
                       description="tasks of the wave (ignored with enumerate_boundaries)")
    concurrency: int = Field(4, ge=1, le=10000, strict=True, description="tasks in flight at once (and as many "
                             "reference runs beside them)")
    seed: int = Field(1, ge=0, lt=2**63, strict=True, description="0 to 2^63-1 (it names the wave's directories)")
    runner: str | RunnerSpec = Field("durable", description="a built-in name or {command, env, workdir, name}")
    faults: list[str] = Field(default_factory=list, description="fault ids (docs/reference/faults.md), or `none`; "
                              "`A+B` puts both on one task, e.g. ST1+PK1")
    fault_free_reference: Literal["run", "self"] = Field(
        "run", description="`run`: a task with no fault planned gets an uninterrupted reference beside it like any "
                           "other (two runs of each seed: a runner that is not deterministic is caught in this "
                           "wave); `self`: it is its own reference when it ran once untouched (no second run: a cold "
                           "fault-free wave costs about a warm one, and determinism is checked only by later waves "
                           "against the cache)")
    fault_timing: dict[str, FaultTiming] = Field(default_factory=dict,
                                                 description="per fault id: when it fires and its knobs")
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig, description="what the tasks do")
    model: ModelConfig = Field(default_factory=ModelConfig, description="how the scripted model speaks")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="backend, limits and disk mode")
    store: StoreConfig = Field(default_factory=StoreConfig, description="the S3 store (default: embedded)")
    health: HealthConfig = Field(default_factory=HealthConfig, description="when a silent harness part is hung")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="the head's gate for other nodes")
    deadline_s: float = Field(120.0, strict=True, gt=0, le=86400, description="per task, from its first launch")
    max_attempts: int = Field(6, strict=True, ge=1, le=100, description="attempts per task before it fails "
                              "`attempt_budget`")
    liveness_s: float = Field(30.0, strict=True, gt=0, le=86400,
                              description="longest silence inside an attempt (no model call, effect or store "
                                          "request) before it counts as hung")
    retry_loop_n: int = Field(3, strict=True, ge=1, le=100,
                              description="attempts ending the same way more than this many times in a row fail "
                                          "`retry_loop`")
    lease_ttl_s: float = Field(6.0, strict=True, gt=0.5, le=3600,
                               description="an attempt's lease lasts this long unless renewed; an expired lease is "
                                           "fenced")
    address: str = Field("local", description="'local' starts a private Ray; 'fleet' attaches to the fleet of "
                         "`sandfleet up`; else an existing cluster")
    nodes: int = Field(1, ge=1, le=16, strict=True,
                       description="Ray nodes of a simulated cluster on this machine (address 'local' only): node-0 "
                                   "is the head (harness), the others run the sandboxes")
    node_isolation: Literal["none", "namespaces"] = Field(
        "none", description="'namespaces': every node (the head too) in network, mount and pid namespaces of its "
                            "own on this machine, linked by veths only they hold (nodes >= 2, root)")
    enumerate_boundaries: bool = Field(False, description="run one uninterrupted task, count its boundaries K, "
                                                          "then plan one PK1 task per boundary and variant")
    boundaries: int | None = Field(None, ge=1, le=100000, strict=True,
                                   description="with enumerate_boundaries: a seeded sample of at most this many")
    min_sandbox_nodes: int | None = Field(None, ge=1, le=100000, strict=True,
                                          description="with an existing cluster (address HOST:PORT or auto): the "
                                                      "wave exits 2 before any task unless at least this many alive "
                                                      "sandbox nodes other than the driver's own are found")
    volatile: list[VolatilePath] = Field(default_factory=list, max_length=100,
                                         description="paths of the artifact that legitimately differ on every run "
                                                     "(globs, each with why): left out of resume_equivalent")

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
        if self.min_sandbox_nodes is not None and self.address in ("local", "fleet"):
            raise ValueError(f"min_sandbox_nodes {self.min_sandbox_nodes} is for an existing cluster (address "
                             f"HOST:PORT or auto); address {self.address!r} has a known number of nodes (use --nodes)")
        if self.address == "fleet" and self.store.url:
            raise ValueError(f"address 'fleet' runs on the fleet's own store; store.url {self.store.url!r} is for a "
                             "wave's own Ray (address 'local')")
        if self.node_isolation == "namespaces" and (self.nodes < 2 or self.address != "local"):
            raise ValueError(f"nodes {self.nodes} with node_isolation 'namespaces': isolated nodes are a head and at "
                             "least one sandbox node made on this machine (nodes >= 2, address 'local')")
        wants = sorted({f for item in self.faults for f in item.split("+")} | set(self.fault_timing)) if \
            isinstance(self.faults, list) else []
        if "PK3" in wants and self.nodes < 3:
            raise ValueError(f"faults: PK3 loses a sandbox node and needs nodes >= 3 (a head and two sandbox nodes: "
                             f"one is lost while the other runs the tasks), got nodes {self.nodes} (use --nodes 3)")
        for item in self.faults if isinstance(self.faults, list) else []:
            node_level = [f for f in item.split("+") if getattr(CATALOG.get(f), "takes_node", False)]
            if len(node_level) > 1 and self.nodes < len(node_level) + 2:
                raise ValueError(
                    f"faults: {item!r} puts {len(node_level)} node-level faults ({', '.join(node_level)}) on one task; "
                    "each takes the task's node for its window while the task goes on on another, so one task needs "
                    f"{len(node_level) + 1} sandbox nodes (nodes >= {len(node_level) + 2}), got nodes {self.nodes}: "
                    f"use --nodes {len(node_level) + 2}, or give each its own item (one node-level fault per task)")
        network = [f for f in wants if f in ("NP1", "NP2")]
        if network and self.node_isolation != "namespaces":
            raise ValueError(f"faults: {', '.join(network)} cut or degrade a sandbox node's own link to the head, and "
                             "need isolated nodes (node_isolation: namespaces, --isolated-nodes --nodes 3)")
        if "NP1" in wants and self.nodes < 3:
            raise ValueError(f"faults: NP1 cuts a sandbox node off and needs nodes >= 3 (a head and two sandbox "
                             f"nodes: the cut one's tasks go to the other), got nodes {self.nodes} (use --nodes 3)")
        for fid, t in self.fault_timing.items():
            disk_kinds = [k for k in DISK_BOUNDARIES if getattr(t, k)]
            if disk_kinds and fid != "PK1":
                raise ValueError(f"fault_timing.{fid}.{disk_kinds[0]}: the disk's boundaries arm PK1 only")
            if disk_kinds and not self.lazy_volumes():
                raise ValueError(f"fault_timing.{fid}.{disk_kinds[0]}: the disk's writes, fsyncs and renames are "
                                 "counted by the lazy file system, which serves a kept volume only: set "
                                 "sandbox.disk (or this fault's disk) to keep, lose-unsynced or torn")
            modes = getattr(CATALOG[fid], "disk_modes", ())
            if t.disk is not None and t.disk not in modes:
                raise ValueError(f"fault_timing.{fid}.disk {t.disk!r}: " + (
                    f"{fid} ends no attempt, so it leaves the disk as it is; a disk mode belongs to an interruption "
                    "that ends one (PK1, PK2, PK4, PK5)" if not modes else
                    f"{fid} allows {', '.join(modes)}" + ("" if "keep" in modes else
                                                           " (it takes the node, or leaves a zombie on the old disk)")
                    + (" (move: a node loss's, PK3)" if t.disk == "move" else "")))
        if self.sandbox.disk != "wipe":
            for fid in wants:
                t = self.fault_timing.get(fid)
                modes = getattr(CATALOG.get(fid), "disk_modes", ())
                if modes and self.sandbox.disk not in modes and (t is None or t.disk is None):
                    raise ValueError(f"sandbox.disk {self.sandbox.disk!r} with fault {fid}: " + (
                        f"{fid} leaves the task on its node, and move re-attaches a disk on another node after a "
                        "node loss (set fault_timing.PK3.disk: move instead)" if self.sandbox.disk == "move" else
                        f"{fid} takes the node or leaves a zombie on the old disk, so its tasks cannot keep it")
                        + f"; or set fault_timing.{fid}.disk to one of {', '.join(modes)}")
        if "move" in self.disk_modes() and self.nodes < 3:
            where = "sandbox.disk" if self.sandbox.disk == "move" else next(
                f"fault_timing.{fid}.disk" for fid, t in self.fault_timing.items() if t.disk == "move")
            raise ValueError(f"{where} 'move' re-attaches the task's disk on another node after a node loss: it needs "
                             f"nodes >= 3 (a head and two sandbox nodes), got nodes {self.nodes} (use --nodes 3)")
        if self.sandbox.disk in ("lose-unsynced", "torn") and not self.enumerate_boundaries and not any(
                len(getattr(CATALOG.get(fid), "disk_modes", ())) > 1 for fid in wants):
            raise ValueError(f"sandbox.disk {self.sandbox.disk!r}: a crash-mode disk loses what was not synced when "
                             "an interruption kills the sandbox, and "
                             + (f"faults {', '.join(wants)} kill none that keeps its disk" if wants else
                                "no fault is planned")
                             + "; add PK1, "
                             "PK2, PK4 or PK5, or leave sandbox.disk wipe")
        for fid, t in self.fault_timing.items():
            if fid != "PK3" and (t.mode is not None or t.down_s is not None):
                raise ValueError(f"fault_timing.{fid}: mode and down_s are PK3 knobs, not {fid}'s")
            if fid != "NP1" and t.fencing is not None:
                raise ValueError(f"fault_timing.{fid}: fencing is an NP1 knob, not {fid}'s")
        return self

    @model_validator(mode="after")
    def _runner_program(self):
        """A runner program no sandbox of this machine can find: every attempt would fail to start. (On a fleet or
        an existing cluster each node checks it before its first sandbox; a program inside runner.workdir, such as
        an example's .venv built by `make examples`, is checked by the run too, naming it.)"""
        if self.address != "local" or not isinstance(self.runner, RunnerSpec):
            return self
        program = self.runner.command[0]
        if "/" not in program and shutil.which(program) is None:
            raise ValueError(f"runner.command {program!r} is not a program on PATH (the sandboxes get this "
                             "machine's PATH): give a name on PATH, an absolute path, or a path inside "
                             "runner.workdir")
        if "/" in program and not os.path.isabs(program) and not self.runner.workdir:
            raise ValueError(f"runner.command {program!r} is a relative path with no runner.workdir, so it would be "
                             "taken from the sandbox's fresh workspace: give an absolute path, a name on PATH, or "
                             "runner.workdir holding it")
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
        if v in ("local", "auto", "fleet"):
            return v
        host, _, port = v.split("://", 1)[-1].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected 'local' (a private Ray), 'fleet' (the fleet of `sandfleet up`), 'auto', or "
                             "HOST:PORT of a Ray head's GCS, e.g. 127.0.0.1:6379")
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
            shown_id = repr(bad[0]) if is_config_name(bad[0]) else "(a key that is not a config name, not shown)"
            raise ValueError(f"unknown fault id {shown_id}; valid fault ids: {', '.join(sorted(CATALOG))}")
        for fid, t in v.items():
            boundary = [k for k in ("after_model_calls", "after_effects", "after_store_writes", "at_request")
                        if getattr(t, k)]
            for rule in (_pk5_trigger, _strength_and_hits, _trigger_of_its_kind, _kills):
                rule(fid, t, boundary)
        return v

    def disk_after(self, fault_id: str | None) -> str:
        """The disk mode an attempt's end leaves: its fault's own (fault_timing.<id>.disk), else sandbox.disk."""
        t = self.fault_timing.get(fault_id or "")
        return (t.disk if t is not None and t.disk else None) or self.sandbox.disk

    def disk_modes(self) -> set[str]:
        return {self.sandbox.disk} | {t.disk for t in self.fault_timing.values() if t.disk}

    def keeps_disks(self) -> bool:
        """Whether any interruption of this wave keeps a disk (its tasks then get volumes kept across attempts)."""
        return bool(self.disk_modes() - {"wipe"})

    def lazy_disks(self) -> bool:
        """Whether a crash mode is in play: every task's volume is then served through the lazy file system
        (fleet/lazyfs/), which can drop or tear what was not synced."""
        return bool(self.disk_modes() & {"lose-unsynced", "torn"})

    def lazy_volumes(self) -> bool:
        """Whether every task's volume is served through the lazy file system: a crash mode is in play, or a kept
        disk whose writes, fsyncs and renames are boundaries (PK1 at one, or enumerated): the layer counts them
        (under keep it drops nothing)."""
        boundaries = self.enumerate_boundaries or any(getattr(t, k) for t in self.fault_timing.values()
                                                      for k in DISK_BOUNDARIES)
        return self.lazy_disks() or (self.keeps_disks() and boundaries)

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
    if boundary and fid not in ("PK1", "PK2", "PK3", "PK5", "PK6", "NP1") and not armed_only:
        raise ValueError(f"{fid}: {boundary[0]} applies to PK1, PK2, PK3, PK6, NP1 (and after_model_calls to CR1, "
                         "DF1 and the storage faults ST*) only")


def _kills(fid: str, t, boundary: list[str]) -> None:
    if t.kills and fid not in ("PK1", "PK2", "PK4", "PK5"):
        raise ValueError(f"{fid}: kills applies to PK1, PK2, PK4 and PK5 only")
    if t.kills and t.kills > 1 and fid in ("PK1", "PK2", "PK5") and not (boundary or t.after_checkpoints):
        raise ValueError(f"{fid}: kills {t.kills}: several kills in one task need a boundary "
                         "(after_model_calls, after_effects, after_store_writes or after_checkpoints): a clock "
                         "time after launch would land while the next attempt starts")


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
        raise ConfigError(format_error(err, source, WaveConfig)) from None
    except TypeError as err:
        raise ConfigError(f"invalid wave config ({source}): {err}") from None



def load_config(path: str | Path | None, overrides: dict | None = None) -> WaveConfig:
    data: dict = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file {str(p)!r} is a directory; give a YAML file (e.g. configs/quickstart.yaml)")
        if not p.is_file():
            why = "does not exist" if not (p.exists() or p.is_symlink()) else \
                "is not a regular file (a device, FIFO or socket); give a YAML file"
            raise ConfigError(f"config file {str(p)!r} {why}")
        try:
            if p.stat().st_size > MAX_CONFIG_BYTES:
                raise ConfigError(f"config file {str(p)!r} is {p.stat().st_size} bytes; a config is at most "
                                  f"{MAX_CONFIG_BYTES} bytes")
            data = load_yaml(p.read_text())
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {yaml_problem(err)}") from None
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
        if "faults" not in (overrides or {}):
            _timing_of_listed_faults(data, source)
    return build_config(data, overrides, source)


def _timing_of_listed_faults(data: dict, source: str) -> None:
    """A wave file that times a fault it does not list has a typo or a lost fault: it would run without it, silently.
    (A league's or campaign's shared base times faults some of its waves leave out, and `--faults` on the command line
    replaces the file's list: neither comes here.)"""
    timing, faults = data.get("fault_timing"), data.get("faults")
    if not isinstance(timing, dict) or faults is None:
        return
    items = faults.split(",") if isinstance(faults, str) else faults if isinstance(faults, list) else []
    listed = {f.strip() for item in items for f in str(item).split("+")}
    for fid in timing:
        if fid not in listed and not is_config_name(fid):  # a line of a file that is no config: never shown
            raise ConfigError(f"invalid wave config ({source}):\n  fault_timing: a key that is not a config name "
                              f"(not shown); its keys are fault ids (docs/reference/faults.md)")
        if fid not in listed:
            raise ConfigError(f"invalid wave config ({source}):\n  field `fault_timing.{fid}`: value "
                              f"{shown(timing[fid], ('fault_timing', fid))}: times a fault the wave does not run; "
                              f"`faults` lists {sorted(listed) or 'none'}: add {fid} to `faults`, or drop its timing")
