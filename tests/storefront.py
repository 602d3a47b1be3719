"""The embedded store with one bucket, and the fault proxy (with its relay, unless told) in front of it, as the
proxy's integration tests start them (test_request_smuggling.py, test_store_quota.py)."""
from __future__ import annotations

import contextlib
from pathlib import Path

from storage.proxy import ProxyProcess
from storage.store import EmbeddedStore, s3_client


def bucket_store(tmp_path_factory, name: str, bucket: str):
    """A module fixture's body (`yield from`): a store in a fresh temporary dir `name` with `bucket` made; yields
    (its endpoint, the dir), stops it after."""
    d = tmp_path_factory.mktemp(name)
    store = EmbeddedStore(d / "store")
    ep = store.start()
    s3_client(ep.url, ep.creds).create_bucket(Bucket=bucket)
    yield ep, d
    store.stop()


@contextlib.contextmanager
def fault_proxy(ep, log: Path, **kw):
    """A proxy in front of the store `ep` that merges slashes as the store does, stopped by PID however the test
    ends; `kw` as ProxyProcess takes them (relay, quota)."""
    proxy = ProxyProcess(ep.url, str(log), merge_slashes=True, **kw).start()
    try:
        yield proxy
    finally:
        proxy.stop()
