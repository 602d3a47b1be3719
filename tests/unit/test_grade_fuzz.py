"""The grader is total over what a runner can shape: a real wave's stored files with any field of any record a
runner influences (the proxy's request log, the model's and the effects' logs, the fenced and load logs, the
timeline's values) set to any JSON value, or with extra records of any shape, are always graded, and the wave
always gets SUMMARY.md, verdict.json and index.html. A record the grader cannot use is named, never a traceback."""
from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import report, results
from cluster.grade import grade_wave

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "wave-before-results-py"
FILES = (results.PROXY_REQUESTS, results.MODEL_CALLS, results.EFFECTS, results.FENCED, results.HOST_LOAD,
         results.TIMELINE)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def _fields(name: str) -> list[str]:
    keys = set(results.SHAPES.get(name, {}))
    for line in (FIXTURE / name).read_bytes().splitlines()[:50]:
        try:
            keys |= set(orjson.loads(line))
        except orjson.JSONDecodeError:
            pass
    return sorted(keys)


FIELDS = {name: _fields(name) for name in FILES}


@st.composite
def damage(draw):
    """(file, line index, field, value) edits, and records appended, as a runner could make them appear."""
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(FILES))
        field = draw(st.sampled_from(FIELDS[name]) | st.text(min_size=1, max_size=6))
        if name == results.TIMELINE and field == "event":
            continue  # the timeline is the driver's spine: its event names are not a runner's to shape
        edits.append((name, draw(st.integers(0, 10_000)), field, draw(json_values)))
    extra = draw(st.lists(st.tuples(st.sampled_from(FILES[:5]), st.dictionaries(
        st.sampled_from(["t", "key", "akid", "task", "step", "method", "status", "attempt", "event"]),
        json_values, max_size=6)), max_size=2))
    return edits, extra


def _apply(d: Path, edits, extra) -> None:
    for name, i, field, value in edits:
        p = d / name
        recs = [orjson.loads(x) for x in p.read_bytes().splitlines() if x.strip()]
        if not recs:
            continue
        recs[i % len(recs)][field] = value
        p.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    for name, rec in extra:
        with open(d / name, "ab") as f:
            f.write(orjson.dumps(rec) + b"\n")


@pytest.fixture(scope="module")
def no_picture():
    saved = report._timeline_png
    report._timeline_png = lambda d: None  # the picture is drawn by a child of its own; not what is fuzzed here
    yield
    report._timeline_png = saved


@settings(max_examples=int(__import__('os').environ.get('SF_FUZZ_EXAMPLES', '120')), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage())
def test_the_grader_never_raises_on_what_a_runner_can_shape(tmp_path_factory, no_picture, damaged):
    d = tmp_path_factory.mktemp("wave") / "w"
    shutil.copytree(FIXTURE, d)
    for stale in (results.SUMMARY, results.VERDICT, results.INDEX_HTML):
        (d / stale).unlink(missing_ok=True)
    _apply(d, *damaged)
    result = grade_wave(d)
    report.write_summary(d, result)
    for name in (results.SUMMARY, results.VERDICT, results.INDEX_HTML):
        assert (d / name).is_file(), name
    assert "web report not written" not in (d / results.SUMMARY).read_text()
    assert {g["task_id"] for g in result["tasks"]} == {"t000", "t001"}
    # the last resort (a task the grader could not grade is unknown) is a net, not the way: every task was graded
    assert not [g["task_id"] for g in result["tasks"] + result["references"] if "graded" in g["checks"]]


def test_a_garbage_request_line_logged_with_no_key_is_graded(tmp_path):
    """The hostile find: a runner sent `GARBAGE\\r\\n\\r\\n` to its S3 endpoint; the proxy answered 400 and logged
    `"key": null`, and the grader's `.startswith` on None erased the wave's whole grade."""
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    recs = [orjson.loads(x) for x in (d / results.PROXY_REQUESTS).read_bytes().splitlines() if x.strip()]
    akid = next(r["akid"] for r in recs if r.get("akid") and "/t000/" in (r.get("key") or ""))
    bad = {"t": recs[-1]["t"], "method": "GARBAGE", "bucket": None, "key": None, "akid": akid, "status": 400,
           "ms": 0.1}
    (d / results.PROXY_REQUESTS).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs + [bad]))
    result = grade_wave(d)
    assert {g["task_id"] for g in result["tasks"]} == {"t000", "t001"}
    assert not [g["task_id"] for g in result["tasks"] if "graded" in g["checks"]]


def test_a_record_of_another_shape_is_left_out_and_named(tmp_path):
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    with open(d / results.PROXY_REQUESTS, "ab") as f:
        f.write(orjson.dumps({"t": 1.0, "method": "PUT", "key": ["a", "list"], "status": 200}) + b"\n")
    result = grade_wave(d)
    skipped = result["inputs"]["skipped"][results.PROXY_REQUESTS]
    assert skipped["count"] == 1 and "key is a JSON list" in skipped["first"][0]
    g = orjson.loads(results.ResultsDir(d).grade("t000").read_bytes())
    assert g["inputs"]["skipped"][results.PROXY_REQUESTS]["count"] == 1


def test_a_task_whose_history_cannot_be_built_is_unknown_and_named(tmp_path, monkeypatch):
    from cluster.grade import wave as wave_mod

    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    real = wave_mod.task_history

    def broken(w, at, task):
        if task["task_id"] == "t001":
            raise KeyError("something no runner should reach")
        return real(w, at, task)

    monkeypatch.setattr(wave_mod, "task_history", broken)
    result = grade_wave(d)
    g = next(g for g in result["tasks"] if g["task_id"] == "t001")
    assert g["verdict"] == "unknown" and "could not grade" in g["checks"]["graded"]["detail"]
    assert wave_mod.exit_code(result) == 2


def test_a_wave_the_grader_cannot_grade_still_gets_every_report_file(tmp_path, no_picture):
    """The driver's last resort (grade_wave itself raised): every task unknown, the harness error named, and
    SUMMARY.md, verdict.json and index.html written (exit 2), never only a traceback."""
    from cluster.grade import exit_code, ungraded_wave

    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    for stale in (results.SUMMARY, results.VERDICT, results.INDEX_HTML):
        (d / stale).unlink(missing_ok=True)
    plan = orjson.loads((d / results.PLAN).read_bytes())
    result = ungraded_wave(plan, "KeyError: 'x'")
    report.write_summary(d, result)
    for name in (results.SUMMARY, results.VERDICT, results.INDEX_HTML):
        assert (d / name).is_file(), name
    assert "could not grade" in (d / results.SUMMARY).read_text()
    assert exit_code(result) == 2 and {g["verdict"] for g in result["tasks"]} == {"unknown"}


def test_a_refused_model_call_with_no_step_is_kept():
    """The endpoint logs a request it could not answer (no dialect fits) with `"step": null`: a record of the shape
    the grader reads, never one left out (the driver's per-task counts would then call the whole log lost)."""
    rec = {"t": 1.0, "task": "t000", "step": None, "kind": "refused", "refused": "no dialect"}
    kept, left = results.fit([rec], results.MODEL_CALLS)
    assert kept == [rec] and left == []
