"""Isolated nodes (issue 17), side by side in one run; writes the `Isolated nodes` section of BENCHMARKS.md.

- The same wave on three shared-loopback nodes (`--nodes 3`) and on three isolated nodes (`--nodes 3
  --isolated-nodes`), interleaved: wall time, and machine CPU per attempt (every process: harness and runners; the
  runners' share is the same in both, so the difference is the harness's).
- The path a sandbox's store traffic takes: 1 KiB GET p50 / p99 and 64 MiB PUT / GET, from a client in a node's own
  network namespace through the head's gate (veth, bridge, token line, gate, proxy, store), against a client on the
  head through the same relay code with no gate (the path a sandbox on the head's machine takes: relay, proxy,
  store). Each client sits behind a relay like a sandbox's (fleet/netns.py's handler).

`python -m tests.bench.isolated` (root; `make bench` runs it).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.bench import write_section

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- isolated -->"
N_SMALL = 1000
N_BIG = 4


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def _busy_jiffies() -> int:
    f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(x) for x in f) - int(f[3]) - int(f[4])  # all but idle and iowait


def bench_waves(rows: list, rounds: int = 2) -> None:
    cfg = {"tasks": 6, "concurrency": 2, "seed": 21, "faults": "none", "workload": {"steps": 8, "think_ms": 100}}
    got: dict[str, list] = {"shared": [], "isolated": []}
    root = Path(tempfile.mkdtemp(prefix="sfbench-iso-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    try:
        for i in range(rounds):
            for kind in ("shared", "isolated"):
                path = root / f"{kind}{i}.yaml"
                path.write_text(json.dumps(dict(cfg, nodes=3, node_isolation="namespaces" if kind == "isolated"
                                                else "none")))
                j0, t0 = _busy_jiffies(), time.perf_counter()
                r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(path), "--results",
                                    str(root / "r"), "--no-progress"], env=env, cwd=ROOT, capture_output=True,
                                   text=True, timeout=600)
                wall, cpu = time.perf_counter() - t0, (_busy_jiffies() - j0) / os.sysconf("SC_CLK_TCK")
                wave = (root / "r" / "latest").resolve()
                attempts = sum(1 for line in (wave / "timeline.jsonl").read_text().splitlines()
                               if '"attempt_start"' in line)
                got[kind].append((wall, cpu / max(1, attempts), r.returncode, attempts))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sw, iw = (statistics.median(x[0] for x in got[k]) for k in ("shared", "isolated"))
    sc, ic = (statistics.median(x[1] for x in got[k]) * 1000 for k in ("shared", "isolated"))
    exits = {k: sorted({x[2] for x in v}) for k, v in got.items()}
    rows.append((f"wave: 6 durable tasks, concurrency 2, 8 steps x 100 ms think, 3 nodes, faults none (median of "
                 f"{rounds}, interleaved; exits {exits}); wall", f"isolated {iw:.1f} s", f"shared {sw:.1f} s",
                 f"isolated x{iw / sw:.2f} of shared"))
    rows.append(("same waves: machine CPU per attempt (harness and runners; the runners' share is equal)",
                 f"isolated {ic:.0f} ms", f"shared {sc:.0f} ms",
                 f"isolated x{ic / sc:.2f} of shared ({got['isolated'][0][3]} attempts a wave)"))


# -- the data path: a client behind a relay, on a node or on the head -----------------------------------------------

def _relay(upstream: str, token: str | None) -> int:
    """A sandbox-like relay on 127.0.0.1 (its own thread) to `upstream` (`host:port`, or `host:port/service` of the
    head's gate, opened with the token line); returns its port."""
    from fleet.wire import pipe, preface

    addr, _, service = upstream.partition("/")
    host, _, port = addr.rpartition(":")
    ready: list[int] = []
    ev = threading.Event()

    async def handle(creader, cwriter):
        ureader, uwriter = await asyncio.open_connection(host, int(port))
        if service:
            uwriter.write(preface(token or "", service))
        await asyncio.gather(pipe(creader, uwriter), pipe(ureader, cwriter))

    def run():
        loop = asyncio.new_event_loop()
        srv = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
        ready.append(srv.sockets[0].getsockname()[1])
        ev.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    ev.wait(10)
    return ready[0]


def client(upstream: str, token: str, key: str, secret: str) -> dict:
    """What one client measures through its relay: 1 KiB GETs and 64 MiB PUT/GET."""
    from storage.credentials import Credentials
    from storage.store import s3_client

    c = s3_client(f"http://127.0.0.1:{_relay(upstream, token or None)}", Credentials(key, secret))
    for _ in range(30):
        c.get_object(Bucket="bench", Key="small")["Body"].read()
    lat = []
    for _ in range(N_SMALL):
        t = time.perf_counter()
        c.get_object(Bucket="bench", Key="small")["Body"].read()
        lat.append((time.perf_counter() - t) * 1000)
    big = os.urandom(64 * 1024 * 1024)
    put, get = [], []
    for i in range(N_BIG):
        t = time.perf_counter()
        c.put_object(Bucket="bench", Key=f"big-{os.getpid()}-{i}", Body=big)
        put.append(64 / (time.perf_counter() - t))
        t = time.perf_counter()
        c.get_object(Bucket="bench", Key=f"big-{os.getpid()}-{i}")["Body"].read()
        get.append(64 / (time.perf_counter() - t))
    return {"p50": pct(lat, 50), "p99": pct(lat, 99), "put": statistics.median(put), "get": statistics.median(get)}


def _on_a_node(index: int, upstream: str, token: str, key: str, secret: str) -> dict:
    """`client` in a network namespace of its own linked to the head's bridge, as an isolated node's sandbox is."""
    from cluster import isolated

    proc = subprocess.Popen(["unshare", "--net", "--", sys.executable, "-m", "tests.bench.isolated", "--client",
                             upstream, token, key, secret], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=ROOT, text=True)
    veth = f"sfvb{index}"
    try:
        time.sleep(0.3)  # (the child is in its namespace once unshare exec'd python; it waits for "go")
        isolated._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(proc.pid))
        isolated._ip("link", "set", veth, "master", isolated.BRIDGE)
        isolated._ip("link", "set", veth, "up")
        for args in (("link", "set", "lo", "up"), ("addr", "add", f"{isolated.node_ip(10 + index)}/24", "dev", "eth0"),
                     ("link", "set", "eth0", "up")):
            isolated._ip(*args, ns_pid=proc.pid)
        out, _ = proc.communicate("go\n", timeout=600)
        return json.loads(out.strip().splitlines()[-1])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def bench_path() -> list:
    """Runs in a process of its own: enters the head's namespace, starts the store, the proxy and the gate."""
    import secrets

    from cluster import isolated
    from fleet.gateway import Gateway
    from storage.proxy import ProxyProcess
    from storage.store import EmbeddedStore, s3_client

    isolated.check_available(2)
    isolated.enter_once()
    d = Path(tempfile.mkdtemp(prefix="sfbench-path-"))
    store = EmbeddedStore(d / "store")
    ep = store.start()
    proxy = ProxyProcess(ep.url, str(d / "proxy.jsonl")).start()
    token = secrets.token_hex(32)
    gw = Gateway(isolated.HEAD_IP, token, {"s3": ("127.0.0.1", proxy.port)}).start()
    try:
        c = s3_client(ep.url, ep.creds)
        c.create_bucket(Bucket="bench")
        c.put_object(Bucket="bench", Key="small", Body=os.urandom(1024))
        got: dict[str, list] = {"head": [], "node": []}
        for i in range(2):  # alternated: head, node, head, node
            got["head"].append(client(f"127.0.0.1:{proxy.port}", "", ep.creds.access_key, ep.creds.secret_key))
            got["node"].append(_on_a_node(i, gw.target("s3"), token, ep.creds.access_key, ep.creds.secret_key))
    finally:
        gw.stop()
        proxy.stop()
        store.stop()
        shutil.rmtree(d, ignore_errors=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("p50", "p99", "put", "get")} for k, v in got.items()}
    h, n = med["head"], med["node"]
    return [(f"store GET 1 KiB through a sandbox-like relay, keep-alive, n={N_SMALL} x 2: p50 / p99 (ms)",
             f"node via gate {n['p50']:.2f} / {n['p99']:.2f}", f"head-local {h['p50']:.2f} / {h['p99']:.2f}",
             f"the gate and the link add {n['p50'] - h['p50']:+.2f} ms p50, {n['p99'] - h['p99']:+.2f} ms p99"),
            (f"PUT 64 MiB (MiB/s), median of {N_BIG} x 2", f"node via gate {n['put']:.0f}", f"head-local {h['put']:.0f}",
             f"{n['put'] / h['put']:.2f} of head-local"),
            (f"GET 64 MiB (MiB/s), median of {N_BIG} x 2", f"node via gate {n['get']:.0f}", f"head-local {h['get']:.0f}",
             f"{n['get'] / h['get']:.2f} of head-local")]


def main() -> None:
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:2] == ["--client"]:
        sys.stdin.readline()  # "go": the link is up
        print(json.dumps(client(*sys.argv[2:6])))
        return
    if sys.argv[1:2] == ["--path"]:
        print(json.dumps(bench_path()))
        return
    rows: list = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run([sys.executable, "-m", "tests.bench.isolated", "--path"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"the data path bench failed: {r.stderr[-2000:]}")
    rows += [tuple(x) for x in json.loads(r.stdout.strip().splitlines()[-1])]
    bench_waves(rows)
    write_section(MARK, "Isolated nodes (issue 17)", "Produced by `python -m tests.bench.isolated` (part of "
                  "`make bench`); one run, side by side", "| measurement | isolated | beside | ratio / note |", rows)


if __name__ == "__main__":
    main()
