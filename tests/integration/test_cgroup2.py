"""The process backend's limits and actions on the host's cgroup mode (v1 here; v2 in the VM of
`make test-cgroup2`): memory (OOM kill, no swap), pids, cpu quota, PK6 freeze and thaw, kill of everything
(a daemonized child and a frozen sandbox too), the harness's own group beside the sandboxes', nothing left. On
v2 also: a non-root delegated subtree (its processes moved to a leaf first) and a subtree without the controllers
delegated (exit 254, naming what is missing). No Ray and no store: the backend alone, as the sandbox host runs it."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet import cgroups
from fleet.sandbox import ProcessBackend, SandboxSpec, check_process_backend
from tests import leftovers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WAVE = f"w-cg-{os.getpid()}"
MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _real_backend(suite_lock):
    try:
        check_process_backend()
    except Exception as exc:  # noqa: BLE001 - the machine cannot run sandboxes: say why
        pytest.fail(f"the process backend cannot run here: {exc}")
    before = leftovers.snapshot()
    yield
    assert not leftovers.wait_clean(before), "a sandbox process, cgroup or mount was left behind"


def _spec(tmp_path: Path, sid: str, script: str, **kw) -> SandboxSpec:
    state = tmp_path / sid
    state.mkdir()
    return SandboxSpec(wave_id=WAVE, sandbox_id=sid, task_id="t-cg", attempt=1, argv=["/bin/sh", "-c", script],
                       env={}, state_dir=str(state), workspace_mb=8, **kw)


def _cg_dir(be: ProcessBackend, spec: SandboxSpec, controller: str) -> Path:
    cg = be._cgroups[spec.key]
    return cg.dir if cgroups.unified() else cg.dirs[controller]


def _cpu_stat(d: Path) -> dict:
    return {k: int(v) for k, v in (line.split() for line in (d / "cpu.stat").read_text().splitlines())}


async def _until(pred, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        await asyncio.sleep(0.05)


async def _end(be: ProcessBackend, sb) -> None:
    await be.kill(sb)
    await asyncio.wait_for(be.wait(sb), 60)
    await be.remove(sb)


def test_limits_are_written_from_outside_in_the_hosts_cgroup_mode(tmp_path):
    async def go():
        be = ProcessBackend()
        spec = _spec(tmp_path, "limits", "exec sleep 300", memory_mb=96, pids_max=40, cpu_shares=512,
                     cpu_quota=0.5)
        sb = await be.start(spec)
        try:
            if cgroups.unified():
                d = _cg_dir(be, spec, cgroups.UNIFIED)
                assert d == cgroups.own_dirs()[cgroups.UNIFIED] / cgroups.MARK / WAVE / "limits"
                got = {f: (d / f).read_text().strip() for f in ("memory.max", "memory.swap.max", "pids.max",
                                                                 "cpu.weight", "cpu.max")}
                assert got == {"memory.max": str(96 * MiB), "memory.swap.max": "0", "pids.max": "40",
                               "cpu.weight": "50", "cpu.max": "50000 100000"}, got
                for parent in (d.parent, d.parent.parent):  # controllers on down to the sandbox's leaf
                    assert set(cgroups.V2_CONTROLLERS) <= set((parent / "cgroup.subtree_control").read_text().split())
            else:
                assert (_cg_dir(be, spec, "memory") / "memory.limit_in_bytes").read_text().strip() == str(96 * MiB)
                assert (_cg_dir(be, spec, "pids") / "pids.max").read_text().strip() == "40"
                assert (_cg_dir(be, spec, "cpu") / "cpu.shares").read_text().strip() == "512"
                assert (_cg_dir(be, spec, "cpu") / "cpu.cfs_quota_us").read_text().strip() == "50000"
            assert sb.pid in be._cgroups[spec.key].pids()
            assert (WAVE, "limits") in cgroups.list_sandboxes(WAVE)
        finally:
            await _end(be, sb)
        assert cgroups.list_sandboxes(WAVE) == []
        assert not any(d.exists() for d in cgroups.wave_dirs(WAVE))

    asyncio.run(go())


def test_a_runner_past_its_memory_limit_is_oom_killed_and_the_cause_says_so(tmp_path):
    async def go():
        be = ProcessBackend()
        # `tail` keeps a line with no newline whole: 256 MiB of zeros against a 48 MiB limit (no swap to escape to)
        spec = _spec(tmp_path, "oom", "head -c 268435456 /dev/zero | tail -n 1 >/dev/null && echo survived",
                     memory_mb=48)
        sb = await be.start(spec)
        code = await asyncio.wait_for(be.wait(sb), 120)
        try:
            assert code != 0
            assert sb.extra["events"]["oom_kills"] >= 1, sb.extra
            assert sb.cause().startswith("OOM kill"), sb.cause()
            assert "survived" not in Path(spec.log_path).read_text()
        finally:
            await be.remove(sb)

    asyncio.run(go())


def test_forks_past_pids_max_are_refused_and_counted(tmp_path):
    async def go():
        be = ProcessBackend()
        spec = _spec(tmp_path, "pids", "for i in $(seq 80); do sleep 300 & done; sleep 300", pids_max=24)
        sb = await be.start(spec)
        cg = be._cgroups[spec.key]
        try:
            await _until(lambda: cg.events()["pids_max_hits"] > 0, "a fork refused at pids.max")
            assert len(cg.pids()) <= 24
        finally:
            await _end(be, sb)

    asyncio.run(go())


def test_a_busy_runner_gets_no_more_cpu_than_its_quota(tmp_path):
    async def go():
        be = ProcessBackend()
        spec = _spec(tmp_path, "cpu", "while :; do :; done", cpu_quota=0.1)
        sb = await be.start(spec)
        d = _cg_dir(be, spec, "cpu")
        try:
            await asyncio.sleep(0.5)
            t0, s0 = time.monotonic(), _cpu_stat(d)
            cpu0 = _cpu_used(be._cgroups[spec.key].pids())
            await asyncio.sleep(3.0)
            wall, s1 = time.monotonic() - t0, _cpu_stat(d)
            used = _cpu_used(be._cgroups[spec.key].pids()) - cpu0
            assert s1["nr_throttled"] > s0["nr_throttled"], (s0, s1)
            assert used / wall < 0.1 * 1.5 + 0.03, f"{used:.2f} CPU-s in {wall:.2f} s against a 0.1-core quota"
        finally:
            await _end(be, sb)

    asyncio.run(go())


def _cpu_used(pids: list[int]) -> float:
    """CPU seconds (user + system) of these processes so far, from the host's /proc."""
    total = 0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(f[11]) + int(f[12])
    return total / os.sysconf("SC_CLK_TCK")


def test_pk6_freeze_stops_every_process_and_thaw_resumes_them(tmp_path):
    async def go():
        be = ProcessBackend()
        spec = _spec(tmp_path, "freeze", "i=0; while :; do i=$((i+1)); echo $i > n.tmp; mv n.tmp n; sleep 0.05; done")
        sb = await be.start(spec)
        n = Path(spec.workspace) / "n"

        def count() -> int:
            try:
                return int(n.read_text() or 0)
            except (OSError, ValueError):
                return 0

        try:
            await _until(lambda: count() > 3, "the runner counting")
            assert await be.freeze(sb)
            if cgroups.unified():
                assert "frozen 1" in (be._cgroups[spec.key].dir / "cgroup.events").read_text().splitlines()
            frozen_at = count()
            await asyncio.sleep(1.5)
            assert count() == frozen_at, "a frozen sandbox kept running"
            states = {Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
                      for p in be._cgroups[spec.key].pids()}
            assert states <= {"S", "D", "T", "t"}, states  # (v2 freezes in the kernel: sleeping, never running)
            assert await be.thaw(sb)
            await _until(lambda: count() > frozen_at + 3, "the thawed runner counting again")
        finally:
            await _end(be, sb)

    asyncio.run(go())


def test_kill_ends_every_process_daemonized_or_frozen_and_remove_leaves_nothing(tmp_path):
    async def go():
        be = ProcessBackend()
        daemon = _spec(tmp_path, "daemon", "(setsid sleep 300 &); (setsid sh -c 'sleep 300 & wait' &); exec sleep 300")
        frozen = _spec(tmp_path, "frozen", "sleep 300 & sleep 300 & wait")
        sbs = [await be.start(daemon), await be.start(frozen)]
        cgs = [be._cgroups[daemon.key], be._cgroups[frozen.key]]
        await _until(lambda: len(cgs[0].pids()) >= 5 and len(cgs[1].pids()) >= 3, "every process started")
        pids = cgs[0].pids() + cgs[1].pids()
        assert await be.freeze(sbs[1])
        for sb in sbs:
            await _end(be, sb)
        alive = [p for p in pids if Path(f"/proc/{p}").exists()
                 and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
        assert not alive, alive
        assert not any(cg.exists() for cg in cgs)
        assert cgroups.list_sandboxes(WAVE) == []

    asyncio.run(go())


def test_the_harness_group_is_a_sibling_of_the_sandboxes_and_is_left_cleanly():
    before = cgroups.harness_dirs()
    own = "/proc/self/cgroup"
    was = Path(own).read_text()
    d = cgroups.join_harness(f"test-{os.getpid()}")
    try:
        assert d.parent.name == cgroups.HARNESS and d.parent.parent == cgroups.own_dirs()[
            cgroups.UNIFIED if cgroups.unified() else "cpu"]
        assert str(d) in cgroups.harness_dirs()
        line = next(line for line in Path(own).read_text().splitlines()
                    if (line.startswith("0::") if cgroups.unified() else "cpu" in line.split(":")[1].split(",")))
        assert line.endswith(f"/{cgroups.HARNESS}/test-{os.getpid()}")
        f, default = ("cpu.weight", 100) if cgroups.unified() else ("cpu.shares", 1024)
        assert int((d / f).read_text()) > default
    finally:
        cgroups.leave_harness(d)
    assert cgroups.harness_dirs() == before
    assert not d.exists()
    if not cgroups.unified():
        assert Path(own).read_text() == was


def _rmdirs(top: Path, timeout_s: float = 10.0) -> None:
    """Remove a cgroup dir the test made, the deepest first; a just-emptied one can stay busy for a moment."""
    deadline = time.monotonic() + timeout_s
    while top.exists():
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [top]:
            try:
                d.rmdir()
            except OSError:
                pass
        if top.exists():
            if time.monotonic() > deadline:
                left = {str(d): (d / "cgroup.procs").read_text().split() for d in [top, *top.rglob("*")] if d.is_dir()}
                raise AssertionError(f"cannot remove {top}: {left}")
            time.sleep(0.05)


v2_only = pytest.mark.skipif(not cgroups.unified(), reason="a cgroup v2 host only (`make test-cgroup2` boots one)")

DELEGATED = r"""
import asyncio, json, os, sys, time
from fleet import cgroups, netns
from fleet.sandbox import ProcessBackend, SandboxSpec
out = {}
async def go():
    be = ProcessBackend()
    spec = SandboxSpec(wave_id=sys.argv[1], sandbox_id="deleg", task_id="t", attempt=1, env={}, state_dir=sys.argv[2],
                       argv=["/bin/sh", "-c", "sleep 1; head -c 268435456 /dev/zero | tail -n 1 >/dev/null"], memory_mb=48,
                       workspace_mb=8)
    os.makedirs(spec.state_dir)
    sb = await be.start(spec)
    out["sandbox_dir"] = str(be._cgroups[spec.key].dir)
    out["own_while_running"] = open("/proc/self/cgroup").read().strip()
    assert await be.freeze(sb) and await be.thaw(sb)
    out["code"] = await be.wait(sb)
    out["events"] = sb.extra["events"]
    await be.remove(sb)
h = cgroups.join_harness("deleg")
out["harness"] = str(h)
asyncio.run(go())
netns.stop_forwarder(True)  # (as the host does: its relay child is in the harness group it leaves)
cgroups.leave_harness(h)
out["own_after"] = open("/proc/self/cgroup").read().strip()
print(json.dumps(out))
"""


@v2_only
def test_v2_a_non_root_delegated_subtree_moves_its_processes_to_a_leaf_first(tmp_path):
    """v2 allows no process in an inner node: started in its own (non-root) cgroup, the harness moves what runs
    there into `sandfleet-home` before it enables memory, pids and cpu for its children, and goes back there."""
    cgroups.delegated_root()  # (the parent must hand the controllers down: the root here)
    sub = cgroups.own_dirs()[cgroups.UNIFIED] / f"sfdeleg-{os.getpid()}"
    sub.mkdir()
    try:
        p = subprocess.run(["sh", "-c", f'echo $$ > {sub}/cgroup.procs && exec "$@"', "sh", sys.executable, "-c",
                            DELEGATED, f"{WAVE}-d", str(tmp_path / "deleg")],
                           cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stderr[-2000:]
        got = json.loads(p.stdout.strip().splitlines()[-1])
        rel = "/" + str(sub.relative_to(cgroups.ROOT))
        assert got["own_while_running"] == f"0::{rel}/{cgroups.HARNESS}/deleg", got
        assert got["sandbox_dir"] == f"{sub}/{cgroups.MARK}/{WAVE}-d/deleg", got
        assert got["own_after"] == f"0::{rel}/{cgroups.HOME}", got
        assert got["code"] != 0 and got["events"]["oom_kills"] >= 1, got
        assert set(cgroups.V2_CONTROLLERS) <= set((sub / "cgroup.subtree_control").read_text().split())
        assert sorted(p.name for p in sub.iterdir() if p.is_dir()) == [cgroups.HOME], "the harness left a dir"
    finally:
        _rmdirs(sub)


@v2_only
def test_v2_a_subtree_without_the_controllers_delegated_is_bad_input_254():
    """A v2 host whose cgroup for the harness has no memory/pids/cpu handed down (a parent that did not enable
    them: under systemd, a unit without Delegate=yes): exit 254 before anything runs, naming what is missing and
    how to get it."""
    outer = cgroups.own_dirs()[cgroups.UNIFIED] / f"sfnodeleg-{os.getpid()}"
    inner = outer / "inner"
    inner.mkdir(parents=True)
    try:
        assert (inner / "cgroup.controllers").read_text().split() == []
        p = subprocess.run(["sh", "-c", f'echo $$ > {inner}/cgroup.procs && exec "$@"', "sh",
                            str(Path(sys.executable).parent / "sandfleet"), "wave", "run",
                            str(ROOT / "configs" / "quickstart.yaml"), "--results", "/tmp/sf-nodeleg-results"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert p.returncode == 254, (p.returncode, p.stderr[-2000:])
        assert "memory, pids, cpu not available" in p.stderr and "Delegate=yes" in p.stderr, p.stderr[-2000:]
        assert not Path("/tmp/sf-nodeleg-results").exists(), "results were written before the check"
    finally:
        _rmdirs(outer)
