"""CPU of a measured tree for the benches: a cpuacct cgroup around it (every process it starts is counted), and a
sampler of each process's own CPU so the total can be split into the harness's parts and the sandboxes."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = float(os.environ.get("SFBENCH_SAMPLE_S", "0.25"))  # how often each process's CPU is read


class Cgroup:
    def __init__(self, tag: str):
        self.name = f"sfbench-cost-{tag}-{os.getpid()}"
        self.dir = CPUACCT / self.name
        self.dir.mkdir()

    def usage_s(self) -> float:
        return int((self.dir / "cpuacct.usage").read_text()) / 1e9

    def pids(self) -> list[int]:
        return [int(x) for x in (self.dir / "cgroup.procs").read_text().split()]

    def run(self, argv: list[str], sample: bool = False, **kw) -> tuple[subprocess.CompletedProcess, dict]:
        """Run argv inside the cgroup (it joins before exec); with `sample`, each process's last CPU reading."""
        seen: dict[int, dict] = {}
        stop = threading.Event()

        def sampler():
            while not stop.is_set():
                for pid in self.pids():
                    st = proc_stat(pid)
                    if st is not None:
                        if not st["cmd"] and pid in seen:  # exiting: what it was is known from before
                            st.update(cmd=seen[pid]["cmd"], sandbox=seen[pid]["sandbox"])
                        seen[pid] = st
                stop.wait(SAMPLE_S)

        procs = str(self.dir / "cgroup.procs")
        th = threading.Thread(target=sampler, daemon=True)
        if sample:
            th.start()
        try:
            p = subprocess.run(argv, preexec_fn=lambda: _join(procs), capture_output=True, text=True, **kw)
        finally:
            stop.set()
            if sample:
                th.join()
        return p, seen

    def remove(self) -> None:
        for _ in range(100):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _join(procs: str) -> None:
    fd = os.open(procs, os.O_WRONLY)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)


def proc_stat(pid: int) -> dict | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        cg = next((line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                   if line.split(":")[1] == "cpu"), "")
    except (OSError, IndexError):
        return None
    f = raw[raw.rindex(")") + 2:].split()
    return {"cpu": (int(f[11]) + int(f[12])) / TICK, "cmd": cmd, "sandbox": "/sandfleet/" in cg + "/",
            "ppid": int(f[1])}


def _part(cmd: str) -> str:
    for key, name in (("weed ", "store (weed)"), ("storage.proxy", "fault proxy"), ("sandfleet-relay forward", "host actor's relay (compiled)"),
                      ("sandfleet-relay", "fault proxy"), ("gcs_server", "Ray GCS"), ("raylet/raylet", "raylet"),
                      ("ray::SandboxHost", "host actor"), ("ray::LeaseLedger", "ledger actor"),
                      ("ray::SweepActor", "sweep actor"), ("DashboardAgent", "Ray agents"),
                      ("RuntimeEnvAgent", "Ray agents"), ("dashboard.py", "Ray agents"), ("monitor.py", "Ray agents"),
                      ("cluster.cli", "driver (services, grading)"), ("ray::IDLE", "Ray idle workers"),
                      ("cluster.report", "driver (services, grading)"),
                      ("tests.bench.bare", "services (bare loop)"), ("sandfleet-wrap", "sandbox start (bash wrap)"),
                      ("bwrap", "sandbox start (bwrap)"), ("nsenter", "sandbox start (nsenter)"),
                      ("setpriv", "sandbox start (setpriv)")):
        if key in cmd:
            return name
    return "other"




def part_cpu(seen: dict, debug: bool = False) -> dict[str, float]:
    """The CPU-seconds of each harness part among the sampled processes (`Cgroup.run(sample=True)`); a process in
    a sandbox's cpu cgroup is never a part (the sandboxes are the tree's CPU less the parts)."""
    parts: dict[str, float] = {}
    for st in seen.values():
        if not st["sandbox"]:
            name = _part(st["cmd"])
            parts[name] = parts.get(name, 0.0) + st["cpu"]
            if name == "other" and debug:
                print(f"other: {st['cpu']:.2f} {st['cmd'][:150]}")
    return parts
