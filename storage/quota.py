"""The store's per-task quota, kept by the fault proxy: objects and bytes each task's prefix holds.

A task is a slot of the bucket (`bucket/<wave>/<task>/`, the first two segments of the key, as `RuleSet` slots
rules). The proxy admits each write before the store sees it (`admit`), holding a reservation for it while it is
in flight (so concurrent writes cannot pass together), and settles it with the store's answer (`settle`): a 2xx
PUT or CompleteMultipartUpload sets its key's size, a DELETE (or DeleteObjects) removes it, UploadParts count
while their upload is open. A write that would take the task past either bound is answered by the proxy as the
store would answer it: `403 QuotaExceeded` (Ceph RGW's answer to a user or bucket quota, the S3-compatible
store whose quota is objects and bytes like this one; MinIO's bucket quota answers 400
`XMinioAdminBucketQuotaExceeded`, which an S3 client cannot tell from a malformed request; a 403 is never
retried by botocore, so a runner sees it at once rather than after its retries).

Counted from what the proxy saw: on a resumed wave, from its log (`preload`). A copy counts the source's size
when the source is the task's own known key (else 0 bytes, 1 object). A browser-form POST upload names its key
in its body: with a quota on it is refused (501 NotImplemented); a PUT with no length (S3 needs one) gets 411
MissingContentLength.
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

QUOTA_STATUS, QUOTA_CODE = 403, "QuotaExceeded"
SUBRESOURCES = ("tagging", "acl", "retention", "legal-hold")  # a PUT of these writes no object data


@dataclass
class Use:
    """One task's holdings."""

    objects: dict = field(default_factory=dict)  # key -> size
    bytes: int = 0
    parts: dict = field(default_factory=dict)  # upload id -> {part number: size}
    part_bytes: int = 0
    inflight_objects: int = 0
    inflight_bytes: int = 0
    refused: int = 0


@dataclass
class Reservation:
    slot: tuple
    op: str
    key: str
    length: int = 0  # the bytes this write stores (a part's, an object's)
    objects: int = 0  # reserved while in flight
    bytes: int = 0
    upload_id: str | None = None
    part: int | None = None
    done: bool = False


def slot_of(bucket: str, key: str) -> tuple:
    segs = key.split("/", 2)
    return (bucket, segs[0], segs[1] if len(segs) > 1 else "")


class Quota:
    def __init__(self, max_objects: int, max_bytes: int):
        if max_objects < 1 or max_bytes < 1:
            raise ValueError(f"quota bounds must be >= 1 (objects {max_objects}, bytes {max_bytes})")
        self.max_objects, self.max_bytes = max_objects, max_bytes
        self.use: dict[tuple, Use] = {}

    def _use(self, slot: tuple) -> Use:
        u = self.use.get(slot)
        if u is None:
            u = self.use[slot] = Use()
        return u

    def usage(self, bucket: str, key: str) -> dict:
        u = self.use.get(slot_of(bucket, key)) or Use()
        return {"objects": len(u.objects), "max_objects": self.max_objects, "bytes": u.bytes + u.part_bytes,
                "max_bytes": self.max_bytes, "refused": u.refused}

    def admit(self, req, headers) -> tuple[Reservation | None, tuple[int, str, str] | None]:
        """(reservation, None) to forward the request, or (None, (status, code, why)) to refuse it. `req` is an
        `S3Request`, `headers` a `Head` (`get(name)`, `length`, `chunked`)."""
        m, op = req.method, req.op
        if m in ("GET", "HEAD") or not req.bucket:
            return None, None
        if m == "POST" and (not req.key and "delete" not in req.flags or op == "PostObject"):
            return None, (501, "NotImplemented", "a form POST upload names its key in its body: the store quota "
                                                 "cannot count it (use PUT or a multipart upload)")
        if not req.key:
            return (Reservation(slot_of(req.bucket, req.list_prefix or ""), op, "") if op == "DeleteObjects"
                    else None), None
        slot = slot_of(req.bucket, req.key)
        u = self._use(slot)
        res = Reservation(slot, op, req.key, upload_id=req.upload_id, part=req.part)
        if m == "PUT" and any(s in req.flags for s in SUBRESOURCES):
            return None, None
        if op in ("PutObject", "UploadPart"):
            length = self._length(headers, u, req.bucket)
            if length is None:
                return None, (411, "MissingContentLength", "a PUT under the store quota must say its length "
                                                           "(Content-Length or x-amz-decoded-content-length)")
            res.length = length
            if op == "PutObject":
                old = u.objects.get(req.key)
                res.objects = 0 if old is not None else 1
                res.bytes = max(0, length - (old or 0))
            else:
                res.bytes = max(0, length - (u.parts.get(req.upload_id) or {}).get(req.part, 0))
        elif op in ("CreateMultipartUpload", "CompleteMultipartUpload"):
            res.objects = 0 if req.key in u.objects else 1
        if res.objects and len(u.objects) + u.inflight_objects + res.objects > self.max_objects:
            u.refused += 1
            return None, (QUOTA_STATUS, QUOTA_CODE,
                          f"the task's store quota is {self.max_objects} objects; it holds {len(u.objects)}")
        held = u.bytes + u.part_bytes + u.inflight_bytes
        if res.bytes and held + res.bytes > self.max_bytes:
            u.refused += 1
            return None, (QUOTA_STATUS, QUOTA_CODE,
                          f"the task's store quota is {self.max_bytes} bytes; it holds {held}, this write adds "
                          f"{res.bytes}")
        if op == "CreateMultipartUpload":
            return None, None  # it stores nothing yet: its object is counted (and bounded) at completion
        u.inflight_objects += res.objects
        u.inflight_bytes += res.bytes
        return res, None

    def _length(self, headers, u: Use, bucket: str) -> int | None:
        src = headers.get("x-amz-copy-source")
        if src:
            rng = re.fullmatch(r"bytes=(\d{1,18})-(\d{1,18})", headers.get("x-amz-copy-source-range"))
            if rng:
                return max(0, int(rng.group(2)) - int(rng.group(1)) + 1)
            path = urllib.parse.unquote(src.split("?", 1)[0]).lstrip("/")
            b, _, key = path.partition("/")
            got = self.use.get(slot_of(b, key))
            return (got.objects.get(key) if got is not None else None) or 0
        decoded = headers.get("x-amz-decoded-content-length")
        if decoded.isdecimal() and len(decoded) < 19:
            return int(decoded)
        return headers.length if not headers.chunked else None

    def release(self, res: Reservation | None) -> None:
        """The write never reached an answer from the store: its reservation goes."""
        if res is None or res.done:
            return
        res.done = True
        u = self._use(res.slot)
        u.inflight_objects -= res.objects
        u.inflight_bytes -= res.bytes

    def settle(self, res: Reservation | None, status: int, body: bytes | None = None) -> None:
        """The store answered `status` to the reserved write (`body`: the request's body when it was held, for
        DeleteObjects' keys)."""
        if res is None or res.done:
            return
        self.release(res)
        if 200 <= status < 300:
            self.apply(res.slot, res.op, res.key, res.length, res.upload_id, res.part,
                       delete_keys(body) if res.op == "DeleteObjects" else ())

    def apply(self, slot: tuple, op: str, key: str, length: int, upload_id, part, deleted=()) -> None:
        u = self._use(slot)
        if op == "PutObject":
            u.bytes += length - u.objects.get(key, 0)
            u.objects[key] = length
        elif op == "UploadPart" and upload_id:
            parts = u.parts.setdefault(upload_id, {})
            u.part_bytes += length - parts.get(part, 0)
            parts[part] = length
        elif op == "CompleteMultipartUpload":
            size = sum((u.parts.pop(upload_id, None) or {}).values())
            u.part_bytes -= size
            u.bytes += size - u.objects.get(key, 0)
            u.objects[key] = size
        elif op == "AbortMultipartUpload":
            u.part_bytes -= sum((u.parts.pop(upload_id, None) or {}).values())
        elif op == "DeleteObject":
            u.bytes -= u.objects.pop(key, 0)
        elif op == "DeleteObjects":
            for k in deleted:
                got = self.use.get(slot_of(slot[0], k))
                if got is not None:
                    got.bytes -= got.objects.pop(k, 0)

    def preload(self, records) -> int:
        """Rebuild the holdings from a proxy log (a resumed wave: the store kept what its first run wrote). The
        log does not say which PUT was a copy or a tagging write, nor DeleteObjects' keys: those count as the log
        has them (a PUT as its bytes). Returns the writes applied."""
        n = 0
        for r in sorted((r for r in records if isinstance(r, dict) and isinstance(r.get("t"), (int, float))),
                        key=lambda r: r["t"]):
            st, key, m = r.get("status"), r.get("key"), r.get("method")
            if not isinstance(st, int) or not 200 <= st < 300 or not key or not isinstance(key, str) \
                    or not isinstance(r.get("bucket"), str):
                continue
            uid, part = r.get("upload_id"), r.get("part")
            op = {"PUT": "UploadPart" if uid and part is not None else "PutObject",
                  "POST": "CompleteMultipartUpload" if uid else None,
                  "DELETE": "AbortMultipartUpload" if uid else "DeleteObject"}.get(m)
            if op is None:
                continue
            size = r.get("req_bytes") if isinstance(r.get("req_bytes"), int) else 0
            self.apply(slot_of(r["bucket"], key), op, key, size, uid, part)
            n += 1
        return n


def delete_keys(body: bytes | None) -> list[str]:
    if not body:
        return []
    out = []
    for m in re.finditer(rb"<Key>(.*?)</Key>", body, flags=re.S):
        try:
            k = m.group(1).decode()
        except UnicodeDecodeError:
            continue
        out.append(k.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&apos;", "'")
                   .replace("&amp;", "&"))
    return out
