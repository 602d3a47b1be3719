"""The first process of an isolated node (`cluster/isolated.py`); `python -m cluster.isonode enter <spec>`.

`enter` (in the machine's pid namespace, this driver's child): joins the node's cgroup dirs, dies with the thread
that spawned it, and becomes `unshare` of new network, mount and pid namespaces. `node` (pid 1 in them): mounts a
private /tmp and /dev/shm, binds the harness's own install back where it lay under /tmp (read-only), prints its
namespaces' inode numbers (or `{"error": ...}`), waits for the driver to make its link (`go` on stdin), then runs
`ray start --address <head> --block` as its child, reaping every orphan, until that ends.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

PR_SET_PDEATHSIG = 1
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 0x1, 0x20, 0x1000, 0x4000
_libc = ctypes.CDLL(None, use_errno=True)


def enter(spec: dict) -> None:
    for procs in spec["cgroups"]:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    _libc.prctl(PR_SET_PDEATHSIG, 9)
    marker = f"sandfleet-node.{spec['tag']}.{spec['name']}"
    os.execvp("unshare", ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
                          "--propagation", "private", sys.executable, "-m", "cluster.isonode", "node",
                          json.dumps(spec), marker])


def _mount(src: str | None, dst: str, flags: int) -> None:
    if _libc.mount(src.encode() if src else None, dst.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src or '(remount)'} on {dst}: {os.strerror(err)}")


def private_tmp(keep: list[str]) -> None:
    """A private /tmp and /dev/shm; each path of `keep` (the harness's own install under /tmp) is held open
    before and bound back at the same path after, read-only."""
    held = [(path, os.open(path, os.O_PATH)) for path in keep]
    try:
        for path, opts in (("/tmp", "mode=1777"), ("/dev/shm", "mode=1777")):
            subprocess.run(["mount", "-t", "tmpfs", "-o", opts,
                            f"sandfleet-node-{path.strip('/').replace('/', '-')}", path], check=True)
        for path, fd in held:
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "a").close()
            _mount(f"/proc/self/fd/{fd}", path, MS_BIND | MS_REC)
            _mount(None, path, MS_REMOUNT | MS_BIND | MS_RDONLY)
    finally:
        for _, fd in held:
            os.close(fd)


def node(spec: dict) -> int:
    try:
        private_tmp(spec.get("keep", []))
        ray = spec["ray_script"]
        if not os.access(ray, os.X_OK):
            raise OSError(f"{ray} (the harness's `ray`) is not there on this node")
    except (OSError, subprocess.CalledProcessError) as exc:
        print(json.dumps({"error": f"the harness's install could not be made visible under the node's private "
                                   f"/tmp: {exc}"}), flush=True)
        return 2
    ns = {k: os.stat(f"/proc/self/ns/{k}").st_ino for k in ("net", "mnt", "pid")}
    print(json.dumps({"ns": ns}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return 3
    child = subprocess.Popen([ray, "start", *spec["ray"]], stdin=subprocess.DEVNULL)
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
