"""The per-task store quota (storage/quota.py) on real SeaweedFS: enforced at the fault proxy as a real S3 error a
runner reads (403 QuotaExceeded through boto3), never bypassed through the compiled relay in front of it, and a
task that hit it is graded so (`within_store_quota`), never a silent pass."""
from __future__ import annotations

import socket
import sys
from pathlib import Path

import botocore.exceptions
import orjson
import pytest

from cluster import results
from cluster.grade import exit_code
from storage import relay
from storage.store import s3_client
from tests.storefront import bucket_store, fault_proxy

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FLOOD = str(ROOT / "tests" / "runners" / "store_flood.py")
B = "sf-quota"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    yield from bucket_store(tmp_path_factory, "quota", B)


def _code(exc_info) -> tuple[int, str]:
    r = exc_info.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]


@pytest.mark.parametrize("front", [
    pytest.param("relay", marks=pytest.mark.skipif(relay.binary() is None, reason="sandfleet-relay not installed")),
    "alone"])
def test_writes_past_the_quota_get_403_quota_exceeded_through_either_front(store, front):
    """The compiled relay relays plain requests itself while no rule is open: with a quota on, every write must
    still reach the proxy's count (a relay that relayed writes let this flood through)."""
    ep, d = store
    log = d / f"proxy-{front}.jsonl"
    with fault_proxy(ep, log, relay=front == "relay", quota=(5, 64 * 1024)) as proxy:
        c = s3_client(proxy.url, ep.creds, max_attempts=1)
        c.list_objects_v2(Bucket=B, Prefix=f"w{front}/t000/")
        for i in range(5):
            c.put_object(Bucket=B, Key=f"w{front}/t000/k{i}", Body=b"x" * 100)
        with pytest.raises(botocore.exceptions.ClientError) as e:
            c.put_object(Bucket=B, Key=f"w{front}/t000/k5", Body=b"x")
        assert _code(e) == (403, "QuotaExceeded")
        assert "5 objects" in e.value.response["Error"]["Message"]
        c.put_object(Bucket=B, Key=f"w{front}/t000/k0", Body=b"y" * 200)  # an overwrite holds no new object
        c.put_object(Bucket=B, Key=f"w{front}/t001/k0", Body=b"x")  # another task: its own quota
        with pytest.raises(botocore.exceptions.ClientError) as e:  # bytes: 64 KiB a task
            c.put_object(Bucket=B, Key=f"w{front}/t001/big", Body=b"z" * (65 * 1024))
        assert _code(e) == (403, "QuotaExceeded")
        with pytest.raises(botocore.exceptions.ClientError):  # the store never got the refused object
            s3_client(ep.url, ep.creds).head_object(Bucket=B, Key=f"w{front}/t001/big")
        c.delete_objects(Bucket=B, Delete={"Objects": [{"Key": f"w{front}/t000/k{i}"} for i in range(2)]})
        for k in ("k5", "k6"):  # the room the DeleteObjects freed: full again
            c.put_object(Bucket=B, Key=f"w{front}/t000/{k}", Body=b"x")
        # a hand-made keep-alive connection: a read the relay serves itself, then a write on the same connection
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
            s.sendall(f"GET /{B}/w{front}/t000/k5 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert s.recv(65536).startswith(b"HTTP/1.1 ")
            s.sendall(f"PUT /{B}/w{front}/t000/k7 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx".encode())
            answer = s.recv(65536)
            assert answer.startswith(b"HTTP/1.1 403 ") and b"<Code>QuotaExceeded</Code>" in answer, answer
        proxy.control().flush()
        lines = [orjson.loads(x) for x in log.read_bytes().splitlines()]
        refused = [r for r in lines if r.get("quota")]
        assert [r["key"] for r in refused] == [f"w{front}/t000/k5", f"w{front}/t001/big", f"w{front}/t000/k7"]
        assert refused[0]["code"] == "QuotaExceeded" and refused[0]["quota"]["objects"] == 5
        assert proxy.control().stats()["quota_refused"] == 3


def test_a_runner_that_floods_past_its_quota_gets_the_s3_error_and_the_wave_grades_it(run_wave):
    result, d = run_wave(runner={"name": "store-flood", "command": [sys.executable, FLOOD]}, tasks=1,
                         concurrency=1, seed=42, workload={"steps": 3, "think_ms": 20}, deadline_s=120,
                         store={"quota_objects": 40, "quota_mb": 8})
    logs = "\n".join(p.read_text(errors="replace") for p in results.ResultsDir(d).runner_logs("t000"))
    assert "then 403 QuotaExceeded" in logs, logs[-2000:]
    assert "flood: deleted" in logs, logs[-2000:]
    g = next(g for g in result["tasks"] if g["task_id"] == "t000")
    c = g["checks"]["within_store_quota"]
    assert c["verdict"] == "fail" and c["refused"] >= 1 and "QuotaExceeded" in c["detail"], c
    assert g["checks"]["completed"]["verdict"] == "pass", g["checks"]["completed"]  # the flood's room was freed
    assert g["verdict"] == "fail" and "within_store_quota" in (g["signature"] or ""), (g["verdict"], g["signature"])
    ref = next(r for r in result["references"])
    assert ref["checks"]["within_store_quota"]["verdict"] == "pass"  # the same runner, no flood
    assert exit_code(result) == 1
    logged = results.read_jsonl(Path(d) / results.PROXY_REQUESTS)
    assert any(r.get("quota") and r.get("status") == 403 for r in logged)
    summary = (Path(d) / results.SUMMARY).read_text()
    assert "within_store_quota" in summary
    assert "objects checked" in summary  # the audit says how many of how many it read


def _swap(c, op: str, headers: dict | None = None, body: bytes | None = None) -> None:
    """Make `c`'s next requests of `op` carry `headers` (and `body`), signed as sent: what a hand-made runner does."""
    def hook(request, **_):
        for k, v in (headers or {}).items():
            if k in request.headers:
                del request.headers[k]  # (setting a header appends one)
            request.headers[k] = v
        if body is not None:
            request.data = body
            for k in [k for k in request.headers if k.lower().startswith(("content-md5", "content-length",
                                                                            "x-amz-checksum", "x-amz-sdk-checksum"))]:
                del request.headers[k]
    c.meta.events.register(f"before-sign.s3.{op}", hook)


@pytest.mark.parametrize("front", [
    pytest.param("relay", marks=pytest.mark.skipif(relay.binary() is None, reason="sandfleet-relay not installed")),
    "alone"])
def test_copies_plain_puts_and_delete_objects_count_what_seaweedfs_applies(store, front):
    """Findings 2a-2d on the real store: a copy counted 0 bytes, a non-canonical copy source was read otherwise, a
    claimed decoded length under-counted a plain PUT, and a DeleteObjects with two Keys in one Object freed room
    for an object the store kept. Each now counts what SeaweedFS holds, or is refused with an S3 error first."""
    ep, d = store
    w = f"c{front}"
    log = d / f"proxy-copies-{front}.jsonl"
    direct = s3_client(ep.url, ep.creds)

    def held(prefix: str) -> dict:
        return {o["Key"]: o["Size"] for o in direct.list_objects_v2(Bucket=B, Prefix=prefix).get("Contents", [])}

    with fault_proxy(ep, log, relay=front == "relay", quota=(3, 8 * 1024)) as proxy:
        c = s3_client(proxy.url, ep.creds, max_attempts=1)
        c.put_object(Bucket=B, Key=f"{w}/t001/src", Body=b"s" * 3072)  # another task's object
        # 2a: each copy counts its source's 3 KiB (it counted 0: a task could copy past its bytes for free)
        for k in ("c1", "c2"):
            c.copy_object(Bucket=B, Key=f"{w}/t000/{k}", CopySource=f"{B}/{w}/t001/src")
        with pytest.raises(botocore.exceptions.ClientError) as e:
            c.copy_object(Bucket=B, Key=f"{w}/t000/c3", CopySource=f"{B}/{w}/t001/src")
        assert _code(e) == (403, "QuotaExceeded")
        assert sum(held(f"{w}/t000/").values()) <= 8 * 1024
        # a part copy counts its range (SeaweedFS answers 416 InvalidRange past the source: nothing is counted)
        up = c.create_multipart_upload(Bucket=B, Key=f"{w}/t002/mp")["UploadId"]
        c.upload_part_copy(Bucket=B, Key=f"{w}/t002/mp", UploadId=up, PartNumber=1, CopySource=f"{B}/{w}/t001/src",
                           CopySourceRange="bytes=1024-2047")
        with pytest.raises(botocore.exceptions.ClientError) as e:
            c.upload_part_copy(Bucket=B, Key=f"{w}/t002/mp", UploadId=up, PartNumber=2,
                               CopySource=f"{B}/{w}/t001/src", CopySourceRange="bytes=1024-99999999")
        assert _code(e)[1] == "InvalidRange"
        proxy.control().flush()
        parts = [orjson.loads(x) for x in log.read_bytes().splitlines() if b"t002/mp" in x]
        assert [(r["part"], r["status"], r.get("stored")) for r in parts if r.get("part")] == [(1, 200, 1024),
                                                                                               (2, 416, 2048)]
        c.abort_multipart_upload(Bucket=B, Key=f"{w}/t002/mp", UploadId=up)
        # 2b: a copy source SeaweedFS may read as another key than the quota does: refused before the store
        bad = s3_client(proxy.url, ep.creds, max_attempts=1)
        _swap(bad, "CopyObject", {"x-amz-copy-source": f"/{B}//{w}/t001/src"})
        with pytest.raises(botocore.exceptions.ClientError) as e:
            bad.copy_object(Bucket=B, Key=f"{w}/t003/c", CopySource=f"{B}/{w}/t001/src")
        assert _code(e) == (400, "InvalidArgument")
        assert held(f"{w}/t003/") == {}
        # 2c: a plain PUT is counted the bytes it sends, whatever x-amz-decoded-content-length claims
        liar = s3_client(proxy.url, ep.creds, max_attempts=1)
        _swap(liar, "PutObject", {"x-amz-decoded-content-length": "1"})
        liar.put_object(Bucket=B, Key=f"{w}/t004/a", Body=b"l" * 5000)
        with pytest.raises(botocore.exceptions.ClientError) as e:
            liar.put_object(Bucket=B, Key=f"{w}/t004/b", Body=b"l" * 5000)
        assert _code(e) == (403, "QuotaExceeded")
        assert held(f"{w}/t004/") == {f"{w}/t004/a": 5000}
        # 2d: a DeleteObjects Go's XML decoder reads otherwise (two Keys in one Object: it deletes the last) is
        # refused; one with a comment in a key deletes what the store reads, and that key leaves the quota
        for k in ("a", "b", "c"):
            c.put_object(Bucket=B, Key=f"{w}/t005/{k}", Body=b"x")
        two = (f"<Delete><Object><Key>{w}/t005/a</Key><Key>{w}/t005/b</Key></Object></Delete>").encode()
        sly = s3_client(proxy.url, ep.creds, max_attempts=1)
        _swap(sly, "DeleteObjects", body=two)
        with pytest.raises(botocore.exceptions.ClientError) as e:
            sly.delete_objects(Bucket=B, Delete={"Objects": [{"Key": f"{w}/t005/a"}]})
        assert _code(e) == (400, "MalformedXML")
        assert set(held(f"{w}/t005/")) == {f"{w}/t005/{k}" for k in "abc"}
        commented = (f"<Delete><Object><Key>{w}/t005/<!-- hidden -->a</Key></Object></Delete>").encode()
        sly2 = s3_client(proxy.url, ep.creds, max_attempts=1)
        _swap(sly2, "DeleteObjects", body=commented)
        sly2.delete_objects(Bucket=B, Delete={"Objects": [{"Key": f"{w}/t005/a"}]})
        assert set(held(f"{w}/t005/")) == {f"{w}/t005/b", f"{w}/t005/c"}
        c.put_object(Bucket=B, Key=f"{w}/t005/d", Body=b"x")  # the room the delete freed
        with pytest.raises(botocore.exceptions.ClientError) as e:
            c.put_object(Bucket=B, Key=f"{w}/t005/e", Body=b"x")
        assert _code(e) == (403, "QuotaExceeded")
        assert len(held(f"{w}/t005/")) == 3
        proxy.control().flush()
    lines = [orjson.loads(x) for x in log.read_bytes().splitlines()]
    deletes = [r for r in lines if r.get("quota_op") == "DeleteObjects" and r["status"] == 200]
    assert [r["keys"] for r in deletes] == [[f"{w}/t005/a"]]  # the log names the key the store deleted
    # a resumed wave's proxy starts from the same totals (finding 3)
    from storage.quota import Quota
    again = Quota(3, 8 * 1024)
    again.preload(lines)
    for t in ("t000", "t004", "t005"):
        assert again.usage(B, f"{w}/{t}/")["objects"] == len(held(f"{w}/{t}/")), t
        assert again.usage(B, f"{w}/{t}/")["bytes"] == sum(held(f"{w}/{t}/").values()), t
