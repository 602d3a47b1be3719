"""`make bench`: side-by-side measurements in one run, written into BENCHMARKS.md.

- S3 through the fault proxy vs straight to the store (same client, same store):
  1 KiB GET latency, conditional 1 KiB PUT (the durable runner's per-step commit),
  16 MiB PUT and GET throughput.
- Process sandbox start and kill latency.
- Wave wall time for N tasks (durable runner, no faults, then PK1+ST1).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def bench_store(rows: list) -> None:
    from storage.proxy import ProxyProcess
    from storage.store import EmbeddedStore, s3_client

    d = Path(tempfile.mkdtemp(prefix="sfbench-"))
    store = EmbeddedStore(d / "store")
    t = time.perf_counter()
    ep = store.start()
    rows.append(("embedded store ready (weed mini)", f"{time.perf_counter() - t:.2f} s", "", ""))
    proxy = ProxyProcess(ep.url, str(d / "proxy.jsonl")).start()
    try:
        direct = s3_client(ep.url, ep.creds)
        via = s3_client(proxy.url, ep.creds)
        direct.create_bucket(Bucket="bench")
        small = os.urandom(1024)
        big = os.urandom(16 * 1024 * 1024)
        direct.put_object(Bucket="bench", Key="small", Body=small)
        clients = (("direct", direct), ("proxy", via))
        m = {name: {"lat": [], "commit": [], "put": [], "get": []} for name, _ in clients}
        for name, c in clients:
            for _ in range(20):  # warm up connections
                c.get_object(Bucket="bench", Key="small")["Body"].read()
        # Interleaved, so both paths see the same machine state.
        for i in range(300):
            for name, c in clients:
                t = time.perf_counter()
                c.get_object(Bucket="bench", Key="small")["Body"].read()
                m[name]["lat"].append((time.perf_counter() - t) * 1000)
        for i in range(150):
            for name, c in clients:
                t = time.perf_counter()
                c.put_object(Bucket="bench", Key=f"{name}/journal/{i:04d}", Body=small, IfNoneMatch="*")
                m[name]["commit"].append((time.perf_counter() - t) * 1000)
        for i in range(5):
            for name, c in clients:
                t = time.perf_counter()
                c.put_object(Bucket="bench", Key=f"{name}/big{i}", Body=big)
                m[name]["put"].append(time.perf_counter() - t)
                t = time.perf_counter()
                c.get_object(Bucket="bench", Key=f"{name}/big{i}")["Body"].read()
                m[name]["get"].append(time.perf_counter() - t)
        res = {}
        for name, _ in clients:
            lat, commit, put_s, get_s = m[name]["lat"], m[name]["commit"], m[name]["put"], m[name]["get"]
            res[name] = {"get_p50": statistics.median(lat), "get_p90": pct(lat, 90),
                         "commit_p50": statistics.median(commit), "commit_p90": pct(commit, 90),
                         "put_mibs": 16 / statistics.median(put_s), "get_mibs": 16 / statistics.median(get_s)}
        dr, px = res["direct"], res["proxy"]
        rows += [
            ("S3 GET 1 KiB p50 / p90 (ms)", f"{dr['get_p50']:.2f} / {dr['get_p90']:.2f}",
             f"{px['get_p50']:.2f} / {px['get_p90']:.2f}", f"+{px['get_p50'] - dr['get_p50']:.2f} ms at p50"),
            ("durable per-step commit: PUT 1 KiB IfNoneMatch p50 / p90 (ms)",
             f"{dr['commit_p50']:.2f} / {dr['commit_p90']:.2f}", f"{px['commit_p50']:.2f} / {px['commit_p90']:.2f}",
             f"x{px['commit_p50'] / dr['commit_p50']:.2f}"),
            ("PUT 16 MiB (MiB/s)", f"{dr['put_mibs']:.0f}", f"{px['put_mibs']:.0f}",
             f"{px['put_mibs'] / dr['put_mibs']:.2f} of direct"),
            ("GET 16 MiB (MiB/s)", f"{dr['get_mibs']:.0f}", f"{px['get_mibs']:.0f}",
             f"{px['get_mibs'] / dr['get_mibs']:.2f} of direct"),
        ]
    finally:
        proxy.stop()
        store.stop()
        shutil.rmtree(d, ignore_errors=True)


LEGACY_LAUNCH = r"""
exec unshare --mount --pid --fork --kill-child --mount-proc --propagation private /bin/sh -c '
mount -t tmpfs -o size=67108864,mode=0755 sandfleet-bench-ws "$1" || exit 98
cd "$1" && exec tini -s -g -- /bin/sh -c "echo up > $2"' sandfleet-init "$WS" "$OUT"
"""


def bench_sandboxes(rows: list, n: int = 20) -> None:
    """The bubblewrap sandbox beside the launcher it replaced (unshare + tmpfs + tini, run as root)."""
    import subprocess

    from fleet.sandbox import ProcessBackend, SandboxSpec

    async def main():
        be = ProcessBackend()
        d = Path(tempfile.mkdtemp(prefix="sfbench-sb-"))
        socks = {18000 + k: "127.0.0.1:9" for k in range(3)}  # the three service listeners a wave's sandbox gets
        starts, ready, kills, legacy = [], [], [], []
        for i in range(n):
            # the legacy launcher, interleaved so both see the same machine state
            ws, out = d / f"legacy{i}", d / f"legacy{i}.up"
            ws.mkdir()
            t = time.perf_counter()
            p = subprocess.Popen(["/bin/sh", "-c", LEGACY_LAUNCH], env={"WS": str(ws), "OUT": str(out),
                                                                        "PATH": "/usr/bin:/bin"})
            while not out.exists() and time.perf_counter() - t < 10:
                await asyncio.sleep(0.0005)
            legacy.append((time.perf_counter() - t) * 1000)
            p.wait(10)
            spec = SandboxSpec("w-bench", f"sb{i}", "t", 1,
                               ["/bin/sh", "-c", 'echo up > "$SANDFLEET_CHECKPOINT"; sleep 30'], {"PATH": "/usr/bin:/bin"},
                               str(d / f"sb{i}"), relays=socks)
            os.makedirs(spec.state_dir)
            t = time.perf_counter()
            sb = await be.start(spec)
            starts.append(sb.start_ms)
            while not (os.path.exists(spec.checkpoint_path) and os.path.getsize(spec.checkpoint_path)) \
                    and time.perf_counter() - t < 10:
                await asyncio.sleep(0.0005)
            ready.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            await be.kill(sb, 0.0, "bench")
            await be.wait(sb)
            await be.remove(sb)
            kills.append((time.perf_counter() - t) * 1000)
        shutil.rmtree(d, ignore_errors=True)
        return starts, ready, kills, legacy

    starts, ready, kills, legacy = asyncio.run(main())
    rows.append((f"process sandbox start() returns, n={n}: p50 / max (ms)",
                 f"{statistics.median(starts):.1f} / {max(starts):.1f}", "",
                 "tmpfs mounted + seeded, cgroups set, launcher placed in them"))
    rows.append((f"process sandbox until its command runs, n={n}: p50 / max (ms)",
                 f"{statistics.median(ready):.1f} / {max(ready):.1f}", "",
                 f"own netns with 3 service listeners + bwrap + setpriv + tini; x{statistics.median(ready) / statistics.median(legacy):.2f} of the "
                 f"replaced unshare launcher ({statistics.median(legacy):.1f} ms p50 in the same run)"))
    rows.append((f"process sandbox SIGKILL until cgroup empty + removed, n={n}: p50 / max (ms)",
                 f"{statistics.median(kills):.1f} / {max(kills):.1f}", "", ""))


def bench_model(rows: list, n: int = 600) -> None:
    """Model endpoint and effects service: added latency per call, keep-alive, no think time."""
    import http.client
    import json

    from fleet import workloads
    from fleet.effects import EffectsService
    from fleet.model_endpoint import ModelEndpoint
    from fleet.services import TaskRegistry

    reg = TaskRegistry()
    key = reg.register("t", 5, 40, "patch-repo")
    model = ModelEndpoint(reg).start()
    fx = EffectsService(reg).start()
    try:
        msgs = [{"role": "user", "content": "go"}]
        for i in range(20):
            msgs += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "apply_patch", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"}]
        body = json.dumps({"model": "m", "messages": msgs}).encode()
        eids = list(workloads.get("patch-repo").effect_steps(5, 40))
        for svc, path, payload in ((model, "/v1/chat/completions", lambda i: body),
                                   (fx, "/v1/effects", lambda i: json.dumps({"effect_id": eids[i % len(eids)]}).encode())):
            conn = http.client.HTTPConnection("127.0.0.1", svc.server.server_address[1])
            lat = []
            for i in range(n):
                t = time.perf_counter()
                conn.request("POST", path, payload(i), {"Authorization": f"Bearer {key}",
                                                        "Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                lat.append((time.perf_counter() - t) * 1000)
            conn.close()
            server = [(r["t_done"] - r["t"]) * 1000 for r in svc.log.snapshot() if "t_done" in r]
            name = "model endpoint: chat completion (20 tool results in messages)" if svc is model else \
                "effects service: POST /v1/effects"
            lat = lat[50:]
            rows.append((f"{name}, n={n}: client round trip p50 / p99 (ms)",
                         f"{statistics.median(lat):.2f} / {pct(lat, 99):.2f}", "",
                         f"server side p50 {statistics.median(server):.2f} ms" if server else "keep-alive, 1 client"))
    finally:
        model.stop()
        fx.stop()


def bench_waves(rows: list) -> None:
    from cluster.config import build_config
    from cluster.driver import WaveRun
    from cluster.raycluster import FleetSession

    fleet = FleetSession().start()
    root = Path(tempfile.mkdtemp(prefix="sfbench-waves-"))
    try:
        for tasks, faults in ((4, []), (8, []), (8, ["PK1", "ST1"])):
            cfg = build_config({"tasks": tasks, "concurrency": 4, "seed": 3, "faults": faults,
                                "workload": {"steps": 8, "think_ms": 150}})
            w = WaveRun(cfg, root, progress=False, fleet=fleet)
            t = time.perf_counter()
            r = w.run()
            wall = time.perf_counter() - t
            attempts = sum(g["attempts"] for g in r["tasks"])
            rows.append((f"wave: {tasks} durable tasks, concurrency 4, 8 steps x 150 ms think, "
                         f"faults {'+'.join(faults) or 'none'}",
                         f"{wall:.1f} s", "", f"verdict {r['verdict']}, {attempts} attempts"))
    finally:
        fleet.stop()
        shutil.rmtree(root, ignore_errors=True)


def bench_runners(rows: list) -> None:
    """Per-step time of each runner in an uninterrupted run, beside the durable reference (same seeds)."""
    from cluster.league import LeagueConfig, run_league

    runners = ["durable", "naive"]
    for name in ("openai_journal", "langgraph_s3", "langgraph_sqlite", "dbos_sqlite"):
        work = ROOT / "examples" / name
        if (work / ".venv" / "bin" / "python").exists():
            runners.append({"name": name, "command": ".venv/bin/python agent.py", "workdir": str(work)})
    root = Path(tempfile.mkdtemp(prefix="sfbench-runners-"))
    try:
        league = LeagueConfig(name="bench", runners=runners, fault_sets=[[]],
                              wave={"tasks": 2, "concurrency": 2, "seed": 13,
                                    "workload": {"steps": 10, "think_ms": 50}})
        out = run_league(league, root, progress=False)
        data = __import__("orjson").loads((out / "league.json").read_bytes())
        base = None
        for r in data["rows"]:
            xs = r["per_step_overhead_s"]
            if not xs:
                continue
            p50 = statistics.median(xs) * 1000
            base = base or p50
            rows.append((f"runner time per step, uninterrupted, 10 steps, think 50 ms: {r['runner']} (n={len(xs)})",
                         f"{p50:.0f} ms", "", f"x{p50 / base:.2f} of durable; start-up spread over the steps"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    rows: list = []
    bench_store(rows)
    bench_sandboxes(rows)
    bench_model(rows)
    bench_waves(rows)
    bench_runners(rows)
    table = ["| measurement | direct / value | through proxy | ratio / note |", "|---|---|---|---|"]
    table += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    text = ("# Benchmarks\n\nProduced by `make bench` (`python -m tests.bench.run`) on this machine kind "
            "(2 cores; client, store, proxy and sandboxes share them). One run, side by side.\n\n"
            f"Last run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n" + "\n".join(table) + "\n")
    (ROOT / "BENCHMARKS.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
