"""A LangGraph checkpoint saver on S3 (boto3), for any S3-compatible endpoint.

Layout under `prefix` (one object per checkpoint, one per `put_writes` call):

    <prefix>lg/<thread>/<ns>/cp/<checkpoint_id>.json            checkpoint + metadata + parent id
    <prefix>lg/<thread>/<ns>/w/<checkpoint_id>/<task_id>.<idx>.json   a task's writes, idx = the first's

A task's writes go in ONE object: they land together or not at all, like the SQL savers' single
transaction. (One object per write tore under a kill: a node's `messages` write stored, its branch
write not, and on resume LangGraph took the node as done and the graph ended early. Found by
sandfleet's PK1 right after a model answer.)

Checkpoint ids are uuid6 (monotonic, sortable), so the latest checkpoint is the largest key.
Every object is created with a conditional write (`IfNoneMatch="*"`): a checkpoint is immutable,
and a retried PUT whose first try did land (412) is a success. A pending write keeps its first
value like LangGraph's own savers do, except the special ones (error, interrupt, ...), which
overwrite. Each record carries the writer's fence (`SANDFLEET_FENCE` in sandfleet), for audit.

Transient store errors (503 outage, SlowDown, 5xx, dropped connections) are retried with backoff
for up to `retry_s` seconds; a 403 drops the client so the next try resolves credentials anew.

Why not `langgraph-checkpoint-s3` (0.1.3): its `_get_writes` turns any ClientError (a 503 during an
outage, say) into "no pending writes" with a log line, so a resume can silently lose the result of
a finished node and run it again; it also has no retries and wraps errors in RuntimeError.
"""
from __future__ import annotations

import base64
import json
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (WRITES_IDX_MAP, BaseCheckpointSaver, ChannelVersions, Checkpoint,
                                       CheckpointMetadata, CheckpointTuple, get_checkpoint_id,
                                       get_checkpoint_metadata)
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

RETRY_CODES = {"ServiceUnavailable", "SlowDown", "InternalError", "RequestTimeout", "RequestTimeTooSkewed",
               "Throttling", "500", "502", "503", "504"}
AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "403"}
TAKEN_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
MISSING_CODES = {"NoSuchKey", "404", "NotFound"}


def code_of(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        return code_of(exc) in RETRY_CODES | AUTH_CODES
    return isinstance(exc, (botocore.exceptions.BotoCoreError, OSError))


def _before_retry(state) -> None:
    saver, exc = state.args[0], state.outcome.exception()
    if code_of(exc) in AUTH_CODES:
        saver._client = None
    saver.log(f"store retry {state.fn.__name__} after {code_of(exc) or type(exc).__name__}")


def _retrying(fn):
    def wrapper(self, *args, **kwargs):
        return retry(retry=retry_if_exception(_transient), wait=wait_exponential(multiplier=0.05, max=1.0),
                     stop=stop_after_delay(self.retry_s), reraise=True, before_sleep=_before_retry)(fn)(
            self, *args, **kwargs)
    wrapper.__name__ = fn.__name__
    return wrapper


def _ns(checkpoint_ns: str) -> str:
    return urllib.parse.quote(checkpoint_ns, safe="") or "-"


class S3Saver(BaseCheckpointSaver[str]):
    """Checkpoints and pending writes as JSON objects under `prefix` in `bucket`."""

    def __init__(self, bucket: str, prefix: str, *, fence: int | None = None, retry_s: float = 120.0,
                 log=print, serde=None) -> None:
        super().__init__(serde=serde)
        self.bucket, self.prefix, self.fence, self.retry_s, self.log = bucket, prefix, fence, retry_s, log
        self._client = None

    @property
    def client(self):
        if self._client is None:  # a new session resolves credentials again (credential_process)
            self._client = boto3.session.Session().client("s3", config=Config(
                s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"},
                connect_timeout=2, read_timeout=10,
                request_checksum_calculation="when_required", response_checksum_validation="when_required"))
        return self._client

    # ------------------------------------------------------------ raw store calls
    @_retrying
    def _keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    @_retrying
    def _get(self, key: str) -> dict | None:
        try:
            return json.loads(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except botocore.exceptions.ClientError as exc:
            if code_of(exc) in MISSING_CODES:
                return None
            raise

    @_retrying
    def _put(self, key: str, record: dict, *, create_only: bool) -> bool:
        body = json.dumps(record, separators=(",", ":")).encode()
        try:
            extra = {"IfNoneMatch": "*"} if create_only else {}
            self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", **extra)
            return True
        except botocore.exceptions.ClientError as exc:
            if create_only and code_of(exc) in TAKEN_CODES:
                return False
            raise

    # ------------------------------------------------------------ encoding
    def _dump(self, value: Any) -> list[str]:
        kind, data = self.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode()]

    def _load(self, typed: list[str]) -> Any:
        return self.serde.loads_typed((typed[0], base64.b64decode(typed[1])))

    def _base(self, thread_id: str, checkpoint_ns: str) -> str:
        return f"{self.prefix}lg/{urllib.parse.quote(str(thread_id), safe='')}/{_ns(checkpoint_ns)}/"

    def _tuple(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, rec: dict) -> CheckpointTuple:
        writes = []
        base = self._base(thread_id, checkpoint_ns)
        for key in self._keys(f"{base}w/{checkpoint_id}/"):
            w = self._get(key)
            if w is not None:
                writes += w["writes"] if "writes" in w else [w]
        writes.sort(key=lambda w: (w["task_path"], w["task_id"], w["idx"]))  # writes_sort_key order
        parent = rec.get("parent_id")
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                     "checkpoint_id": checkpoint_id}},
            checkpoint=self._load(rec["checkpoint"]),
            metadata=self._load(rec["metadata"]),
            parent_config=({"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                             "checkpoint_id": parent}} if parent else None),
            pending_writes=[(w["task_id"], w["channel"], self._load(w["value"])) for w in writes])

    def _checkpoint_ids(self, thread_id: str, checkpoint_ns: str) -> list[str]:
        base = self._base(thread_id, checkpoint_ns) + "cp/"
        return [k[len(base):-len(".json")] for k in self._keys(base) if k.endswith(".json")]

    # ------------------------------------------------------------ BaseCheckpointSaver
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id = config["configurable"]["thread_id"]
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            ids = self._checkpoint_ids(thread_id, checkpoint_ns)
            if not ids:
                return None
            checkpoint_id = max(ids)
        rec = self._get(f"{self._base(thread_id, checkpoint_ns)}cp/{checkpoint_id}.json")
        return None if rec is None else self._tuple(thread_id, checkpoint_ns, checkpoint_id, rec)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        if config is None:
            raise NotImplementedError("S3Saver.list needs a config with a thread_id")
        thread_id = config["configurable"]["thread_id"]
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        only = get_checkpoint_id(config)
        before_id = get_checkpoint_id(before) if before else None
        for checkpoint_id in sorted(self._checkpoint_ids(thread_id, checkpoint_ns), reverse=True):
            if (only and checkpoint_id != only) or (before_id and checkpoint_id >= before_id):
                continue
            rec = self._get(f"{self._base(thread_id, checkpoint_ns)}cp/{checkpoint_id}.json")
            if rec is None:
                continue
            if filter:
                metadata = self._load(rec["metadata"])
                if not all(metadata.get(k) == v for k, v in filter.items()):
                    continue
            if limit is not None:
                if limit <= 0:
                    return
                limit -= 1
            yield self._tuple(thread_id, checkpoint_ns, checkpoint_id, rec)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        thread_id = config["configurable"]["thread_id"]
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        rec = {"checkpoint": self._dump(checkpoint),
               "metadata": self._dump(get_checkpoint_metadata(config, metadata)),
               "parent_id": config["configurable"].get("checkpoint_id"), "fence": self.fence, "t": time.time()}
        self._put(f"{self._base(thread_id, checkpoint_ns)}cp/{checkpoint['id']}.json", rec, create_only=True)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                 "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        thread_id = config["configurable"]["thread_id"]
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = config["configurable"]["checkpoint_id"]
        base = f"{self._base(thread_id, checkpoint_ns)}w/{checkpoint_id}/"
        recs = [{"task_id": task_id, "task_path": task_path, "idx": WRITES_IDX_MAP.get(channel, i),
                 "channel": channel, "value": self._dump(value), "fence": self.fence, "t": time.time()}
                for i, (channel, value) in enumerate(writes)]
        if not recs:
            return
        first = recs[0]["idx"]
        self._put(f"{base}{urllib.parse.quote(task_id, safe='')}.{first}.json", {"writes": recs},
                  create_only=all(r["idx"] >= 0 for r in recs))

    def delete_thread(self, thread_id: str) -> None:
        prefix = f"{self.prefix}lg/{urllib.parse.quote(str(thread_id), safe='')}/"
        for key in self._keys(prefix):
            self.client.delete_object(Bucket=self.bucket, Key=key)
