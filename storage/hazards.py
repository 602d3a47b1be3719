"""Store hazards a durable runner must survive, reproduced against the real store.

`python -m storage.hazards` starts an embedded SeaweedFS (or uses --url with --access-key/--secret-key)
and shows the empty-object hazard (docs/store-hazards.md): a PUT whose head reached the store but whose
body never did becomes an EMPTY object when its connection closes, even over a newer complete PUT of the
same key. Exit 0 when the hazard shows (the store behaves as documented), 1 when it does not.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import socket
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path


def signed_put_head(url: str, creds, bucket: str, key: str, body: bytes, region: str = "us-east-1") -> bytes:
    """The head of a SigV4-signed PUT, as a client sends it before its body."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCreds

    req = AWSRequest(method="PUT", url=f"{url}/{bucket}/{key}", data=body,
                     headers={"x-amz-content-sha256": hashlib.sha256(body).hexdigest(),
                              "Content-Length": str(len(body))})
    S3SigV4Auth(BotoCreds(creds.access_key, creds.secret_key), "s3", region).add_auth(req)
    host = urllib.parse.urlsplit(url).netloc
    lines = [f"PUT /{bucket}/{key} HTTP/1.1", f"Host: {host}"] + [f"{k}: {v}" for k, v in req.headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def head_only_put_then_full_put(url: str, creds, bucket: str, key: str, read_url: str | None = None,
                                settle_s: float = 5.0) -> bytes:
    """A writer sends a PUT's head and dies before its body; a second writer PUTs the complete record; then
    the first writer's connection closes. Returns what the store holds under `key` `settle_s` later."""
    from storage.store import s3_client

    body = b"x" * 137
    u = urllib.parse.urlsplit(url)
    s = socket.create_connection((u.hostname, u.port))
    s.sendall(signed_put_head(url, creds, bucket, key, body))  # the first writer dies before its body
    time.sleep(0.3)
    s3_client(url, creds).put_object(Bucket=bucket, Key=key, Body=b"complete record")  # the next writer
    time.sleep(0.3)
    s.close()  # the dead writer's connection goes away after the good write
    time.sleep(settle_s)
    return s3_client(read_url or url, creds).get_object(Bucket=bucket, Key=key)["Body"].read()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="an existing S3 endpoint (default: start an embedded SeaweedFS)")
    ap.add_argument("--access-key")
    ap.add_argument("--secret-key")
    ap.add_argument("--bucket", default="sandfleet-hazard")
    args = ap.parse_args(argv)
    from storage.credentials import Credentials
    from storage.store import EmbeddedStore, s3_client

    store = workdir = None
    try:
        if args.url:
            url, creds = args.url, Credentials(args.access_key, args.secret_key)
        else:
            workdir = Path(tempfile.mkdtemp(prefix="sandfleet-hazard-"))
            store = EmbeddedStore(workdir)
            ep = store.start()
            url, creds = ep.url, ep.creds
        try:
            s3_client(url, creds).create_bucket(Bucket=args.bucket)
        except Exception:  # noqa: BLE001 - it may exist
            pass
        got = head_only_put_then_full_put(url, creds, args.bucket, f"hazard-{int(time.time())}")
    finally:
        if store is not None:
            store.stop()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"after a head-only PUT, a complete PUT of b'complete record', and the first connection closing, "
          f"the store holds {got!r}")
    if got == b"":
        print("HAZARD SHOWN: the newer complete write was replaced by an empty object")
        return 0
    print("no hazard: the newer write survived")
    return 1


if __name__ == "__main__":
    sys.exit(main())
