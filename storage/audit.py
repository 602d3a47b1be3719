"""The store audit after every wave, through a second client (the `minio` SDK, independent of the runners'
boto3): every object of the wave's bucket is read back and checked against what its writer sent (the size
the proxy relayed and, when the writer signed its payload, the sha256 in `x-amz-content-sha256`; for a
multipart object the sum of its last accepted parts), keys outside every task's prefix are listed, and
incomplete multipart uploads are listed page by page, reported, then aborted.

Bounded: the listing is whole (a key outside every task's prefix is found wherever it is), but at most
`max_objects` objects are read back; past that a seeded sample of `max_objects` of them is (`random.Random` of
the wave's seed, so a re-run reads the same ones). The report says how many of how many it read and the seed
(`objects_listed`, `objects_checked`, `sample_seed`, `sampled`): an audit that read a sample never claims it
read everything. Each task's totals (`task_totals`: objects and bytes under its prefix) come from the whole
listing, never the sample: the grader holds them to the store quota (`within_store_quota`). (Reading back
costs ~1.1 ms an object here: BENCHMARKS.md, "Store audit".)

Findings carry a named signature: `store_object_differs_from_write`, `store_object_short_read`,
`store_key_outside_task_prefixes`, `incomplete_multipart_upload`.

minio 7.2 exposes multipart listing and abort only as `_list_multipart_uploads` / `_abort_multipart_upload`
(pinned in pyproject.toml); its `next_upload_id_marker` is not set (a typo in the SDK), so pages are
chained from the last upload of each page, which is what S3's markers mean; SeaweedFS does not page by
markers at all, so the audit drains the list (abort each page, ask again) instead.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import random
import urllib.parse

from minio import Minio

WRITE_OK = range(200, 300)
MAX_OBJECTS = 10000  # objects read back at most (the config's `store.audit_max_objects`)
READERS = 8  # objects read back at once (one at a time, 10,000 of them were most of a 10,000-task wave's end)


def sample_keys(keys: list[str], max_objects: int, seed: int) -> set[str] | None:
    """The keys to read back: None (every one) when they fit `max_objects`, else a seeded sample of that many
    (the same keys for the same listing and seed, whatever order the store listed them in)."""
    if len(keys) <= max_objects:
        return None
    return set(random.Random(f"store-audit:{seed}").sample(sorted(keys), max_objects))


def committed_writes(proxy_log: list[dict], bucket: str) -> dict[str, dict]:
    """key -> what its last accepted write sent: {"size", "sha256" or None, "t", "how"}; a DELETE removes it.
    Keys whose PUT a fault cut (ST6) are marked `cut`: the store may hold an empty object there by design."""
    out: dict[str, dict] = {}
    parts: dict[str, dict[int, int]] = {}
    cut = set()
    for r in sorted(proxy_log, key=lambda r: r["t"]):
        if r.get("bucket") != bucket or not r.get("key"):
            continue
        key, st, m = r["key"], r.get("status") or 0, r.get("method")
        if r.get("cut"):
            cut.add(key)
            continue
        if st not in WRITE_OK:  # refused; a held (ambiguous) write the store answered 2xx did land
            continue
        if m == "PUT" and r.get("part") is not None and r.get("upload_id"):
            parts.setdefault(r["upload_id"], {})[r["part"]] = r.get("req_bytes") or 0
        elif m == "PUT":
            out[key] = {"size": r.get("req_bytes"), "sha256": r.get("sha"), "t": r["t"], "how": "PUT"}
        elif m == "POST" and r.get("upload_id"):  # CompleteMultipartUpload
            got = parts.get(r["upload_id"])
            out[key] = {"size": sum(got.values()) if got else None, "sha256": None, "t": r["t"],
                        "how": "CompleteMultipartUpload"}
        elif m == "DELETE" and not r.get("upload_id"):
            out.pop(key, None)
    for k in cut:
        out.setdefault(k, {"size": None, "sha256": None, "t": 0, "how": "PUT"})["cut"] = True
    return out


def client_for(url: str, access_key: str, secret_key: str, region: str = "us-east-1") -> Minio:
    u = urllib.parse.urlsplit(url)
    return Minio(u.netloc, access_key=access_key, secret_key=secret_key, secure=u.scheme == "https",
                 region=region)


def _page(mc: Minio, bucket: str, prefix, page: int, key_marker=None, id_marker=None):
    res = mc._list_multipart_uploads(bucket, prefix=prefix, max_uploads=page, key_marker=key_marker,
                                     upload_id_marker=id_marker)
    return res, [{"key": u.object_name, "upload_id": u.upload_id,
                  "initiated": u.initiated_time.timestamp() if u.initiated_time else None} for u in res.uploads]


def list_incomplete_uploads(mc: Minio, bucket: str, prefix: str | None = None, page: int = 1000,
                            abort: bool = False) -> list[dict]:
    """Every incomplete multipart upload, page by page. With `abort`, each page is aborted as it is read and
    the first page is asked again until it holds nothing new: this drains the list even on a store whose
    markers do not page (SeaweedFS lists uploads out of key order and answers a marker with nothing, see
    docs/store-hazards.md). Without it, pages are chained by S3's markers (deduplicated, bounded)."""
    seen: dict[tuple, dict] = {}
    key_marker = id_marker = None
    for _ in range(100000):  # bounded either way
        res, ups = _page(mc, bucket, prefix, page, None if abort else key_marker, None if abort else id_marker)
        fresh = [u for u in ups if (u["key"], u["upload_id"]) not in seen]
        for u in fresh:
            seen[(u["key"], u["upload_id"])] = u
            if abort:
                try:
                    mc._abort_multipart_upload(bucket, u["key"], u["upload_id"])
                    u["aborted"] = True
                except Exception as exc:  # noqa: BLE001 - reported; it stays listed and ends the loop
                    u["abort_error"] = str(exc)[:200]
        if not fresh or (not abort and not res.is_truncated):
            break
        key_marker, id_marker = ups[-1]["key"], ups[-1]["upload_id"]
    return list(seen.values())


def _read_back(mc: Minio, bucket: str, key: str) -> tuple[str, int]:
    """The object's sha256 and length, read back whole through the second client."""
    h, n = hashlib.sha256(), 0
    resp = mc.get_object(bucket, key)
    try:
        for chunk in resp.stream(256 * 1024):
            h.update(chunk)
            n += len(chunk)
    finally:
        resp.close()
        resp.release_conn()
    return h.hexdigest(), n


def _differs_from_write(exp: dict, n: int, sha256: str) -> list[str]:
    """How the stored object differs from what its writer sent (the proxy's record of the committed write)."""
    bad = []
    if exp["size"] is not None and exp["size"] != n:
        bad.append(f"its writer sent {exp['size']} bytes ({exp['how']}), the store holds {n}")
    if exp["sha256"] and exp["sha256"] != sha256:
        bad.append(f"sha256 {sha256[:16]}... is not the {exp['sha256'][:16]}... its writer signed")
    return bad


def audit(mc: Minio, bucket: str, wave_id: str, task_ids: list[str], proxy_log: list[dict] | None,
          abort: bool = True, page: int = 1000, shared: bool = False, max_objects: int = MAX_OBJECTS,
          seed: int = 0) -> dict:
    """`shared`: the bucket holds other waves' keys too (a lent fleet's store): only the wave's prefix is read.
    `max_objects`: read back at most this many, a sample seeded by `seed` past it."""
    scope = f"{wave_id}/" if shared else None
    expected = committed_writes(proxy_log or [], bucket) if proxy_log is not None else None
    prefixes = {tid: f"{wave_id}/{tid}/" for tid in task_ids}
    tasks: dict[str, list] = {tid: [] for tid in task_ids}
    findings: list[dict] = []
    outside: list[str] = []
    # (name, size, etag) only: the SDK's objects are ~10x larger, and a listing may hold a flood's keys
    listed = [(o.object_name, o.size, (o.etag or "").strip('"'))
              for o in mc.list_objects(bucket, prefix=scope, recursive=True)]
    chosen = sample_keys([k for k, _, _ in listed], max_objects, seed)
    owners = {p: t for t, p in prefixes.items()}
    seen_outside: set[str] = set()
    # read back READERS at a time, in the listing's order; the findings below still come in that order
    pool = concurrent.futures.ThreadPoolExecutor(READERS, thread_name_prefix="sf-audit")
    reads = {k: pool.submit(_read_back, mc, bucket, k) for k, _, _ in listed if chosen is None or k in chosen}
    # what each task's prefix holds, from the whole listing (never a sample): the grader holds it to the quota
    totals = {tid: {"objects": 0, "bytes": 0} for tid in task_ids}
    for key, size, etag in listed:
        segs = key.split("/", 2)
        owner = owners.get(f"{segs[0]}/{segs[1]}/") if len(segs) == 3 else None
        if owner is not None:
            totals[owner]["objects"] += 1
            totals[owner]["bytes"] += size or 0
        if owner is None and key not in seen_outside:
            seen_outside.add(key)
            outside.append(key)
            findings.append({"signature": "store_key_outside_task_prefixes", "key": key,
                             "detail": f"{key} is under no task's prefix {wave_id}/<task>/"})
        if chosen is not None and key not in chosen:
            continue
        try:
            digest, n = reads[key].result()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            if hasattr(mc, "CALLS"):  # a client that names the failed call (cluster/wave/teardown.py) names this read
                mc.call, mc.key = mc.CALLS["get_object"], key
            raise
        rec = {"key": key[len(prefixes[owner]):] if owner else key, "size": size, "read": n,
               "sha256": digest, "etag": etag}
        if owner is not None:
            tasks[owner].append(rec)
        if n != size:
            findings.append({"signature": "store_object_short_read", "key": key, "task": owner,
                             "detail": f"listed as {size} bytes, read back {n}"})
        exp = (expected or {}).get(key)
        bad = _differs_from_write(exp, n, rec["sha256"]) if exp is not None and not exp.get("cut") else []
        if bad:
            findings.append({"signature": "store_object_differs_from_write", "key": key, "task": owner,
                             "detail": "; ".join(bad)})
        rec["checked_against_write"] = exp is not None and not exp.get("cut")
    pool.shutdown()
    uploads = list_incomplete_uploads(mc, bucket, prefix=scope, page=page, abort=abort)
    for u in uploads:
        findings.append({"signature": "incomplete_multipart_upload", "key": u["key"], "upload_id": u["upload_id"],
                         "task": next((t for t, p in prefixes.items() if u["key"].startswith(p)), None),
                         "detail": f"upload {u['upload_id'][:16]} of {u['key']} was never completed or aborted"})
    aborted = [u["upload_id"] for u in uploads if u.get("aborted")]
    return {"bucket": bucket, "scope": scope or "", "client": "minio", "tasks": tasks, "task_totals": totals,
            "incomplete_uploads": uploads,
            "aborted_uploads": aborted, "outside_task_prefixes": outside, "findings": findings,
            "objects_listed": len(listed), "objects_checked": len(listed) if chosen is None else len(chosen),
            "sampled": chosen is not None, "sample_seed": seed, "max_objects": max_objects,
            "checked_against_writes": expected is not None}
