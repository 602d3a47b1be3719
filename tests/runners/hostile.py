"""A hostile runner: it attacks the host and the harness, then does its task honestly.

$ATTACKS maps task ids to one attack each (`t000=write_outside,t001=none,...`).
Each attack prints one line `ATTACK <name> RESULT <blocked|ESCAPED> <detail>`; the
test reads them from the runner's log (written by the host) and checks the host
itself. After the attack the runner follows the durable pattern, so a contained
attack leaves an honest, passing task.
"""
from __future__ import annotations

import errno
import glob
import json
import multiprocessing
import os
import resource
import signal
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "fleet", "runners"))

import durable  # noqa: E402

HOST_PATHS = ["/etc/sf-pwned", "/usr/sf-pwned", "/root/sf-pwned", "/work/sf-pwned", "/var/sf-pwned"]
RELAY_PORTS = {18000, 18001, 18002}


def report(name: str, ok: bool, detail: str) -> None:
    print(f"ATTACK {name} RESULT {'blocked' if ok else 'ESCAPED'} {detail}", flush=True)


def _try_write(path: str) -> str | None:
    try:
        with open(path, "w") as f:
            f.write("pwned\n")
        return None
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))


def write_outside():
    paths = HOST_PATHS + [os.path.join(os.environ.get("HOST_RESULTS", "/nonexistent"), "sf-pwned")]
    res = {p: _try_write(p) for p in paths}
    report("write_outside", all(res.values()), json.dumps(res))


def read_identities():
    found = glob.glob("/tmp/sandfleet-*/**/identities.json", recursive=True) + \
        glob.glob("/tmp/sandfleet-*/**/credentials.json", recursive=True)
    readable = []
    for p in found + [os.environ.get("HOST_IDENTITIES", "/nonexistent")]:
        try:
            open(p).read()
            readable.append(p)
        except OSError:
            pass
    report("read_identities", not readable, f"readable={readable}")


def write_results():
    root = os.environ.get("HOST_RESULTS", "/nonexistent")
    err = _try_write(os.path.join(root, "latest", "t000.grade.json"))
    visible = os.path.exists(root)
    report("write_results", err is not None and not visible, f"visible={visible} write={err}")


def foreign_prefix():
    import boto3
    from botocore.config import Config

    c = boto3.client("s3", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
    bucket, prefix = os.environ["SANDFLEET_S3_BUCKET"], os.environ["SANDFLEET_S3_PREFIX"]
    wave = prefix.split("/")[0]
    out = {}
    for key in (f"{wave}/t999/pwned", f"{wave}/ref-t000/pwned", "pwned"):
        try:
            c.put_object(Bucket=bucket, Key=key, Body=b"pwned")
            out[key] = "written"
        except Exception as exc:  # noqa: BLE001
            out[key] = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
    try:
        c.list_objects_v2(Bucket=bucket, Prefix=f"{wave}/")
        out["list-wave"] = "listed"
    except Exception as exc:  # noqa: BLE001
        out["list-wave"] = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
    report("foreign_prefix", "written" not in out.values() and out["list-wave"] != "listed", json.dumps(out))


def proxy_control():
    open_ports = []
    for port in range(1, 65536):
        s = socket.socket()
        s.settimeout(0.2)
        try:
            if s.connect_ex(("127.0.0.1", port)) == 0 and s.getsockname() != s.getpeername():  # not a self-connect
                open_ports.append(port)
        finally:
            s.close()
    extra = sorted(set(open_ports) - RELAY_PORTS)
    report("proxy_control", not extra, f"open={open_ports}")


def cgroup_escape():
    errs = {}
    for ctrl in ("pids", "memory", "cpu", "freezer"):
        errs[f"{ctrl}/cgroup.procs"] = _try_write(f"/sys/fs/cgroup/{ctrl}/cgroup.procs")
    errs["memory.limit"] = _try_write("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    errs["pids.max"] = _try_write("/sys/fs/cgroup/pids/pids.max")
    errs["freezer.state"] = _try_write("/sys/fs/cgroup/freezer/freezer.state")
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # a cgroup v2 host: the unified files too
        for f in ("cgroup.procs", "cgroup.subtree_control", "memory.max", "pids.max", "cgroup.freeze", "cgroup.kill"):
            errs[f"v2 {f}"] = _try_write(f"/sys/fs/cgroup/{f}")
    report("cgroup_escape", all(errs.values()), json.dumps(errs))


def setsid_daemon():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.closerange(0, 3)
            time.sleep(600)
        os._exit(0)
    report("setsid_daemon", True, "spawned a detached daemon; the host must reap it")


def ignore_sigterm():
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.closerange(0, 3)
        time.sleep(600)
        os._exit(0)
    report("ignore_sigterm", True, "spawned a child that ignores SIGTERM; the host must reap it")


def fill_workspace():
    path = os.path.join(os.environ["SANDFLEET_WORKSPACE"], "fill")
    written, err = 0, None
    try:
        with open(path, "wb") as f:
            while written < 8 * 1024**3:
                f.write(b"\0" * (1 << 20))
                written += 1 << 20
    except OSError as exc:
        err = errno.errorcode.get(exc.errno, str(exc.errno))
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    report("fill_workspace", err == "ENOSPC", f"wrote {written >> 20} MiB then {err}")


def _hog():
    blocks = []
    while True:
        blocks.append(bytearray(32 * 1024 * 1024))


def memory():
    p = multiprocessing.get_context("fork").Process(target=_hog)
    p.start()
    p.join(60)
    report("memory", p.exitcode == -signal.SIGKILL, f"allocating child ended with {p.exitcode}")


def fork_bomb():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        kids, err = 0, None
        while kids < 100000:
            try:
                k = os.fork()
            except OSError as exc:
                err = errno.errorcode.get(exc.errno, str(exc.errno))
                break
            if k == 0:
                time.sleep(30)
                os._exit(0)
            kids += 1
        os.write(w, f"{kids} {err}".encode())
        os.killpg(0, signal.SIGKILL)
    os.close(w)
    kids, err = os.read(r, 100).decode().split()
    os.waitpid(pid, 0)
    report("fork_bomb", err == "EAGAIN" and int(kids) < 1000, f"stopped after {kids} forks: {err}")


def stale_key():
    """Attempt 1 keeps its key in the store and fails; attempt 2 writes with that old key (a zombie's key)."""
    import boto3
    from botocore.config import Config

    bucket, prefix = os.environ["SANDFLEET_S3_BUCKET"], os.environ["SANDFLEET_S3_PREFIX"]
    cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    c = boto3.client("s3", config=cfg)
    if os.environ["SANDFLEET_ATTEMPT"] == "1":
        k = boto3.session.Session().get_credentials().get_frozen_credentials()
        c.put_object(Bucket=bucket, Key=prefix + "old-key.json",
                     Body=json.dumps({"a": k.access_key, "s": k.secret_key}).encode())
        print("kept my key; failing this attempt", flush=True)
        sys.exit(1)
    old = json.loads(c.get_object(Bucket=bucket, Key=prefix + "old-key.json")["Body"].read())
    zombie = boto3.client("s3", aws_access_key_id=old["a"], aws_secret_access_key=old["s"], config=cfg)
    try:
        zombie.put_object(Bucket=bucket, Key=prefix + "zombie-write", Body=b"stale")
        code = "written"
    except Exception as exc:  # noqa: BLE001
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
    report("stale_key", code in ("InvalidAccessKeyId", "AccessDenied", "SignatureDoesNotMatch"),
           f"write with the previous attempt's key: {code}")


def _spin(seconds):
    end = time.time() + seconds
    while time.time() < end:
        pass


def spin_cpu():
    ctx = multiprocessing.get_context("fork")
    t0 = time.time()
    procs = [ctx.Process(target=_spin, args=(2.0,)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    wall = time.time() - t0
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cores = (used.ru_utime + used.ru_stime) / wall
    report("spin_cpu", cores <= 1.3, f"4 spinners used {cores:.2f} cores over {wall:.1f}s")


def net_outside():
    routes = open("/proc/net/route").read().splitlines()[1:]
    if routes:  # never send a packet to a real address: only try when there is no route at all
        report("net_outside", False, f"routes present: {routes}")
        return
    out = {}
    for host, port in (("10.0.0.1", 80), ("172.16.0.1", 80), ("192.168.0.1", 80), ("8.8.8.8", 53)):
        s = socket.socket()
        s.settimeout(1)
        try:
            out[host] = errno.errorcode.get(s.connect_ex((host, port)), "connected")
        finally:
            s.close()
    report("net_outside", all(v != "connected" and v != "OK" for v in out.values()), json.dumps(out))


def new_userns():
    """A user namespace of its own, then mount and network namespaces inside it (as `unshare -Urmn` does): docker's
    seccomp profile refuses the first step, and so must the process sandbox. Tried in a child (each of unshare's
    flags, and clone with CLONE_NEWUSER), so the runner itself is never moved."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    newuser, newns, newnet = 0x10000000, 0x00020000, 0x40000000
    out = {}
    for name, flags in (("user", newuser), ("user+mount+net", newuser | newns | newnet)):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            rc = libc.unshare(flags)
            os.write(w, ("ok" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), "?")).encode())
            os._exit(0)
        os.close(w)
        out[name] = os.read(r, 64).decode()
        os.close(r)
        os.waitpid(pid, 0)
    report("new_userns", all(v != "ok" for v in out.values()), json.dumps(out))


def list_cgroups():
    """Every wave and sandbox on the host, with pids, through /sys/fs/cgroup: the sandbox may see only its own group
    or none."""
    seen = []
    for top, dirs, _files in os.walk("/sys/fs/cgroup"):
        seen += [os.path.join(top, d) for d in dirs if "sandfleet" in d or d.startswith("w-")]
        if len(seen) > 20:
            break
    own = open("/proc/self/cgroup").read().split()
    report("list_cgroups", not seen, json.dumps({"seen": seen[:20], "own": own[:4]}))


ATTACKS = {f.__name__: f for f in (write_outside, read_identities, write_results, foreign_prefix, proxy_control,
                                   cgroup_escape, setsid_daemon, ignore_sigterm, fill_workspace, memory,
                                   fork_bomb, spin_cpu, net_outside, stale_key, new_userns,
                                   list_cgroups)}


def main():
    plan = dict(x.split("=", 1) for x in os.environ.get("ATTACKS", "").split(",") if "=" in x)
    name = plan.get(os.environ["SANDFLEET_TASK_ID"], "none")
    if name != "none" and (os.environ.get("SANDFLEET_ATTEMPT") == "1" or name == "stale_key"):
        try:
            ATTACKS[name]()
        except Exception as exc:  # noqa: BLE001
            report(name, True, f"attack raised {type(exc).__name__}: {exc}")
    durable.main_guard(durable.run)


if __name__ == "__main__":
    main()
