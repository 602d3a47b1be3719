"""`make bench`: side-by-side measurements in one run, written into BENCHMARKS.md.

- S3 through the fault proxy vs straight to the store vs HAProxy (HTTP mode, the production relay
  anchor), same client, same store: 1 KiB GET latency with keep-alive (the proxy also with 1,000 open
  rules that do not match), conditional 1 KiB PUT (the durable runner's per-step commit), 64 MiB PUT
  and GET throughput.
- Process sandbox start and kill latency.
- Wave wall time for N tasks (durable runner, no faults, then PK1+ST1).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class HAProxy:
    """HAProxy in HTTP mode on 127.0.0.1 in front of the store: the production relay anchor (Debian's
    `haproxy`, installed by `make bench`); started with its own config in a temp dir, stopped by PID."""

    def __init__(self, upstream_port: int, d: Path):
        import socket

        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            self.port = sk.getsockname()[1]
        self.cfg = d / "haproxy.cfg"
        self.cfg.write_text(
            "global\n  maxconn 512\n  tune.bufsize 262144\n"
            "defaults\n  mode http\n  timeout connect 5s\n  timeout client 120s\n  timeout server 120s\n"
            "  option http-keep-alive\n"
            f"frontend f\n  bind 127.0.0.1:{self.port}\n  default_backend b\n"
            f"backend b\n  server s1 127.0.0.1:{upstream_port}\n")
        self.proc = None

    def start(self) -> "HAProxy":
        import socket
        import subprocess

        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.cfg)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("haproxy did not listen")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        from storage.process import stop_process

        if self.proc is not None:
            stop_process(self.proc, 5)
            self.proc = None


def bench_store(rows: list) -> None:
    """Direct vs our proxy vs HAProxy, interleaved in one run: 1 KiB GET latency with keep-alive (our proxy
    also with 1,000 open rules on other prefixes), the durable runner's conditional 1 KiB commit, 64 MiB PUT
    and GET throughput."""
    from storage.proxy import ProxyProcess
    from storage.store import EmbeddedStore, s3_client

    d = Path(tempfile.mkdtemp(prefix="sfbench-"))
    store = EmbeddedStore(d / "store")
    t = time.perf_counter()
    ep = store.start()
    rows.append(("embedded store ready (weed mini)", f"{time.perf_counter() - t:.2f} s", "", ""))
    proxy = ProxyProcess(ep.url, str(d / "proxy.jsonl")).start()  # the compiled relay in front, where installed
    alone = ProxyProcess(ep.url, str(d / "proxy-alone.jsonl"), relay=False).start()  # the asyncio proxy alone
    ruled = ProxyProcess(ep.url, str(d / "proxy-ruled.jsonl")).start()  # the same proxy with 1,000 rules open
    ctl = ruled.control()
    for i in range(1000):  # rules that never match this traffic (other tasks' prefixes)
        ctl.open_rule(rule_id=f"other-{i}", bucket="bench", key_prefix=f"w/t{i:04d}/", fault="ST1")
    hap = None
    if shutil.which("haproxy"):
        import urllib.parse

        hap = HAProxy(urllib.parse.urlsplit(ep.url).port, d).start()
    try:
        paths = [("direct", s3_client(ep.url, ep.creds)), ("proxy", s3_client(proxy.url, ep.creds)),
                 ("proxy alone", s3_client(alone.url, ep.creds)), ("proxy+1000 rules", s3_client(ruled.url, ep.creds))]
        if hap is not None:
            paths.append(("haproxy", s3_client(hap.url, ep.creds)))
        paths[0][1].create_bucket(Bucket="bench")
        small = os.urandom(1024)
        big = os.urandom(64 * 1024 * 1024)
        paths[0][1].put_object(Bucket="bench", Key="small", Body=small)
        m = {name: {"lat": [], "commit": [], "put": [], "get": [], "curl": []} for name, _ in paths}
        curl = shutil.which("curl")
        for _, c in paths:
            for _ in range(30):  # warm up connections
                c.get_object(Bucket="bench", Key="small")["Body"].read()
        def cpu(pid: int) -> float:  # user+system seconds the process and its children (the relay) have used
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK") + sum(cpu(int(k)) for k in kids)

        pids = {"proxy": proxy.proc.pid, "proxy alone": alone.proc.pid, "proxy+1000 rules": ruled.proc.pid}
        if hap is not None:
            pids["haproxy"] = hap.proc.pid
        cpu0 = {k: cpu(v) for k, v in pids.items()}
        # interleaved, so every path sees the same machine state
        n_lat = 2000
        for _ in range(n_lat):
            for name, c in paths:
                t = time.perf_counter()
                c.get_object(Bucket="bench", Key="small")["Body"].read()
                m[name]["lat"].append((time.perf_counter() - t) * 1000)
        cpu_us = {k: (cpu(v) - cpu0[k]) / n_lat * 1e6 for k, v in pids.items()}
        big_paths = [p for p in paths if p[0] != "proxy+1000 rules"]
        for i in range(150):
            for name, c in big_paths:
                t = time.perf_counter()
                c.put_object(Bucket="bench", Key=f"{name}/journal/{i:04d}", Body=small, IfNoneMatch="*")
                m[name]["commit"].append((time.perf_counter() - t) * 1000)
        for i in range(4):
            for name, c in big_paths:
                t = time.perf_counter()
                c.put_object(Bucket="bench", Key=f"{name}/big{i}", Body=big)
                m[name]["put"].append(time.perf_counter() - t)
            for name, c in big_paths:
                t = time.perf_counter()
                c.get_object(Bucket="bench", Key=f"{name}/big{i}")["Body"].read()
                m[name]["get"].append(time.perf_counter() - t)
            for name, c in big_paths if curl else []:  # a compiled client: is boto3's Python the ceiling?
                url = c.generate_presigned_url("get_object", Params={"Bucket": "bench", "Key": f"{name}/big{i}"})
                t = time.perf_counter()
                subprocess.run([curl, "-sf", "-o", "/dev/null", url], check=True, timeout=60)
                m[name]["curl"].append(time.perf_counter() - t)
        r = {name: {"p50": statistics.median(v["lat"]), "p99": pct(v["lat"], 99),
                    "commit": statistics.median(v["commit"]) if v["commit"] else 0,
                    "put": 64 / statistics.median(v["put"]) if v["put"] else 0,
                    "get": 64 / statistics.median(v["get"]) if v["get"] else 0,
                    "curl": 64 / statistics.median(v["curl"]) if v["curl"] else 0}
             for name, v in m.items()}
        pr, pa = r["proxy+1000 rules"], r["proxy alone"]
        dr, px = r["direct"], r["proxy"]
        front = "relay in front" if proxy.relay_pid() else "no relay installed: the proxy alone"
        hp = r.get("haproxy")

        def ha(fmt):
            return fmt(hp) if hp else "haproxy not installed"
        rows += [
            (f"S3 GET 1 KiB, keep-alive, n={n_lat} interleaved: p50 / p99 (ms)", f"{dr['p50']:.2f} / {dr['p99']:.2f}",
             f"{px['p50']:.2f} / {px['p99']:.2f}",
             f"proxy ({front}) adds {px['p50'] - dr['p50']:+.2f} ms p50, {px['p99'] - dr['p99']:+.2f} ms p99; HAProxy "
             + ha(lambda h: f"{h['p50']:.2f} / {h['p99']:.2f} ({h['p50'] - dr['p50']:+.2f} ms p50)")
             + f"; the asyncio proxy alone {pa['p50']:.2f} / {pa['p99']:.2f} ({pa['p50'] - dr['p50']:+.2f} ms p50)"),
            ("same loop, a second proxy with 1,000 open rules on other prefixes: p50 / p99 (ms)", "",
             f"{pr['p50']:.2f} / {pr['p99']:.2f}",
             f"x{pr['p50'] / px['p50']:.2f} of the proxy with no rule open (p50), x{pr['p99'] / px['p99']:.2f} (p99)"),
            (f"relay CPU per 1 KiB GET (user+system, n={n_lat}, µs)", "",
             f"{cpu_us['proxy']:.0f} (alone: {cpu_us['proxy alone']:.0f}; with 1,000 rules open on other tasks' "
             f"prefixes, which leave this traffic on the relay: {cpu_us['proxy+1000 rules']:.0f})",
             "HAProxy " + (f"{cpu_us['haproxy']:.0f}: proxy x{cpu_us['proxy'] / max(cpu_us['haproxy'], 1e-9):.2f}, "
                           f"alone x{cpu_us['proxy alone'] / max(cpu_us['haproxy'], 1e-9):.2f}"
                           if "haproxy" in cpu_us else "not installed")),
            ("durable per-step commit: PUT 1 KiB IfNoneMatch p50 (ms)", f"{dr['commit']:.2f}", f"{px['commit']:.2f}",
             f"x{px['commit'] / dr['commit']:.2f}; HAProxy " + ha(lambda h: f"{h['commit']:.2f} "
                                                                    f"(x{h['commit'] / dr['commit']:.2f})")),
            ("PUT 64 MiB (MiB/s), median of 4", f"{dr['put']:.0f}", f"{px['put']:.0f}",
             f"{px['put'] / dr['put']:.2f} of direct (over 1 MiB: streamed by the asyncio proxy); alone "
             f"{pa['put'] / dr['put']:.2f}; HAProxy " + ha(lambda h: f"{h['put']:.0f} "
                                                           f"({h['put'] / dr['put']:.2f} of direct)")),
            ("GET 64 MiB (MiB/s), median of 4", f"{dr['get']:.0f}", f"{px['get']:.0f}",
             f"{px['get'] / dr['get']:.2f} of direct; alone {pa['get'] / dr['get']:.2f}; HAProxy "
             + ha(lambda h: f"{h['get']:.0f} ({h['get'] / dr['get']:.2f} of direct)")),
        ]
        if dr["curl"]:
            rows.append(("GET 64 MiB by curl, a compiled client, presigned (MiB/s), median of 4", f"{dr['curl']:.0f}",
                         f"{px['curl']:.0f}", f"{px['curl'] / dr['curl']:.2f} of direct; alone "
                         f"{pa['curl'] / dr['curl']:.2f}; HAProxy "
                         + ha(lambda h: f"{h['curl']:.0f} ({h['curl'] / dr['curl']:.2f} of direct)")))
    finally:
        if hap is not None:
            hap.stop()
        ruled.stop()
        alone.stop()
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


def _conversation(tool: str | None, tools: list | None, turns: int = 20) -> bytes:
    """A request at step 20 in one dialect: tool calls of `tool` and their results, or (no tool) a text agent's
    fenced-block instructions and observation turns."""
    import json

    if tool is None:
        msgs = [{"role": "system", "content": "Answer with one ```bash block```."}, {"role": "user", "content": "go"}]
        for _ in range(turns):
            msgs += [{"role": "assistant", "content": "```bash\ntrue\n```"}, {"role": "user", "content": "exit 0"}]
    else:
        msgs = [{"role": "user", "content": "go"}]
        for i in range(turns):
            msgs += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": tool, "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"}]
    return json.dumps({"model": "m", "messages": msgs, **({"tools": tools} if tools else {})}).encode()


def _api_conversation(api: str, turns: int = 20) -> bytes:
    """A request at step 20 in the Messages or the Responses API, declaring the workload's tools."""
    import json

    from fleet import workloads

    fns = [t["function"] for t in workloads.get("patch-repo").tools()]
    if api == "messages":
        msgs = [{"role": "user", "content": "go"}]
        for i in range(turns):
            msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "apply_patch",
                                                        "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"}]}]
        return json.dumps({"model": "m", "max_tokens": 1024, "messages": msgs, "tools": [
            {"name": f["name"], "input_schema": f["parameters"]} for f in fns]}).encode()
    items = [{"role": "user", "content": "go"}]
    for i in range(turns):
        items += [{"type": "function_call", "call_id": f"c{i}", "name": "apply_patch", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"c{i}", "output": "ok"}]
    return json.dumps({"model": "m", "input": items, "tools": [
        {"type": "function", "name": f["name"], "parameters": f["parameters"]} for f in fns]}).encode()


def bench_model(rows: list, n: int = 600) -> None:
    """Model endpoint and effects service: added latency per call, keep-alive, no think time."""
    import http.client
    import json

    from fleet import workloads
    from fleet.effects import EffectsService
    from fleet.model_endpoint import ModelEndpoint
    from fleet.services import TaskRegistry

    from fleet import services

    # the per-key rate limit (50/s, bursts of 100) would answer most of these back-to-back calls 429: what is
    # measured is a served call, so it is lifted for this bench (every answer is asserted 200 below)
    services.RATE_PER_KEY = services.BURST_PER_KEY = 1e9
    reg = TaskRegistry()
    key = reg.register("t", 5, 40, "patch-repo")
    model = ModelEndpoint(reg).start()
    fx = EffectsService(reg).start()
    try:
        bash = {"type": "function", "function": {"name": "bash", "parameters": {
            "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
        eids = list(workloads.get("patch-repo").effect_steps(5, 40))
        cases = [("model endpoint, tools dialect: chat completion (20 tool results in messages)", "tools", model,
                  "/v1/chat/completions", _conversation("apply_patch", None)),
                 ("model endpoint, shell dialect: chat completion (one bash tool, 20 of its results)", "shell", model,
                  "/v1/chat/completions", _conversation("bash", [bash])),
                 ("model endpoint, text dialect: chat completion (a fenced block, 20 observation turns)", "text",
                  model, "/v1/chat/completions", _conversation(None, None)),
                 ("model endpoint, Anthropic Messages: POST /v1/messages (workload tools, 20 tool_result turns)",
                  "messages", model, "/v1/messages", _api_conversation("messages")),
                 ("model endpoint, OpenAI Responses: POST /v1/responses (workload tools, 20 function_call_output "
                  "items)", "responses", model, "/v1/responses", _api_conversation("responses")),
                 ("effects service: POST /v1/effects", None, fx, "/v1/effects", None)]
        for name, dialect, svc, path, body in cases:
            conn = http.client.HTTPConnection("127.0.0.1", svc.server.server_address[1])
            lat = []
            mark = len(svc.log.snapshot())
            for i in range(n):
                payload = body if body is not None else json.dumps({"effect_id": eids[i % len(eids)]}).encode()
                t = time.perf_counter()
                conn.request("POST", path, payload, {"Authorization": f"Bearer {key}",
                                                     "Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                assert r.status == 200, (name, r.status)
                lat.append((time.perf_counter() - t) * 1000)
            conn.close()
            logged = svc.log.snapshot()[mark:]
            if dialect:
                assert {r.get("dialect") for r in logged} == {dialect}, (name, {r.get("dialect") for r in logged})
            server = [(r["t_done"] - r["t"]) * 1000 for r in logged[50:] if "t_done" in r]
            lat = lat[50:]
            rows.append((f"{name}, n={n}: client round trip p50 / p99 (ms)",
                         f"{statistics.median(lat):.2f} / {pct(lat, 99):.2f}", "",
                         f"server side p50 / p99 {statistics.median(server):.2f} / {pct(server, 99):.2f} ms"
                         if server else "keep-alive, 1 client"))
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
    for name in ("openai_journal", "langgraph_s3", "langgraph_sqlite", "dbos_sqlite",  # our tools, on a framework
                 "mini_swe_agent", "openai_agents_sdk", "pydantic_ai"):  # unmodified agents, the model's dialects
        work = ROOT / "examples" / name
        script = "agent.py" if (work / "agent.py").exists() else "run.py"
        if (work / ".venv" / "bin" / "python").exists():
            runners.append({"name": name, "command": f".venv/bin/python {script}", "workdir": str(work)})
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
    if "--store-only" in sys.argv:
        for row in rows:
            print(" | ".join(row))
        return
    bench_sandboxes(rows)
    bench_model(rows)
    bench_waves(rows)
    bench_runners(rows)
    table = ["| measurement | direct / value | through proxy | ratio / note |", "|---|---|---|---|"]
    table += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    text = ("# Benchmarks\n\nProduced by `make bench` (`python -m tests.bench.run`) on this machine kind "
            "(2 cores; client, store, proxy and sandboxes share them). One run, side by side.\n\n"
            f"Last run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n" + "\n".join(table) + "\n")
    old = (ROOT / "BENCHMARKS.md").read_text() if (ROOT / "BENCHMARKS.md").exists() else ""
    if "<!-- scale -->" in old:  # the scale section (tests/bench/scale.py) is kept
        text += "\n<!-- scale -->" + old.split("<!-- scale -->", 1)[1]
    (ROOT / "BENCHMARKS.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
