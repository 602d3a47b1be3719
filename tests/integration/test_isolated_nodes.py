"""Isolated nodes (`--isolated-nodes`): a head and two sandbox nodes on this machine that share nothing but a network
the wave made. A wave with PK1, ST1 and CR1 passes with attempts on both sandbox nodes, while nothing of an attempt
crosses to the head but Ray calls and the head's gate: no credential file is ever written on the head, every
runner.log comes back, a runner workdir only root can read is shipped and its script runs. The sweep actor reaps a
leak on a sandbox node through that node's host and leaves its decoys. The machine's own network namespace
keeps its addresses, routes and links, and nothing is left (processes, cgroups, mounts, the nodes' dirs)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import orjson
import pytest

from cluster import isolated
from tests import leftovers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RUNNERS = ROOT / "fleet" / "runners"


def _machine_net() -> dict:
    """What the machine's own network namespace has: the test asserts a wave adds nothing to it."""
    def out(*args):
        return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout
    return {"addr": out("-o", "addr"), "route": out("route", "show", "table", "all"), "link": out("-o", "link"),
            "inode": os.stat("/proc/self/ns/net").st_ino}


def _cli(tmp_path: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", *args, "--results",
                           str(tmp_path / "r"), "--no-progress"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


class _CredentialWatch:
    """Looks (every 20 ms, for the whole wave) for an attempt's credentials anywhere a head-side writer would put
    them: the wave's private dirs and the results."""

    def __init__(self, roots: list[Path]):
        self.roots, self.seen, self.looks = roots, set(), 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for pattern_root in self.roots + list(Path("/tmp").glob("sandfleet-w-*")):
                try:
                    for p in Path(pattern_root).rglob("*"):
                        if p.name in ("credentials.json", "aws-config") or p.name == "creds":
                            self.seen.add(str(p))
                except OSError:  # a dir that went while it was walked: looked at again on the next round
                    continue
            self.looks += 1
            self._stop.wait(0.02)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(5)


def test_a_wave_on_isolated_nodes_passes_and_nothing_but_ray_and_the_gate_crosses(tmp_path):
    before_net, before = _machine_net(), leftovers.snapshot()
    host_dirs = set(Path("/tmp").glob("sandfleet-host-*"))  # the suite's own fleet may hold one: only new ones count
    work = Path(tempfile.mkdtemp(prefix="sf-runner-", dir="/tmp"))  # mode 0700: only root can read it here
    try:
        shutil.copy(RUNNERS / "agentkit.py", work / "agentkit.py")
        # the runner is a script in that dir, its interpreter named by its #! line: on the nodes the script exists
        # only in their staged copy of the dir
        code = (RUNNERS / "durable.py").read_text()
        (work / "agent").write_text(f"#!{sys.executable}\n" + code.split("\n", 1)[1] if code.startswith("#!")
                                    else f"#!{sys.executable}\n" + code)
        (work / "agent").chmod(0o755)
        assert os.stat(work).st_mode & 0o777 == 0o700
        with _CredentialWatch([tmp_path / "r"]) as watch:
            # every fault at a boundary of the runner (its Nth model answer), never a clock: a PK1 timed by the clock
            # landed before the attempt's first boundary on a loaded machine (not_exercised: exit 2); CR1 right
            # after a model answer (the runner's next store write meets it)
            cfg = tmp_path / "wave.yaml"
            cfg.write_text("fault_timing: {PK1: {after_model_calls: [2, 3]}, ST1: {after_model_calls: [1, 3]}, "
                           "CR1: {after_model_calls: [2, 4]}}\n")
            r = _cli(tmp_path, str(cfg), "--tasks", "4", "--concurrency", "2", "--faults", "PK1,ST1,CR1", "--seed", "5",
                     "--nodes", "3", "--isolated-nodes", "--runner-cmd", f"{work}/agent",
                     "--runner-workdir", str(work))
        assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wave = (tmp_path / "r" / "latest").resolve()
    tl = [orjson.loads(line) for line in (wave / "timeline.jsonl").read_bytes().splitlines()]
    starts = [e for e in tl if e["event"] == "attempt_start"]
    assert {e["node"] for e in starts} == {"node-1", "node-2"}, [e["node"] for e in starts]

    nodes = orjson.loads((wave / "nodes.json").read_bytes())
    assert [n["name"] for n in nodes] == ["node-0", "node-1", "node-2"] and [n["head"] for n in nodes] == [
        True, False, False]
    nets = [n["netns_inode"] for n in nodes]
    assert len(set(nets)) == 3 and before_net["inode"] not in nets, nodes  # three namespaces, none the machine's
    assert len({n["mntns_inode"] for n in nodes[1:]} | {n["pidns_inode"] for n in nodes[1:]}) == 4
    assert all(n["ray_node_id"] and n["address"].startswith("198.18.0.") for n in nodes)

    receipts = orjson.loads((wave / "faults.json").read_bytes())
    applied = {x["fault_id"] for x in receipts if x["status"] == "applied"}
    assert applied == {"PK1", "ST1", "CR1"}, [(x["fault_id"], x["status"], x.get("detail")) for x in receipts]
    assert all(orjson.loads(p.read_bytes())["verdict"] == "pass" for p in wave.glob("t*.grade.json"))

    # every attempt's runner.log came back from its node (nothing there is a path on the head)
    for e in starts:
        log = wave / "sandboxes" / e["sandbox"] / "runner.log"
        assert log.is_file() and log.stat().st_size > 0, e["sandbox"]
    assert watch.looks > 10 and not watch.seen, sorted(watch.seen)[:5]

    assert _machine_net() == before_net
    left = leftovers.wait_clean(before)
    assert not left, left
    assert not isolated.leftover_node_cgroups()
    assert not set(Path("/tmp").glob("sandfleet-host-*")) - host_dirs


def test_a_path_the_runner_needs_that_a_node_lacks_is_exit_2_naming_node_and_path(tmp_path):
    """An interpreter under /tmp exists on the head but not on the nodes (their /tmp is their own): the wave stops
    before any task runs, naming the node and the path, instead of sandboxes that silently go without it."""
    venv = Path(tempfile.mkdtemp(prefix="sf-interp-", dir="/tmp"))
    try:
        (venv / "bin").mkdir()
        os.symlink(sys.executable, venv / "bin" / "python3")
        os.chmod(venv, 0o755)
        r = _cli(tmp_path, "--tasks", "1", "--faults", "none", "--nodes", "2", "--isolated-nodes", "--runner-cmd",
                 f"{venv}/bin/python3 {RUNNERS}/durable.py")
    finally:
        shutil.rmtree(venv, ignore_errors=True)
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert f"node node-1: {venv} is not there" in r.stderr, r.stderr[-2000:]
    wave = (tmp_path / "r" / "latest").resolve()
    assert not [line for line in (wave / "timeline.jsonl").read_bytes().splitlines() if b"attempt_start" in line]


def _install_under_tmp() -> Path:
    """This checkout's files (tracked and not ignored, as they are now: what the suite runs) and a venv of its
    own, both under /tmp: sys.prefix, the interpreter's venv, its `ray` and `sandfleet` scripts (their #! lines
    pointing there) and the project's import path all lie under /tmp. The venv's packages are this venv's,
    hard-linked (seconds, not a reinstall of ~800 MiB); the editable install's finder is replaced by a .pth naming
    the copy."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    root = Path(tempfile.mkdtemp(prefix="sf-clone-", dir="/tmp"))
    os.chmod(root, 0o755)
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src, dst = ROOT / rel, root / rel
        if src.exists() or src.is_symlink():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
    venv = root / ".venv"
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    here = Path(sysconfig.get_paths()["purelib"])
    site = venv / here.relative_to(sys.prefix)
    shutil.rmtree(site)
    if subprocess.run(["cp", "-al", str(here), str(site)], capture_output=True).returncode != 0:
        site.mkdir(parents=True, exist_ok=True)  # another filesystem: the packages are read from here instead
        (site / "sandfleet-deps.pth").write_text(f"{here}\n")
    for p in site.glob("__editable__*sandfleet*"):
        p.unlink()
    (site / "sandfleet-clone.pth").write_text(f"{root}\n")
    shebang = f"#!{sys.prefix}/bin/python".encode()
    for src in Path(sys.prefix, "bin").iterdir():
        dst = venv / "bin" / src.name
        if dst.exists() or dst.is_symlink() or not src.is_file():
            continue
        head = src.open("rb").read(len(shebang) + 1)
        if head.startswith(shebang) and head[len(shebang):] in (b"\n", b"3", b""):
            dst.write_bytes(b"#!" + str(venv / "bin" / "python").encode() + b"\n" + src.read_bytes().split(b"\n", 1)[1])
            dst.chmod(0o755)
        else:
            shutil.copy2(src, dst)
    return root


def test_a_checkout_and_venv_under_tmp_run_a_wave_on_isolated_nodes(tmp_path):
    """Regression (a fresh clone under /tmp failed every isolated-node test: the nodes' private /tmp hid the
    checkout and its venv, and a node then looked for `ray` on PATH): each node binds the harness's own install
    back at its path, and a wave run from a checkout and venv under /tmp passes on isolated nodes."""
    before_net, before = _machine_net(), leftovers.snapshot()
    root = _install_under_tmp()
    try:
        py = root / ".venv" / "bin" / "python"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        where = subprocess.run([str(py), "-c", "import sys, cluster; print(cluster.__file__); print(sys.prefix)"],
                               env=env, cwd="/", capture_output=True, text=True, check=True).stdout.split()
        assert [str(Path(w).parents[1]) if i == 0 else w for i, w in enumerate(where)] == [
            str(root), str(root / ".venv")], where
        r = subprocess.run([str(py), "-m", "cluster.cli", "wave", "run", "--tasks", "2", "--concurrency", "2",
                            "--faults", "none", "--seed", "3", "--nodes", "2", "--isolated-nodes", "--results",
                            str(tmp_path / "r"), "--no-progress"], env=env, cwd=root, capture_output=True, text=True,
                           timeout=400)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    wave = (tmp_path / "r" / "latest").resolve()
    tl = [orjson.loads(line) for line in (wave / "timeline.jsonl").read_bytes().splitlines()]
    assert {e["node"] for e in tl if e["event"] == "attempt_start"} == {"node-1"}
    assert all(orjson.loads(p.read_bytes())["verdict"] == "pass" for p in wave.glob("t*.grade.json"))
    assert _machine_net() == before_net
    left = leftovers.wait_clean(before)
    assert not left, left
    assert not isolated.leftover_node_cgroups()


def test_isolated_nodes_need_a_head_and_a_sandbox_node(tmp_path):
    r = _cli(tmp_path, "--tasks", "1", "--nodes", "1", "--isolated-nodes", timeout=60)
    assert r.returncode == 254, r.stderr
    assert "nodes 1 with node_isolation 'namespaces'" in r.stderr and "nodes >= 2" in r.stderr, r.stderr


def test_the_sweep_actor_reaps_a_leak_on_a_sandbox_node_through_its_host_and_names_a_node_that_does_not_answer():
    """A leak planted on node-1 (a sandbox cgroup with no lease whose process daemonized a child; pids of node-1's
    own pid namespace) is found by node-1's own scan and reaped there; a sandbox under a live lease, another wave's
    marked process and an unmarked one on that node are untouched. A node whose host is gone is named as not
    answering, so the wave cannot claim that nothing leaked there."""
    before_net, before = _machine_net(), leftovers.snapshot()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run([sys.executable, "-m", "tests.integration.isolated_sweep_probe"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    out = orjson.loads(r.stdout.strip().splitlines()[-1])
    planted, rep = out["planted"], out["report"]
    assert planted["pidns"] != out["head_pidns"] and len(planted["leak"]) == 2, planted  # node-1's pids
    assert [(x["sandbox_id"], x["node"]) for x in out["first"]["leaked"]] == [("t900-a1", "node-1")], out["first"]
    assert out["leak_alive_after"] == [], rep  # the leak and its daemonized child
    assert sorted(out["kept_alive"]) == sorted([planted["live"]] + planted["decoys"]), rep
    assert [(x["sandbox_id"], x["node"]) for x in rep["reaped"]] == [("t900-a1", "node-1")], rep["reaped"]
    assert sorted(rep["reaped"][0]["pids"]) == sorted(planted["leak"]) and rep["reaped"][0]["leaked_for_s"] >= 2.0
    assert rep["nodes_scanned"] == ["node-1", "node-2"] and rep["unanswered_nodes"] == {}, rep
    assert not rep["left_at_end"] and not rep["errors"] and not rep["dangling_leases"], rep
    gone = out["unanswered_report"]
    assert list(gone["unanswered_nodes"]) == ["node-2"] and "ActorDiedError" in gone["unanswered_nodes"]["node-2"]

    assert _machine_net() == before_net
    left = leftovers.wait_clean(before)
    assert not left, left
    assert not isolated.leftover_node_cgroups()


def _np1_wave(tmp_path: Path, fencing: bool) -> tuple[subprocess.CompletedProcess, Path]:
    """Two tasks on three isolated nodes; each task's node is cut off right after its 2nd model answer (the
    runner's next act is a store write, made into the cut and delivered after the heal)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "np1.yaml"
    cfg.write_text("tasks: 2\nconcurrency: 1\nseed: 11\nfaults: [NP1]\nnodes: 3\nnode_isolation: namespaces\n"
                   "fault_timing: {NP1: {after_model_calls: [2, 2], window_s: [1.5, 2.0]"
                   + ("" if fencing else ", fencing: false") + "}}\nworkload: {steps: 6, think_ms: 50}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results",
                        str(tmp_path / "r"), "--no-progress"], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=400)
    return r, (tmp_path / "r" / "latest").resolve()


def _grades(wave: Path) -> dict:
    return {p.name.split(".")[0]: orjson.loads(p.read_bytes()) for p in wave.glob("t*.grade.json")}


def test_np1_a_cut_off_nodes_zombies_are_refused_after_the_heal_and_without_fencing_the_wave_fails(tmp_path):
    """NP1 on real links: the cut node's attempts are given up and run elsewhere; after the heal the zombies'
    requests are all refused (fenced_writes_rejected passes). The same wave with fencing off (the cut attempts keep
    their keys) fails on that check: the detection is real. The machine's own namespace is unchanged."""
    before_net, before = _machine_net(), leftovers.snapshot()
    r, wave = _np1_wave(tmp_path / "on", fencing=True)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    receipts = orjson.loads((wave / "faults.json").read_bytes())
    np1 = [x for x in receipts if x["fault_id"] == "NP1"]
    assert np1 and all(x["status"] == "applied" for x in np1), [(x["status"], x["detail"]) for x in np1]
    for x in np1:
        assert x["target"]["link"].startswith("sfv") and x["target"]["healed_at"] > x["target"]["cut_at"], x
        assert "cut for" in x["detail"] and "keys revoked" in x["detail"], x["detail"]
    grades = _grades(wave)
    checked = [g["checks"]["fenced_writes_rejected"] for g in grades.values()]
    assert checked and all(c["verdict"] == "pass" for c in checked), checked
    tl = [orjson.loads(line) for line in (wave / "timeline.jsonl").read_bytes().splitlines()]
    assert {e["event"] for e in tl} >= {"link_cut", "link_healed"}
    for x in np1:  # the cut attempt was given up; a newer one (higher fence) finished the task
        t = x["task_id"]
        starts = [e for e in tl if e["event"] == "attempt_start" and e["task"] == t]
        assert len(starts) >= 2 and starts[0]["node"] == x["target"]["node"], (t, starts)
        assert starts[-1]["fence"] > starts[0]["fence"] and starts[1]["wall"] > x["target"]["cut_at"]

    r, wave = _np1_wave(tmp_path / "off", fencing=False)
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-3000:])
    grades = _grades(wave)
    bad = [g["checks"]["fenced_writes_rejected"] for g in grades.values()
           if g["checks"].get("fenced_writes_rejected", {}).get("verdict") == "fail"]
    assert bad and "took effect" in bad[0]["detail"], [g["checks"].get("fenced_writes_rejected") for g in
                                                     grades.values()]
    assert _machine_net() == before_net
    left = leftovers.wait_clean(before)
    assert not left, left
    assert not isolated.leftover_node_cgroups()


def test_np2_a_degraded_link_is_ridden_out_and_its_receipt_says_what_applied(tmp_path):
    cfg = tmp_path / "np2.yaml"
    cfg.write_text("tasks: 2\nconcurrency: 2\nseed: 3\nfaults: [NP2]\nnodes: 3\nnode_isolation: namespaces\n"
                   "fault_timing: {NP2: {at_s: [0.2, 0.4], window_s: [2.0, 2.5]}}\nworkload: {steps: 5, think_ms: 50}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--results",
                        str(tmp_path / "r"), "--no-progress"], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    wave = (tmp_path / "r" / "latest").resolve()
    np2 = [x for x in orjson.loads((wave / "faults.json").read_bytes()) if x["fault_id"] == "NP2"]
    assert np2 and all(x["status"] == "applied" for x in np2), [(x["status"], x["detail"]) for x in np2]
    for x in np2:
        assert "restored" in x["detail"] and "NOT restored" not in x["detail"], x["detail"]
        assert "loss" in x["detail"] or "delay" in x["detail"], x["detail"]
