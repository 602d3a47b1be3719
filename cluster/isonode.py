"""The first process of an isolated node (`cluster/isolated.py`); `python -m cluster.isonode enter <spec>`.

`enter` (in the machine's pid namespace, this driver's child): joins the node's cgroup dirs, dies with the thread
that spawned it, and becomes `unshare` of new network, mount and pid namespaces. `node` (pid 1 in them): mounts a
private /tmp and /dev/shm, prints its namespaces' inode numbers, waits for the driver to make its link (`go` on
stdin), then runs `ray start --address <head> --block` as its child, reaping every orphan, until that ends.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def enter(spec: dict) -> None:
    for procs in spec["cgroups"]:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 9)
    marker = f"sandfleet-node.{spec['tag']}.{spec['name']}"
    os.execvp("unshare", ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
                          "--propagation", "private", sys.executable, "-m", "cluster.isonode", "node",
                          json.dumps(spec), marker])


def node(spec: dict) -> int:
    for path, opts in (("/tmp", "mode=1777"), ("/dev/shm", "mode=1777")):
        subprocess.run(["mount", "-t", "tmpfs", "-o", opts, f"sandfleet-node-{path.strip('/').replace('/', '-')}",
                        path], check=True)
    ns = {k: os.stat(f"/proc/self/ns/{k}").st_ino for k in ("net", "mnt", "pid")}
    print(json.dumps({"ns": ns}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return 3
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    child = subprocess.Popen([ray if os.path.exists(ray) else "ray", "start", *spec["ray"]], stdin=subprocess.DEVNULL)
    while True:  # pid 1: every orphan of the node is ours to reap
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 0
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    what, raw = sys.argv[1], sys.argv[2]
    if what == "enter":
        enter(json.loads(raw))
    else:
        sys.exit(node(json.loads(raw)))
