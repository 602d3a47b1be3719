"""Per-attempt store keys, A/B in one process on one real weed: the driver's CPU and the store's (weed's own, from
/proc) for one issue + revoke, probing each key change three ways: a boto3 client built for every probe (before
c9adff2), one boto3 client per key change (c9adff2), and a GET signed by hand on one plain connection (now). Also
the store's CPU for one identities reload alone (SIGHUP) and for one probe, to say what batching the reloads could
save.

`python -m tests.bench.keys_ab` (prints its rows; BENCHMARKS.md "Harness cost" quotes them)."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text()
    f = f[f.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / TICK


def main(n: int = 40) -> None:
    sys.path.insert(0, str(ROOT))
    from storage import keys as keys_mod
    from storage.keys import ScopedKeys
    from storage.store import EmbeddedStore, ensure_bucket

    class BotoProbe:
        """The probe as it was: boto3 get_object with the key; `per_probe` builds the client on every call."""

        def __init__(self, endpoint, creds, bucket, key, per_probe):
            make = lambda: endpoint.client(creds=creds, max_attempts=1, connect_timeout=1, read_timeout=5)  # noqa: E731
            self.make, self.per_probe, self.client = make, per_probe, None if per_probe else make()
            self.bucket, self.key = bucket, key

        def __call__(self, deadline=None):  # (the answers of storage/keys.py's probe)
            import botocore.exceptions
            try:
                (self.make() if self.per_probe else self.client).get_object(Bucket=self.bucket, Key=self.key)
                return "ok"
            except botocore.exceptions.ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                return {"NoSuchKey": "ok", "InvalidAccessKeyId": "unknown", "SignatureDoesNotMatch": "denied",
                        "AccessDenied": "denied"}.get(code, "unsure")

        def close(self):
            pass

    d = Path(tempfile.mkdtemp(prefix="sfkeys-"))
    store = EmbeddedStore(d)
    ep = store.start()
    new = ScopedKeys._prober
    ways = (("a boto3 client per probe", lambda self, c, b, k: BotoProbe(ep, c, b, k, True)),
            ("one boto3 client per key change", lambda self, c, b, k: BotoProbe(ep, c, b, k, False)),
            ("a signed GET on one connection (now)", new))
    try:
        ensure_bucket(ep, "sfkeys-bench")
        keys = ScopedKeys(store, ep.creds)
        for i in range(16):  # the slots of a wave at concurrency 16, so each reload reads a file of that size
            keys.issue(f"held{i}", "sfkeys-bench", f"w/held{i}/")
        for name, fn in ways:
            ScopedKeys._prober = fn
            w, c0, w0 = _cpu(store.proc.pid), time.process_time(), time.perf_counter()
            for i in range(n):
                keys.issue(f"o{i}", "sfkeys-bench", f"w/t{i}/")
                keys.revoke(f"o{i}")
            print(f"| per-attempt key issue + revoke ({name}, n={n}) | driver {(time.process_time() - c0) / n * 1000:.1f} "
                  f"ms CPU | store {(_cpu(store.proc.pid) - w) / n * 1000:.1f} ms CPU | "
                  f"{(time.perf_counter() - w0) / n * 1000:.1f} ms wall |")
        ScopedKeys._prober = new
        time.sleep(1)
        w = _cpu(store.proc.pid)
        for _ in range(n):
            store.reload_identities()
            time.sleep(0.05)
        print(f"| the store's CPU for one reload of the identities (SIGHUP, 17 identities, n={n}) | "
              f"{(_cpu(store.proc.pid) - w) / n * 1000:.1f} ms | | |")
        probe = keys_mod._Probe(ep.url, ep.region, ep.creds, "sfkeys-bench", "none")
        w, c0 = _cpu(store.proc.pid), time.process_time()
        for _ in range(10 * n):
            probe()
        probe.close()
        print(f"| one key probe (n={10 * n}) | driver {(time.process_time() - c0) / n * 100:.2f} ms CPU | "
              f"store {(_cpu(store.proc.pid) - w) / n * 100:.2f} ms CPU | |")
    finally:
        ScopedKeys._prober = new
        store.stop(grace_s=0)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
