"""The end-of-wave store audit at scale, and weed's memory under a flood (issue 42, item 3).

One real `weed mini` (the embedded store, as a wave starts it). A flood writes `--objects` small objects (64-byte
bodies, keys spread over 10 task prefixes, 8 writer threads, boto3, straight to the store) while weed's RSS is
sampled; for each object the flood also writes the JSON line the proxy would log for that PUT (method, key, size,
the payload's sha256), so the audit matches every object against its write as in a wave. Then the audit runs in a
child process of its own (so its peak RSS, `ru_maxrss`, is the audit's alone, the interpreter and minio included):
once reading every object back (`max_objects` = all), once with the default cap (a seeded sample of 10,000), and
once on an empty prefix (the child's baseline). Last, what the quota costs a writer: `--proxy-puts` 1 KiB PUTs (one
boto3 client, one connection) through the proxy with its compiled relay in front, without a quota (the relay
relays them) and with one (every write handed to the proxy, which counts it).

`flock /run/sandfleet-test-suite.lock python -m tests.bench.audit --objects 100000` (prints the rows BENCHMARKS.md
"Store audit and flood" quotes)."""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "sf-bench-audit"
WAVE = "wbench"
TASKS = [f"t{i:03d}" for i in range(10)]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _child(args: argparse.Namespace) -> None:
    """The audit alone, in this process: prints {"s", "maxrss_mib", "listed", "checked", "findings"}."""
    sys.path.insert(0, str(ROOT))
    from cluster import results
    from storage.audit import audit, client_for

    t0 = time.perf_counter()
    log = results.read_jsonl(Path(args.log), skip_bad=True) if args.log else None
    mc = client_for(args.url, args.access_key, os.environ["BENCH_SECRET"])
    out = audit(mc, BUCKET, args.wave, TASKS, log, abort=False, max_objects=args.max_objects, seed=7,
                shared=True)
    print(orjson.dumps({"s": round(time.perf_counter() - t0, 2),
                        "maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                        "listed": out["objects_listed"], "checked": out["objects_checked"],
                        "findings": len(out["findings"])}).decode())


def _audit_in_child(ep, log: Path | None, max_objects: int, wave: str = WAVE) -> dict:
    argv = [sys.executable, "-m", "tests.bench.audit", "--child", "--url", ep.url, "--access-key",
            ep.creds.access_key, "--max-objects", str(max_objects), "--wave", wave]
    if log is not None:
        argv += ["--log", str(log)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=3600, cwd=ROOT,
                       env=dict(os.environ, BENCH_SECRET=ep.creds.secret_key))
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    return orjson.loads(p.stdout.strip().splitlines()[-1])


def _proxy_puts(ep, work: Path, n: int) -> None:
    from storage.proxy import ProxyProcess
    from storage.store import s3_client

    for label, quota in (("no quota (relay relays the PUTs)", None), ("quota on (every PUT to the proxy)",
                                                                      (10**6, 1 << 40))):
        proxy = ProxyProcess(ep.url, str(work / f"proxy-{bool(quota)}.jsonl"), merge_slashes=True,
                             quota=quota).start()
        try:
            c = s3_client(proxy.url, ep.creds)
            body = b"q" * 1024
            for i in range(50):  # warm: the connection, the relay's thread
                c.put_object(Bucket=BUCKET, Key=f"wput/t000/warm{i}", Body=body)
            lat = []
            for i in range(n):
                t = time.perf_counter()
                c.put_object(Bucket=BUCKET, Key=f"wput/t{int(bool(quota))}/k{i:06d}", Body=body)
                lat.append(time.perf_counter() - t)
            lat.sort()
            stats = proxy.control().stats()
            print(f"1 KiB PUT through the proxy, {label}: p50 {lat[n // 2] * 1000:.2f} ms, p99 "
                  f"{lat[int(n * 0.99)] * 1000:.2f} ms, {n / sum(lat):.0f}/s; relayed by the relay: "
                  f"{stats['relayed']}")
        finally:
            proxy.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=100000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--url")
    ap.add_argument("--access-key")
    ap.add_argument("--log")
    ap.add_argument("--wave", default=WAVE)
    ap.add_argument("--max-objects", type=int, default=10000)
    ap.add_argument("--proxy-puts", type=int, default=2000)
    args = ap.parse_args()
    if args.child:
        return _child(args)
    sys.path.insert(0, str(ROOT))
    from storage.store import EmbeddedStore, s3_client

    work = Path(tempfile.mkdtemp(prefix="sf-bench-audit-"))
    store = EmbeddedStore(work / "store")
    try:
        ep = store.start()
        pid = store.proc.pid
        s3_client(ep.url, ep.creds).create_bucket(Bucket=BUCKET)
        rss = [(0, round(_rss_mib(pid), 1))]
        log_path = work / "proxy-requests.jsonl"
        lines: list[bytes] = []
        lock = threading.Lock()
        done = [0]
        marks = sorted({m for m in (1000, 10000, 25000, 50000, args.objects) if m <= args.objects})

        clients = [s3_client(ep.url, ep.creds) for _ in range(args.threads)]  # (made here: not thread-safe)

        def writer(w: int) -> None:
            c = clients[w]
            for i in range(w, args.objects, args.threads):
                key = f"{WAVE}/{TASKS[i % len(TASKS)]}/flood/{i:07d}"
                body = (b"%07d" % i) * 9 + b"x"  # 64 bytes
                c.put_object(Bucket=BUCKET, Key=key, Body=body)
                line = orjson.dumps({"t": time.time(), "method": "PUT", "bucket": BUCKET, "key": key, "part": None,
                                     "upload_id": None, "status": 200, "req_bytes": len(body),
                                     "sha": hashlib.sha256(body).hexdigest()}) + b"\n"
                with lock:
                    lines.append(line)
                    done[0] += 1

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.threads) as ex:
            futs = [ex.submit(writer, w) for w in range(args.threads)]
            pending = list(marks)
            while pending and not all(f.done() for f in futs):
                time.sleep(0.2)
                while pending and done[0] >= pending[0]:
                    rss.append((pending.pop(0), round(_rss_mib(pid), 1)))
            for f in futs:
                f.result()
        flood_s = time.perf_counter() - t0
        if pending:
            rss.append((done[0], round(_rss_mib(pid), 1)))
        log_path.write_bytes(b"".join(lines))
        time.sleep(5)
        settled = round(_rss_mib(pid), 1)
        print(f"flood: {args.objects} objects in {flood_s:.1f} s ({args.objects / flood_s:.0f}/s, {args.threads} "
              f"threads); weed RSS MiB by objects written: {rss}; 5 s after: {settled}")
        base = _audit_in_child(ep, None, 10000, wave="nothing-here")
        print(f"audit baseline (empty prefix): {base}")
        sampled = _audit_in_child(ep, log_path, 10000)
        print(f"audit, cap 10000 (seeded sample): {sampled}; weed RSS after: {_rss_mib(pid):.1f} MiB")
        whole = _audit_in_child(ep, log_path, args.objects)
        print(f"audit, every object: {whole}; weed RSS after: {_rss_mib(pid):.1f} MiB")
        print(f"per object read back: {(whole['s'] - sampled['s']) / max(1, args.objects - 10000) * 1000:.2f} ms "
              f"(the difference of the two audits over the objects only the whole one read)")
        _proxy_puts(ep, work, args.proxy_puts)
    finally:
        store.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
