"""Per-attempt store keys, A/B in one process on one real weed: the driver's CPU for one issue + revoke with one
probe client per key change (now) and with a boto3 client built for every probe (before c9adff2).

`python -m tests.bench.keys_ab` (prints its rows; BENCHMARKS.md "Harness cost" quotes them)."""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(n: int = 20) -> None:
    sys.path.insert(0, str(ROOT))
    from storage.keys import ScopedKeys
    from storage.store import EmbeddedStore, ensure_bucket

    d = Path(tempfile.mkdtemp(prefix="sfkeys-"))
    store = EmbeddedStore(d)
    ep = store.start()
    new = ScopedKeys._prober

    def per_probe(self, creds):
        return lambda bucket, key: self._probe(self.store.endpoint.client(creds=creds, max_attempts=1,
                                                                           connect_timeout=1, read_timeout=5),
                                               bucket, key)

    try:
        ensure_bucket(ep, "sfkeys-bench")
        keys = ScopedKeys(store, ep.creds)
        for name, fn in (("one probe client per key change", new), ("a client per probe", per_probe),
                         ("one probe client per key change", new)):
            ScopedKeys._prober = fn
            c0, w0 = time.process_time(), time.perf_counter()
            for i in range(n):
                keys.issue(f"o{i}", "sfkeys-bench", f"w/t{i}/")
                keys.revoke(f"o{i}")
            print(f"| per-attempt key issue + revoke, driver CPU ({name}, n={n}) | "
                  f"{(time.process_time() - c0) / n * 1000:.1f} ms | {(time.perf_counter() - w0) / n * 1000:.1f} ms wall |")
    finally:
        ScopedKeys._prober = new
        store.stop(grace_s=0)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
