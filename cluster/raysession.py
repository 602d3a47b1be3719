"""A wave's Ray: a private local Ray (default; `nodes > 1`, a simulated cluster of real raylets on this machine) or an
existing cluster by address, and the processes of a private Ray the harness watches and ends.

A local Ray gets its own temp dir, usage stats off, and an explicit per-run auth token (Ray's token auth is on by
default; every process of this Ray gets the token through the environment, and nothing is written to ~/.ray).
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

from cluster import results
from fleet.markers import kill_listed, proc_cmdline, ray_processes


# Node death must be seen in about a second, not Ray's default 15 s+ (PK3 kills nodes on purpose).
HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                 "health_check_initial_delay_ms": 0, "health_check_timeout_ms": 500}
# Isolated nodes have a link to the head that NP1 cuts: a partition of a few seconds must not be a node's death (as on
# a real cluster, whose defaults are 3 s x 5), so a node is dead after about 10 s of failed checks there.
HEALTH_CHECKS_ISOLATED = dict(HEALTH_CHECKS, health_check_period_ms=1000, health_check_failure_threshold=10,
                              health_check_timeout_ms=1000)


def node_resource(name: str) -> str:
    """The custom resource that pins a sandbox host to its simulated node (a node's name outlives its Ray id)."""
    return f"sandfleet-node:{name}"


def node_name(ray_node: dict) -> str:
    """A Ray node's name in the wave: its `sandfleet-node:<name>` resource when it has one, else its address."""
    prefix = node_resource("")
    res = ray_node.get("Resources") or {}
    named = next((k[len(prefix):] for k in res if k.startswith(prefix)), None)
    return named or f"node-{ray_node['NodeManagerAddress']}"


def token_auth_for_cluster() -> str | None:
    """Ray's token auth for a cluster started by hand (`ray start --head` turns it on): Ray itself takes a token
    only for `address=None/"auto"`, so for HOST:PORT the mode is set here when a token is at hand, as Ray's docs
    describe for a user ($RAY_AUTH_TOKEN, the file $RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token). A mode the
    user set stands. Returns where the token came from, or None. Call before `import ray`."""
    if os.environ.get("RAY_AUTH_MODE"):
        return None
    where = None
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        where = "$RAY_AUTH_TOKEN"
    else:
        for path in (os.environ.get("RAY_AUTH_TOKEN_PATH"), os.path.expanduser("~/.ray/auth_token")):
            try:
                if path and os.path.getsize(path) > 0:
                    where = path
                    break
            except OSError:
                continue
    if where is not None:
        os.environ["RAY_AUTH_MODE"] = "token"
    return where


def auth_hint(address: str, exc: BaseException) -> str | None:
    """One line naming what to export when the cluster at `address` refused this driver for want of a token."""
    text = str(exc)
    if "uthenticat" not in text and "auth token" not in text.lower():
        return None
    return (f"the Ray cluster at {address} uses token auth and refused this driver: export RAY_AUTH_TOKEN=<the token "
            "in ~/.ray/auth_token on the head> (or copy that file to ~/.ray/auth_token here, or name it in "
            "$RAY_AUTH_TOKEN_PATH); sandfleet then sets RAY_AUTH_MODE=token itself")


class RaySession:
    def __init__(self, address: str = "local", num_cpus: int | None = None, tmpdir: str | None = None,
                 nodes: int = 1, isolation: str = "none", namespace: str | None = None):
        self.address = address
        self.namespace = namespace  # the Ray namespace of this driver (named actors another driver finds)
        self.isolation = isolation  # "namespaces": the sandbox nodes are isolated nodes (cluster/isolated.py)
        self.isolated = None  # cluster.isolated.IsolatedNodes
        self.node_ids_by_name: dict[str, str] = {}  # isolated nodes: name -> Ray node id
        self.num_cpus = num_cpus
        self.nodes = nodes  # > 1: a simulated cluster of that many Ray nodes on this machine (local only)
        self.want_tmpdir = tmpdir  # a wave's own Ray: a path that carries the wave's marker (for the sweep)
        self.tmpdir: str | None = None
        self.owned = False
        self.cluster = None  # ray.cluster_utils.Cluster when nodes > 1
        self.error_log: str | None = None  # where a simulated cluster's raylet deaths are written
        self.ray_nodes: dict[str, object] = {}  # node name -> ray._private.node.Node (simulated cluster)
        self.head = None  # ray._private.node.Node of a one-node private Ray
        self.ended_leftovers: list[str] = []  # processes of this Ray that outlived its shutdown, ended by its marker

    def start(self):
        # Ray reads these when it is imported and when its processes start: set them first.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if self.address == "local":
            # A private Ray is one machine: make Ray take 127.0.0.1 as the node address instead
            # of resolving "localhost" to the host's interface address.
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        elif self.address != "fleet":
            token_auth_for_cluster()
        import ray

        if self.address == "local" or self.address.split("://", 1)[-1].startswith("127.0.0.1:"):
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            # Ray reads that switch once, when it is first imported: a Ray imported before this start (by a test, a
            # library) would still turn 127.0.0.1 into the host's address (the driver then dials the host's address
            # of a GCS that listens on loopback only, and waits forever). The module's value is what it checks.
            import ray._private.ray_constants as ray_constants

            ray_constants.ENABLE_RAY_CLUSTER = False
        if ray.is_initialized():
            return ray
        if self.address == "local":
            # Short path: Ray's unix sockets live under it.
            if self.want_tmpdir:
                os.makedirs(self.want_tmpdir, mode=0o700, exist_ok=True)
                self.tmpdir = self.want_tmpdir
            else:
                self.tmpdir = tempfile.mkdtemp(prefix="sfray-", dir="/tmp")
            os.environ["RAY_TMPDIR"] = self.tmpdir
            if self.nodes > 1:
                self._start_cluster(ray)
                return ray
            self._start_single(ray)
        else:
            try:
                ray.init(address=self.address, log_to_driver=False, configure_logging=False,
                         namespace=self.namespace)
            except Exception as exc:
                hint = auth_hint(self.address, exc)
                if hint is not None:
                    raise RuntimeError(hint) from None
                raise
        return ray

    def _start_single(self, ray) -> None:
        """One node: the head `ray.init(address="local")` would start (same reaper, same defaults), but without the
        autoscaler monitor and the log monitor (`ray.init` has no knob for either): a private Ray never scales and
        its workers' logs are never sent to the driver. The dashboard process (its usage-stats module only, with
        `include_dashboard=False`) and the raylet's two agents have no knob: the raylet starts and needs them."""
        from ray._private.node import Node
        from ray._private.parameter import RayParams

        params = RayParams(node_ip_address="127.0.0.1", num_cpus=self.num_cpus or os.cpu_count(),
                           include_dashboard=False, temp_dir=self.tmpdir, no_monitor=True, include_log_monitor=False)
        self.head = Node(params, head=True, shutdown_at_exit=False, spawn_reaper=True, ray_init_cluster=True)
        self.ray_nodes["node-0"] = self.head
        try:
            ray.init(address=self.head.address, log_to_driver=False, configure_logging=False,
                     namespace=self.namespace)
        except BaseException:
            self.head.kill_all_processes(check_alive=False, allow_graceful=False)
            raise
        self.owned = True

    def _node_args(self, name: str) -> dict:
        # no autoscaler monitor and no log monitor: a simulated cluster never scales, and its workers' logs are
        # never sent to the driver (log_to_driver=False); each is a Python process that costs a CPU-second to
        # start and most of a second to stop
        ip = "127.0.0.1"
        if self.isolation == "namespaces":
            from cluster.isolated import HEAD_IP as ip
        return {"num_cpus": 1, "resources": {node_resource(name): 1}, "node_ip_address": ip,
                "temp_dir": self.tmpdir, "include_dashboard": False, "object_store_memory": 80 * 1024 * 1024,
                "no_monitor": True, "include_log_monitor": False}

    def _start_cluster(self, ray) -> None:
        """A simulated cluster: a head (node-0: the harness's actors and the driver) and `nodes - 1` workers,
        every one a real raylet on 127.0.0.1 under this session's temp dir, with fast health checks."""
        from ray.cluster_utils import Cluster

        os.makedirs(os.path.join(self.tmpdir, "ray"), exist_ok=True)  # Cluster writes its address file there
        # shutdown_at_exit=False: the session stops its nodes itself (Ray's exit hooks fail on removed nodes);
        # a driver that dies leaves them to `sandfleet sweep`, which finds them by this session's temp dir
        self.cluster = Cluster(initialize_head=True, shutdown_at_exit=False,
                               head_node_args=dict(self._node_args("node-0"), _system_config=HEALTH_CHECKS_ISOLATED
                                                    if self.isolation == "namespaces" else HEALTH_CHECKS))
        self.ray_nodes["node-0"] = self.cluster.head_node
        if self.isolation == "namespaces":  # (joined nodes are seen through the driver's connection)
            ray.init(address=self.cluster.address, log_to_driver=False, configure_logging=False,
                     namespace=self.namespace)
            from cluster import isolated

            self.isolated = isolated.IsolatedNodes(os.path.basename(self.tmpdir), isolated.enter_once())
            names = [f"node-{i}" for i in range(1, self.nodes)]
            try:
                for name in names:
                    self._start_isolated(name)
                self.isolated.wait_joined(names)
            except BaseException:
                self.isolated.stop()
                ray.shutdown()
                self.cluster.shutdown()
                raise
        else:
            for i in range(1, self.nodes):
                self.add_node(f"node-{i}")
            ray.init(address=self.cluster.address, log_to_driver=False, configure_logging=False,
                     namespace=self.namespace)
        self.owned = True
        self._quiet_node_deaths()

    def _quiet_node_deaths(self) -> None:
        """A lost node is a planned fault (PK3) here: Ray's driver prints each raylet death with its last log
        lines to stdout; those go to `ray-errors.log` in the session's temp dir instead (the wave copies it
        into its results). Ray has no option for this: its error listener's printer is wrapped."""
        import ray._private.worker as rw

        self.error_log = os.path.join(self.tmpdir, results.RAY_ERRORS)
        printer, path = rw.print_to_stdstream, self.error_log

        def to_file(data, ignore_prefix):
            if data.get("pid") != "raylet":
                return printer(data, ignore_prefix)
            with open(path, "a") as f:
                f.write("\n".join(data.get("lines") or []) + "\n")

        rw.print_to_stdstream = to_file

    def _start_isolated(self, name: str) -> None:
        index = int(name.rsplit("-", 1)[1])
        self.isolated.start_node(name, index, self.cluster.address, {"sandfleet": 1, node_resource(name): 1},
                                 80 * 1024 * 1024)

    def add_node(self, name: str):
        """Start (or bring back) the node `name`: a new raylet that offers the node's resource (an isolated node:
        a new machine, joined with `ray start --address`)."""
        if self.isolated is not None:
            self._start_isolated(name)
            self.isolated.wait_joined([name])
            self.node_ids_by_name[name] = self.isolated.nodes[name].ray_node_id
            return self.isolated.nodes[name]
        node = self.cluster.add_node(**self._node_args(name))
        self.ray_nodes[name] = node
        return node

    def remove_node(self, name: str) -> None:
        """Kill the node's raylet and the processes Ray started for it (no grace: a lost machine); an isolated
        node goes whole (its pid namespace), by the pid of its first process, this driver's child."""
        if self.isolated is not None:
            self.isolated.end_node(name)
            return
        node = self.ray_nodes.pop(name)
        self.cluster.remove_node(node, allow_graceful=False)

    def node_id(self, name: str) -> str:
        if self.isolated is not None:
            return self.isolated.nodes[name].ray_node_id
        return self.ray_nodes[name].node_id

    def drain_node(self, name: str, deadline_s: float, why: str) -> tuple[bool, str]:
        """Ask the GCS to drain the node for preemption (what `ray drain-node --reason PREEMPTION` does): no new
        work is placed there; the node is killed at the deadline by whoever asked (here: the fault)."""
        import time

        import ray
        from ray.core.generated import autoscaler_pb2

        gcs = ray._raylet.GcsClient(address=self.cluster.address)
        reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
        ok, err = gcs.drain_node(self.node_id(name), reason,
                                 why, int(time.time() * 1000 + deadline_s * 1000))
        return bool(ok), err or ""

    def core_processes(self) -> list[tuple[str, str, int]]:
        """(part, node, pid) of every process of this session's own Ray that a wave depends on: the GCS and each
        node's raylet, and the agents each raylet starts (dashboard and runtime-env agents, its children); empty
        for a cluster this session did not start (its processes are on other machines or not ours)."""
        if not self.owned:
            return []
        if self.ray_nodes:
            nodes = dict(self.ray_nodes)
        else:
            import ray._private.worker as rw

            nodes = {"node-0": rw._global_node} if rw._global_node is not None else {}
        out = []
        for name, node in nodes.items():
            procs = getattr(node, "all_processes", None) or {}
            for info in procs.get("gcs_server", []):
                out.append(("Ray GCS", name, info.process.pid))
            for info in procs.get("raylet", []):
                out.append((f"raylet {name}", name, info.process.pid))
                out += [(f"{agent} {name}", name, pid) for agent, pid in ray_agents(info.process.pid)]
        return out

    def stop(self) -> None:
        import ray

        # every process of our own Ray, by PID, while the raylets still say which agents are theirs: a raylet that
        # dies first orphans its agents (no parent left to find them by); they carry no marker on their command line
        mine = [{"pid": pid, "cmd": proc_cmdline(str(pid))[:160]} for _, _, pid in self.core_processes()]
        steps = []
        if self.owned and ray.is_initialized():
            steps.append(ray.shutdown)
        if self.head is not None:
            head = self.head
            steps += [head.destroy_external_storage,
                      lambda: head.kill_all_processes(check_alive=False, allow_graceful=True)]
        if self.isolated is not None:
            steps.append(self.isolated.stop)
        if self.cluster is not None:
            steps.append(self.cluster.shutdown)
        failed = None
        for step in steps:  # a step that fails does not keep the others, nor the ends below, from running
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - raised once the rest of this Ray is gone
                failed = failed or exc
        self.head, self.cluster, self.ray_nodes = None, None, {}
        if mine:
            self.ended_leftovers = kill_listed([p for p in mine if p["cmd"]])
        if self.tmpdir:
            if self.want_tmpdir or self.owned:
                self.ended_leftovers = sorted(set(self.ended_leftovers + end_leftovers(self.tmpdir)))
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
        if failed is not None:
            raise failed


AGENTS = {"ray::DashboardAgent": "Ray dashboard agent", "dashboard/agent.py": "Ray dashboard agent",
          "ray::RuntimeEnvAgent": "Ray runtime-env agent", "runtime_env/agent/main.py": "Ray runtime-env agent"}


def ray_agents(raylet_pid: int) -> list[tuple[str, int]]:
    """The agents a raylet started (its children, by command line: they retitle themselves)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{raylet_pid}/task")
    except OSError:
        return out
    kids = set()
    for tid in tasks:
        try:
            kids |= {int(x) for x in Path(f"/proc/{raylet_pid}/task/{tid}/children").read_text().split()}
        except (OSError, ValueError):
            continue
    for pid in sorted(kids):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        name = next((n for key, n in AGENTS.items() if key in cmd), None)
        if name:
            out.append((name, pid))
    return out


def end_leftovers(tmpdir: str, timeout_s: float = 5.0) -> list[str]:
    """SIGKILL what is left of the private Ray whose temp dir is `tmpdir` after its shutdown (a dead GCS leaves
    its agents, retitled `ray::DashboardAgent`, orphaned for minutes), found by that dir, the session's own
    marker, as `sandfleet sweep` finds a dead fleet's; waits (bounded) until they are gone. Returns what it
    ended."""
    import time

    ended: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = ray_processes(tmpdir)
        if not left:
            break
        ended += kill_listed(left)
        time.sleep(0.1)
    return sorted(set(ended))
