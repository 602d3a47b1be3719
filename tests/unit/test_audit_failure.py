"""An end-of-wave store audit that fails names what failed (issue 42's last review, finding 2): the call (listing
the objects, reading one back, listing the incomplete uploads), the bucket and prefix (and the key, escaped: a
runner chose it), and the error. Before, the wave said only `store snapshot failed: <the client's exception>`
(a connection error's text is a pool's URL), and store-audit.json was not written, so a report read "no readable
store-audit.json". Now store-audit.json holds the failure, the grade's `store_audit` is `unknown` naming it, and
SUMMARY.md says it. A fake second client stands in for minio."""
from __future__ import annotations

import re
import shutil
from types import SimpleNamespace

import orjson
import pytest

from cluster import report, results
from cluster.wave.teardown import Teardown
from tests.unit.test_audit_sample import FakeMinio
from tests.unit.test_grade_fuzz import FIXTURE

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
KEY = "w-1/t000/evil\x1b]0;PWNED\x07.txt"


class Broken(FakeMinio):
    def __init__(self, fail: str):
        super().__init__({KEY: b"abc", "w-1/t000/ok": b"x"})
        self.fail = fail

    def list_objects(self, bucket, prefix=None, recursive=True):
        if self.fail == "list":
            raise ConnectionError("Connection refused (127.0.0.1:9)")
        yield from super().list_objects(bucket, prefix, recursive)

    def get_object(self, bucket, key):
        if self.fail == "read" and key == KEY:
            raise OSError("the store hung up mid-body")
        return super().get_object(bucket, key)

    def _list_multipart_uploads(self, bucket, **kw):
        if self.fail == "uploads":
            raise PermissionError("AccessDenied")
        return super()._list_multipart_uploads(bucket, **kw)


def _teardown(tmp_path, monkeypatch, fail: str) -> Teardown:
    monkeypatch.setattr("storage.audit.client_for", lambda *a, **k: Broken(fail))
    parts = SimpleNamespace(proxy=None, bucket="sf-0123", store_lent=True,
                            endpoint=SimpleNamespace(url="http://127.0.0.1:9", region="us-east-1",
                                                     creds=SimpleNamespace(access_key="a", secret_key="s")))
    health = SimpleNamespace(lost=lambda part: True)  # (no proxy to flush)
    out = results.ResultsDir(tmp_path)
    return Teardown(parts, health, None, out, "w-1", {"t000": None}, tmp_path, False, 1.0, lambda: None)


@pytest.mark.parametrize("fail, call", [("list", "ListObjectsV2"), ("read", "GetObject"),
                                        ("uploads", "ListMultipartUploads")])
def test_a_failed_audit_names_the_call_bucket_prefix_and_error(tmp_path, monkeypatch, fail, call):
    td = _teardown(tmp_path, monkeypatch, fail)
    with pytest.raises(RuntimeError) as got:
        td.audit_store()
    msg = str(got.value)
    assert call in msg and "sf-0123" in msg and "w-1/" in msg, msg
    assert {"list": "Connection refused", "read": "hung up", "uploads": "AccessDenied"}[fail] in msg, msg
    assert not RAW.search(msg), msg
    if fail == "read":
        assert "evil\\x1b]0;PWNED\\x07.txt" in msg, msg  # the key a runner chose, escaped
    a = orjson.loads((tmp_path / results.STORE_AUDIT).read_bytes())
    assert a["error"]["call"].startswith(call) and a["error"]["bucket"] == "sf-0123" and a["error"]["prefix"] == "w-1/"
    assert a["failed"] == msg and not RAW.search(orjson.dumps(a).decode())


def test_a_failed_audit_is_unknown_in_the_grade_and_named_in_the_summary(tmp_path, monkeypatch):
    from cluster.grade import grade_wave

    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    td = _teardown(tmp_path / "td", monkeypatch, "list") if (tmp_path / "td").mkdir() is None else None
    with pytest.raises(RuntimeError):
        td.audit_store()
    shutil.copy(tmp_path / "td" / results.STORE_AUDIT, d / results.STORE_AUDIT)
    result = grade_wave(d)
    assert result["wave_checks"]["store_audit"] == "unknown"
    assert result["leaks"]["incomplete_uploads"] is None  # nothing is known of them
    line = report._audit(d)
    assert line.startswith("unknown") and "ListObjectsV2" in line and "Connection refused" in line, line
