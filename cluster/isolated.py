"""Isolated nodes on one machine: a fleet of Ray nodes that share nothing but a network the project made.

`--isolated-nodes` (config `node_isolation: namespaces`). The driver's process enters a network namespace of its
own (the head's: the driver, the Ray head, the store, the proxy, the model and effects services) that holds a
bridge with the head's address. Every sandbox node is a process tree in new network, mount and pid namespaces,
in a cgroup subtree of its own (every v1 controller, or the one v2 dir), with a private /tmp and /dev/shm, linked
to the head's bridge by a veth pair made inside the head's namespace, running a real raylet joined with
`ray start --address <head>` and the wave's token.

Nothing is added to the machine's own network namespace: every link end and address lives in a namespace made
here, and goes with it. A node's pid namespace dies with its first process, so ending a node (its `unshare`,
this driver's own child, by pid) takes every process of it; the bridge, the veths and the addresses die with the
last process of the head's namespace (this driver).

The addresses are from 198.18.0.0/15 (RFC 2544, for benchmarking networks): never a host-side private or public
address, and never routed anywhere but inside these namespaces.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleet import cgroups

CLONE_NEWNET = 0x40000000
BRIDGE = "sfbr0"
HEAD_IP = "198.18.0.1"
PREFIX = 24
NODE_MARK = "sandfleet-node"  # the cgroup dir and the command line of a node: `sandfleet-node.<tag>.<name>`
JOIN_TIMEOUT_S = 120.0
_libc = ctypes.CDLL(None, use_errno=True)


class IsolationError(RuntimeError):
    """Isolated nodes cannot be made here (`bad_input`: what the machine or the request lacks, exit 254) or a
    node did not come up (a harness error, exit 2)."""

    def __init__(self, msg: str, bad_input: bool = False):
        super().__init__(msg)
        self.bad_input = bad_input


def check_available(nodes: int) -> None:
    """What `--isolated-nodes` needs, with the missing piece named (exit 254)."""
    if nodes < 2:
        raise IsolationError(f"nodes: {nodes} with isolated nodes: a head and at least one sandbox node are needed "
                             "(nodes >= 2)", bad_input=True)
    if os.geteuid() != 0:
        raise IsolationError("isolated nodes need root (network, mount and pid namespaces, veth links); run as root",
                             bad_input=True)
    for tool, pkg in (("ip", "iproute2"), ("nsenter", "util-linux"), ("unshare", "util-linux"),
                      ("mount", "mount")):
        if shutil.which(tool) is None:
            raise IsolationError(f"isolated nodes need `{tool}` ({pkg}); it is not on PATH", bad_input=True)


PRIVATE = "/tmp"  # what every isolated node mounts a tmpfs of its own on (and /dev/shm)


def ray_script() -> str:
    """The `ray` a node starts its raylet with: the one beside this interpreter (never one found on PATH)."""
    return os.path.join(os.path.dirname(sys.executable), "ray")


def install_paths() -> list[str]:
    """The harness's own install (its checkout, its interpreter's prefixes, its `ray`, its import path) where it
    lies under PRIVATE: each node binds these back over its private /tmp (`cluster.isonode`), read-only, so a
    checkout or venv under /tmp runs there as on the head. Outermost paths only, as seen (a symlink's own path
    and where it leads both count)."""
    checkout = Path(__file__).resolve().parents[1]
    seen = [str(checkout), sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, sys.executable,
            ray_script(), *(p for p in sys.path if p)]
    under = set()
    for p in seen:
        for form in (os.path.abspath(p), os.path.realpath(p)):
            if (form == PRIVATE or form.startswith(PRIVATE + "/")) and os.path.exists(form):
                under.add(form)
    return sorted(p for p in under if not any(p.startswith(q + "/") for q in under if q != p))


def check_install() -> list[str]:
    """Before anything runs: the nodes can start their raylet from this install, and every path of it under
    PRIVATE can be bound back there; else a harness error (exit 2) naming the path and why. Returns the paths
    the nodes bind back."""
    ray = ray_script()
    if not os.access(ray, os.X_OK):
        raise IsolationError(f"isolated nodes start their raylet with the `ray` beside this interpreter, and "
                             f"{ray} is not there (or not executable): install ray into {sys.prefix} (a `ray` "
                             "elsewhere on PATH is never used: it may be another Ray)")
    paths = install_paths()
    if PRIVATE in paths:
        raise IsolationError(f"the harness's install is {PRIVATE} itself ({Path(__file__).resolve().parents[1]}, "
                             f"{sys.prefix}): every isolated node mounts a private {PRIVATE} over it, so the nodes "
                             f"could not see it; move the checkout or venv into a directory of its own")
    return paths


def node_ip(index: int) -> str:
    """node-0 is the head (HEAD_IP); node-i is 198.18.0.(i+1)."""
    return f"198.18.0.{index + 1}"


def _ip(*args: str, ns_pid: int | None = None) -> None:
    cmd = ["ip", *args]
    if ns_pid is not None:  # nsenter, not `ip netns exec` (it remounts /sys and hides the cgroup mounts)
        cmd = ["nsenter", f"--net=/proc/{ns_pid}/ns/net", "--", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise IsolationError(f"`{' '.join(cmd)}` failed: {r.stderr.strip()[:300]}")


def _run_in(ns_pid: int, argv: list[str]) -> str | None:
    """Run `argv` in the network namespace of `ns_pid` (nsenter: `ip netns exec` would remount /sys); None when it
    worked, else its error's first line."""
    r = subprocess.run(["nsenter", f"--net=/proc/{ns_pid}/ns/net", "--", *argv], capture_output=True, text=True,
                       timeout=30)
    return None if r.returncode == 0 else ((r.stderr or r.stdout).strip().splitlines() or ["exit %d" % r.returncode])[0]


def ns_inodes(pid: int | str = "self", pid_ns: str = "pid") -> dict:
    out = {}
    for kind, name in (("net", "net"), ("mnt", "mnt"), ("pid", pid_ns)):
        try:
            out[kind] = os.stat(f"/proc/{pid}/ns/{name}").st_ino
        except OSError:
            out[kind] = None
    return out


def enter_head() -> dict:
    """Move this process (its main thread, before any other thread starts: every later thread and child
    inherits it) into a new network namespace with loopback up and the bridge at HEAD_IP."""
    if threading.active_count() != 1:
        raise IsolationError("the head's network namespace must be entered before any thread starts "
                             f"({threading.active_count()} threads run)")
    before = ns_inodes()
    if _libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise IsolationError(f"unshare(CLONE_NEWNET): {os.strerror(err)}")
    _ip("link", "set", "lo", "up")
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{HEAD_IP}/{PREFIX}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    return {"machine_net": before["net"], **ns_inodes()}


ENTERED: dict | None = None  # this process's head namespace, once entered


def enter_once() -> dict:
    global ENTERED
    if ENTERED is None:
        ENTERED = enter_head()
    return ENTERED


def _node_cgroups(tag: str, name: str) -> dict[str, Path]:
    return cgroups.group_dirs(f"{NODE_MARK}.{tag}.{name}")  # (v1: one per controller; v2: one)


@dataclass
class Node:
    name: str
    index: int
    ip: str
    proc: subprocess.Popen
    cgroup_dirs: dict[str, Path]
    ns: dict = field(default_factory=dict)
    started_at: float = 0.0
    ray_node_id: str | None = None
    log: list[str] = field(default_factory=list)  # the node's console (its first process's stdout), last lines

    def describe(self) -> dict:
        return {"name": self.name, "ray_node_id": self.ray_node_id, "address": self.ip, "head": False,
                "netns_inode": self.ns.get("net"), "mntns_inode": self.ns.get("mnt"), "pidns_inode": self.ns.get("pid"),
                "cgroup": str(self.cgroup_dirs.get("pids") or self.cgroup_dirs.get(cgroups.UNIFIED, ""))}


class IsolatedNodes:
    """The head's namespace (entered by `enter_head`) and the sandbox nodes linked to it. `head_ns_pid`: the head's
    namespace is another process's (a test's hand-made cluster), not this one's: the head's link ends are made
    there."""

    def __init__(self, tag: str, head: dict, head_ns_pid: int | None = None):
        self.tag = tag  # the wave's marker: in every node's cgroup dir name and command line
        self.head = head
        self.head_ns_pid = head_ns_pid
        self.nodes: dict[str, Node] = {}
        # nodes are spawned by one thread that lives as long as the fleet: each node's first process dies with
        # the thread that spawned it (PR_SET_PDEATHSIG), so a killed driver takes its nodes with it
        self._spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sf-nodes")
        self._links = 0
        self.gone_ids: set[str] = set()  # Ray ids of ended nodes (the GCS may still list one alive for a moment)

    def start_node(self, name: str, index: int, gcs_address: str, resources: dict, object_store_bytes: int) -> Node:
        return self._spawner.submit(self._start_node, name, index, gcs_address, resources, object_store_bytes).result()

    def _start_node(self, name: str, index: int, gcs_address: str, resources: dict, object_store_bytes: int) -> Node:
        ip = node_ip(index)
        dirs = _node_cgroups(self.tag, name)
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        ray_args = ["--address", gcs_address, "--node-ip-address", ip, "--num-cpus", "1",
                    "--resources", json.dumps(resources), "--object-store-memory", str(object_store_bytes),
                    "--disable-usage-stats", "--block"]
        spec = {"tag": self.tag, "name": name, "cgroups": [str(cgroups.join_file(d)) for d in dirs.values()],
                "ray": ray_args, "ray_script": ray_script(), "keep": check_install()}
        # its own (private) /tmp; and a joining node, which Ray refuses with the local-only switch set to 0
        env = dict(os.environ, RAY_TMPDIR="/tmp", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1")
        proc = subprocess.Popen([sys.executable, "-m", "cluster.isonode", "enter", json.dumps(spec)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                cwd="/", start_new_session=True)
        node = Node(name, index, ip, proc, dirs, started_at=time.time())
        self.nodes[name] = node
        try:
            first = self._line(node, 30.0)
            try:
                said = json.loads(first)
            except ValueError:
                said = {}
            if not isinstance(said, dict) or "ns" not in said:
                why = said.get("error") if isinstance(said, dict) else None
                raise IsolationError(f"node {name} did not start: {why or first[:300] or 'no output'}")
            node.ns = said["ns"]
            self._links += 1
            veth = f"sfv{self._links}"
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(proc.pid),
                ns_pid=self.head_ns_pid)
            _ip("link", "set", veth, "master", BRIDGE, ns_pid=self.head_ns_pid)
            _ip("link", "set", veth, "up", ns_pid=self.head_ns_pid)
            _ip("link", "set", "lo", "up", ns_pid=proc.pid)
            _ip("addr", "add", f"{ip}/{PREFIX}", "dev", "eth0", ns_pid=proc.pid)
            _ip("link", "set", "eth0", "up", ns_pid=proc.pid)
            node.ns["veth"] = veth
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        except BaseException:
            self.end_node(name)
            raise
        threading.Thread(target=self._drain, args=(node,), daemon=True, name=f"sf-node-log-{name}").start()
        return node

    @staticmethod
    def _line(node: Node, timeout_s: float) -> str:
        got: list[str] = []
        t = threading.Thread(target=lambda: got.append(node.proc.stdout.readline().decode(errors="replace")),
                             daemon=True)
        t.start()
        t.join(timeout_s)
        return got[0].strip() if got else ""

    @staticmethod
    def _drain(node: Node) -> None:
        for raw in iter(node.proc.stdout.readline, b""):
            node.log.append(raw.decode(errors="replace").rstrip())
            del node.log[:-40]

    def wait_joined(self, names: list[str], timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """Until every node is an alive Ray node (found by its address); else a harness error naming it."""
        import ray

        deadline = time.monotonic() + timeout_s
        left = set(names)
        while left:
            by_ip = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes()
                     if n.get("Alive") and n["NodeID"] not in self.gone_ids}
            for name in list(left):
                node = self.nodes[name]
                if node.ip in by_ip:
                    node.ray_node_id = by_ip[node.ip]
                    left.discard(name)
                elif node.proc.poll() is not None:
                    raise IsolationError(f"node {name} ended before it joined the head (exit {node.proc.returncode})"
                                         f"; its last lines: {' | '.join(node.log[-5:])[:600]}")
            if left and time.monotonic() > deadline:
                name = sorted(left)[0]
                raise IsolationError(f"node {name} did not join the head at {HEAD_IP} within {timeout_s:.0f} s; "
                                     f"its last lines: {' | '.join(self.nodes[name].log[-5:])[:600]}")
            if left:
                time.sleep(0.2)

    def end_node(self, name: str, timeout_s: float = 10.0) -> bool:
        """The node goes at once, with everything in it: SIGKILL to its first process (this driver's child)
        kills its pid namespace's init, and the kernel every process in it; its namespaces and veth go with
        them. Its cgroup dirs are removed once empty. Returns whether it was running."""
        node = self.nodes.get(name)
        if node is None:
            return False
        was = node.proc.poll() is None
        if node.ray_node_id:
            self.gone_ids.add(node.ray_node_id)
        try:
            os.killpg(node.proc.pid, signal.SIGKILL)  # its own session: the unshare and what it forked
        except ProcessLookupError:
            pass
        try:
            node.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        self._remove_cgroups(node, timeout_s)
        return was

    @staticmethod
    def _remove_cgroups(node: Node, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for d in node.cgroup_dirs.values():
            while d.is_dir():
                leaves = sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
                for p in leaves + [d]:
                    try:
                        p.rmdir()
                    except OSError:
                        pass
                if d.is_dir():
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)

    # -- the link between a node and the head (NP1, NP2) -------------------------------------------------------

    def cut(self, name: str) -> dict:
        """NP1: the node's link to the head goes down (its veth's head end, in the head's namespace): nothing of
        it reaches the head nor the head it (Ray, the gate, everything). The node itself runs on."""
        node = self.nodes[name]
        _ip("link", "set", node.ns["veth"], "down")
        return {"link": node.ns["veth"], "at": time.time()}

    def heal(self, name: str) -> dict:
        node = self.nodes.get(name)
        if node is None or node.proc.poll() is not None:
            return {"healed": False, "why": f"node {name} is gone"}
        _ip("link", "set", node.ns["veth"], "up")
        return {"healed": True, "at": time.time()}

    def degrade(self, name: str, loss_pct: float, rate_kbit: int, delay_ms: float, jitter_ms: float) -> dict:
        """NP2: the node's side of its link (its eth0) loses, delays and slows what it carries, both ways as seen
        from the node. With the kernel's netem: delay, jitter, loss and rate in one qdisc. Without it (this
        machine's kernel has none): loss by a seeded-probability packet filter in the node's namespace (in and
        out), rate by a token bucket, and delay/jitter named as not applied. Returns what was applied."""
        node = self.nodes[name]
        pid = node.proc.pid
        netem = ["tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", f"{delay_ms}ms", f"{jitter_ms}ms",
                 "loss", f"{loss_pct}%", "rate", f"{rate_kbit}kbit"]
        if _run_in(pid, netem) is None:
            node.ns["degraded"] = "netem"
            return {"how": "netem", "loss_pct": loss_pct, "rate_kbit": rate_kbit, "delay_ms": delay_ms,
                    "jitter_ms": jitter_ms, "not_applied": [], "at": time.time()}
        applied: dict = {"how": "filter+tbf", "not_applied": [], "at": time.time()}
        p = f"{loss_pct / 100:.4f}"
        for chain in ("INPUT", "OUTPUT"):
            why = _run_in(pid, ["iptables", "-w", "-A", chain, "-m", "statistic", "--mode", "random",
                                "--probability", p, "-j", "DROP"])
            if why:
                applied["not_applied"].append(f"loss ({why})")
                break
        else:
            applied["loss_pct"] = loss_pct
        why = _run_in(pid, ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", f"{rate_kbit}kbit",
                            "burst", "32kbit", "latency", "400ms"])
        if why:
            applied["not_applied"].append(f"rate ({why})")
        else:
            applied["rate_kbit"] = rate_kbit
        applied["not_applied"].append(f"delay {delay_ms} ms and jitter {jitter_ms} ms (no netem qdisc in this "
                                      "kernel: nothing here can hold packets back)")
        node.ns["degraded"] = "filter+tbf"
        return applied

    def restore(self, name: str) -> dict:
        """The node's link carries as before (what `degrade` added is removed)."""
        node = self.nodes.get(name)
        if node is None or node.proc.poll() is not None:
            return {"restored": False, "why": f"node {name} is gone"}
        pid, how = node.proc.pid, node.ns.pop("degraded", None)
        errors = [e for e in [_run_in(pid, ["tc", "qdisc", "del", "dev", "eth0", "root"])] if e]
        if how == "filter+tbf":
            errors += [e for e in (_run_in(pid, ["iptables", "-w", "-F", c]) for c in ("INPUT", "OUTPUT")) if e]
        return {"restored": not errors, "errors": errors, "at": time.time()}

    def describe(self) -> list[dict]:
        return [{"name": "node-0", "ray_node_id": self.head.get("ray_node_id"), "address": HEAD_IP, "head": True,
                 "netns_inode": self.head.get("net"), "mntns_inode": self.head.get("mnt"),
                 "pidns_inode": self.head.get("pid")}] + [n.describe() for n in self.nodes.values()]

    def stop(self) -> None:
        for name in list(self.nodes):
            self.end_node(name)
        self._spawner.shutdown(wait=False)


def leftover_node_cgroups() -> list[str]:
    """Cgroup dirs of isolated nodes left on this machine (by their marker)."""
    out = []
    for base in cgroups.own_dirs().values():
        if base.is_dir():
            out += [str(p) for p in base.glob(f"{NODE_MARK}.*")]
    return sorted(out)
