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

Counted from what the proxy saw: on a resumed wave, from its log (`preload`, which replays what each line says
the quota applied: `quota_op`, `stored`, `keys`, `not_deleted`). A PUT counts the bytes it sends (its
Content-Length: SeaweedFS ignores `x-amz-decoded-content-length`, so a claim there never counts); one with no
length (chunked) gets 411 MissingContentLength. A copy counts its source's size, or its range's within it; a
copy source is read as SeaweedFS reads it, or refused (400 InvalidArgument: a `?versionId=`, `//`, a `.`
segment, a bad escape), and one the quota never saw written is refused (501 NotImplemented: its size is
unknown). A DeleteObjects body is parsed by an XML parser (no DOCTYPE, no entity declarations) into the keys
the store deletes; a body Go's decoder could read otherwise (two Keys in an Object, unknown elements) is 400
MalformedXML. A browser-form POST upload names its key in its body: with a quota on it is refused (501).
"""
from __future__ import annotations

import re
import urllib.parse
import xml.etree.ElementTree as ET
from xml.parsers import expat
from dataclasses import dataclass, field

QUOTA_STATUS, QUOTA_CODE = 403, "QuotaExceeded"
SUBRESOURCES = ("tagging", "acl", "retention", "legal-hold")  # a PUT of these writes no object data
DELETE_MAX = 1000  # keys one DeleteObjects may name (S3's bound; SeaweedFS refuses more)
DELETE_BODY_MAX = 1024 * 1024  # the proxy holds a DeleteObjects body whole to read its keys (its HOLD_MAX)
COUNTED_OPS = ("PutObject", "UploadPart", "CompleteMultipartUpload", "AbortMultipartUpload", "DeleteObject",
               "DeleteObjects")


class Refused(ValueError):
    """A write the quota cannot count as the store will apply it: (status, code, why), an S3 error."""

    def __init__(self, status: int, code: str, why: str):
        super().__init__(why)
        self.answer = (status, code, why)


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
            if op != "DeleteObjects":
                return None, None
            if headers.chunked or headers.length is None or headers.length > DELETE_BODY_MAX:
                return None, (411, "MissingContentLength", "a DeleteObjects under the store quota must send "
                                                           f"Content-Length, at most {DELETE_BODY_MAX} bytes")
            return Reservation(slot_of(req.bucket, req.list_prefix or ""), op, ""), None
        slot = slot_of(req.bucket, req.key)
        u = self._use(slot)
        res = Reservation(slot, op, req.key, upload_id=req.upload_id, part=req.part)
        if m == "PUT" and any(s in req.flags for s in SUBRESOURCES):
            return None, None
        if op in ("PutObject", "UploadPart"):
            try:
                length = self._length(headers, req.part is not None)
            except Refused as exc:
                return None, exc.answer
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

    def _length(self, headers, part: bool) -> int:
        """The bytes this PutObject or UploadPart stores: a copy's source (or its range's part of it, for a part:
        SeaweedFS's CopyObject ignores a range), else the body's bytes as sent (its Content-Length)."""
        src = headers.get("x-amz-copy-source")
        if src:
            bucket, key = copy_source(src)
            got = self.use.get(slot_of(bucket, key))
            size = got.objects.get(key) if got is not None else None
            if size is None:
                raise Refused(501, "NotImplemented", f"x-amz-copy-source {src[:200]!r}: the store quota has not "
                                                     "seen that object written, so it cannot count its size")
            rng = headers.get("x-amz-copy-source-range")
            if not part or not rng:
                return size
            m = re.fullmatch(r"bytes=([0-9]{1,18})-([0-9]{1,18})", rng)
            if m is None or int(m.group(1)) > int(m.group(2)):
                raise Refused(400, "InvalidArgument", f"x-amz-copy-source-range {rng[:60]!r} must be "
                                                      "bytes=FIRST-LAST with FIRST <= LAST")
            return max(0, min(int(m.group(2)), size - 1) - int(m.group(1)) + 1)
        if headers.chunked or headers.length is None:
            raise Refused(411, "MissingContentLength", "a PUT under the store quota must send Content-Length (the "
                                                       "bytes it sends are what it is counted for)")
        return headers.length

    def release(self, res: Reservation | None) -> None:
        """The write never reached an answer from the store: its reservation goes."""
        if res is None or res.done:
            return
        res.done = True
        u = self._use(res.slot)
        u.inflight_objects -= res.objects
        u.inflight_bytes -= res.bytes

    def settle(self, res: Reservation | None, status: int, deleted=()) -> None:
        """The store answered `status` to the reserved write (`deleted`: the keys a DeleteObjects deleted)."""
        if res is None or res.done:
            return
        self.release(res)
        if 200 <= status < 300:
            self.apply(res.slot, res.op, res.key, res.length, res.upload_id, res.part, deleted)

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
        """Rebuild the holdings from a proxy log (a resumed wave: the store kept what its first run wrote), to the
        same totals the live count reached: each line says what the quota applied (`quota_op`, `stored`, `keys`
        less `not_deleted`). A line from before those fields counts as the log has it (a PUT as its bytes).
        Returns the writes applied."""
        n = 0
        for r in sorted((r for r in records if isinstance(r, dict) and isinstance(r.get("t"), (int, float))),
                        key=lambda r: r["t"]):
            st, key, bucket = r.get("status"), r.get("key"), r.get("bucket")
            if not isinstance(st, int) or not 200 <= st < 300 or not isinstance(key, str) \
                    or not isinstance(bucket, str):
                continue
            uid, part = r.get("upload_id"), r.get("part")
            if "quota_op" in r:
                op = r["quota_op"]
                if op not in COUNTED_OPS:
                    continue
            elif not key:  # a line from before `quota_op`: a bucket-level POST that names keys is a DeleteObjects
                if r.get("method") != "POST" or not isinstance(r.get("keys"), list):
                    continue
                op = "DeleteObjects"
            else:
                op = {"PUT": "UploadPart" if uid and part is not None else "PutObject",
                      "POST": "CompleteMultipartUpload" if uid else None,
                      "DELETE": "AbortMultipartUpload" if uid else "DeleteObject"}.get(r.get("method"))
                if op is None:
                    continue
            deleted = ()
            if op == "DeleteObjects":
                keys = r.get("keys") if isinstance(r.get("keys"), list) else []
                nd = r.get("not_deleted")
                kept = {k for k in nd if isinstance(k, str)} if isinstance(nd, list) else set()
                deleted = [k for k in keys if isinstance(k, str) and k not in kept]
            size = r.get("stored", r.get("req_bytes"))
            self.apply(slot_of(bucket, key), op, key, size if isinstance(size, int) else 0, uid, part, deleted)
            n += 1
        return n


def copy_source(raw: str) -> tuple[str, str]:
    """(bucket, key) of an x-amz-copy-source as SeaweedFS reads it (Go's url.PathUnescape: `%XX` decoded, `+`
    kept; one leading `/` dropped; split at the first `/`), or Refused when it may read it otherwise or as another
    key than the one the quota holds: a query (`?versionId=`), a bad escape, `//`, a `.` or `..` segment, a
    control byte."""
    def bad(why: str) -> Refused:
        return Refused(400, "InvalidArgument", f"x-amz-copy-source {raw[:200]!r}: {why} (the store quota reads "
                                               "only BUCKET/KEY, percent-encoded)")
    if "?" in raw or "#" in raw:
        raise bad("a query or version is not counted")
    if re.search(r"%(?![0-9A-Fa-f]{2})", raw):
        raise bad("a % that is not an escape")
    try:
        path = urllib.parse.unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise bad("not UTF-8 once unescaped") from None
    path = path[1:] if path.startswith("/") else path
    bucket, _, key = path.partition("/")
    segs = key.split("/")
    if not bucket or not key or re.search(r"[\x00-\x1f\x7f]", path) or "" in segs[:-1] \
            or any(s in (".", "..") for s in segs):
        raise bad("not a canonical bucket and key (no `//`, no `.` or `..` segment, no control byte)")
    return bucket, key


def _local(tag) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _xml_root(body: bytes, what: str):
    """The root element of `body` as a safe parser reads it: UTF-8 only, no DOCTYPE, no entity declaration (so
    no entity but XML's own is expanded), no external anything; ValueError otherwise."""
    if body.startswith(b"\xef\xbb\xbf") or re.match(rb"<\?xml[^>]*encoding=[\"'](?!utf-8[\"'])", body, re.I):
        raise ValueError(f"{what}: only UTF-8 without a byte-order mark")

    def refuse(*_):
        raise ValueError(f"{what}: a DOCTYPE or an entity declaration is refused")

    tree = ET.TreeBuilder()
    p = expat.ParserCreate("utf-8", "}")  # names as `uri}local`; comments and processing instructions dropped
    p.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    p.StartDoctypeDeclHandler = p.EntityDeclHandler = p.UnparsedEntityDeclHandler = refuse
    p.ExternalEntityRefHandler = p.SkippedEntityHandler = refuse
    p.StartElementHandler = lambda tag, attrs: tree.start(tag, {})
    p.EndElementHandler = tree.end
    p.CharacterDataHandler = tree.data
    try:
        p.Parse(body, True)
        return tree.close()
    except (expat.ExpatError, AssertionError) as exc:
        raise ValueError(f"{what}: not well-formed XML ({exc})") from None


OBJECT_FIELDS = {"Key", "VersionId", "ETag", "LastModifiedTime", "Size"}


def delete_keys(body: bytes | None) -> list[str]:
    """The keys a DeleteObjects body makes the store delete, in order, as Go's encoding/xml reads it into
    SeaweedFS's DeleteObjectsRequest (comments dropped, CDATA and character references read, namespaces ignored,
    empty keys skipped). ValueError for a body it could read otherwise or that S3 refuses: another root, an
    element it does not know, two Keys in one Object (Go keeps the last), markup inside a Key, more than
    DELETE_MAX objects, a non-canonical key (`//`, a leading `/`) or a control byte in one."""
    if not body:
        return []
    root = _xml_root(body, "DeleteObjects body")
    if _local(root.tag) != "Delete":
        raise ValueError(f"DeleteObjects body: the root is {_local(root.tag)!r}, not Delete")
    out = []
    objects = 0
    for child in root:
        name = _local(child.tag)
        if name == "Quiet":
            continue
        if name != "Object":
            raise ValueError(f"DeleteObjects body: an element {name!r} in Delete (only Object and Quiet)")
        objects += 1
        fields = [_local(f.tag) for f in child]
        if fields.count("Key") != 1 or not set(fields) <= OBJECT_FIELDS:
            raise ValueError(f"DeleteObjects body: an Object holds {fields!r} (exactly one Key)")
        k = next(f for f in child if _local(f.tag) == "Key")
        if len(k):
            raise ValueError("DeleteObjects body: markup inside a Key")
        key = k.text or ""
        if re.search(r"[\x00-\x1f\x7f]", key) or key.startswith("/") or "//" in key:
            raise ValueError(f"DeleteObjects body: key {key[:200]!r} is not canonical (no `//`, leading `/`, "
                             "or control byte)")
        if key:
            out.append(key)
    if objects > DELETE_MAX:
        raise ValueError(f"DeleteObjects body: {objects} objects, more than {DELETE_MAX}")
    return out


def not_deleted(answer: bytes | None, named: list[str]) -> list[str]:
    """Of the keys a DeleteObjects named, those the store's answer (a DeleteResult) says it did not delete (its
    Error entries); every one when the answer cannot be read."""
    if not named:
        return []
    try:
        root = _xml_root(answer or b"", "DeleteObjects answer")
    except ValueError:
        return list(named)
    failed = set()
    for child in root:
        if _local(child.tag) == "Error":
            for f in child:
                if _local(f.tag) == "Key":
                    failed.add(f.text or "")
    return [k for k in named if k in failed]
