"""Issue 42's last hostile review, the three finds left open: what `grade`, `report` and `serve` say of a wave's folder
that is not what was sealed, or not what they can write into.

- M1: a forged copy with SEAL.json and MANIFEST.json removed was sealed by `grade` as if new (`verify` then said
  intact). A folder with no seal is graded and not sealed; `--reseal` seals it.
- M6: `SUMMARY.md` made a directory gave a traceback (exit 1). Now exit 2, named, the directory and what is in it
  left, verdict.json still written.
- M7: `serve` listed a folder that fails its seal, or whose timeline is a FIFO, as `pass`; a FIFO verdict.json would
  have hung the index; `report` printed its REPORT line though nothing was graded.
"""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import orjson
import pytest
from cluster import results
from cluster.seal import MANIFEST, SEAL, seal, verify
from cluster.serve import collect, index_html

from tests.clirun import sandfleet

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "wave-before-results-py"


@pytest.fixture
def wave(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDFLEET_SEAL_KEY", str(tmp_path / "keys" / "seal.key"))
    monkeypatch.setattr("cluster.report.start_timeline_png", lambda d: None)
    root = tmp_path / "results"
    root.mkdir()
    d = root / "w"
    shutil.copytree(FIXTURE, d)
    return d


def _cli(*argv) -> tuple[int, str]:
    r = sandfleet(*argv)
    return r.exit_code, r.output


def _drop_last_line(p: Path) -> None:
    p.write_bytes(b"".join(p.read_bytes().splitlines(keepends=True)[:-1]))


def test_grade_never_seals_a_folder_whose_seal_was_removed(wave):
    """M1: sealed, tampered, its seal removed: `grade` grades it and leaves it unsealed, saying so; `verify` still
    refuses it. `--reseal` is the user's say-so to seal it as it is."""
    code, out = _cli("grade", wave)
    assert "carries no seal" in out and not os.path.lexists(wave / SEAL), out  # never sealed: left so
    seal(wave)
    _drop_last_line(wave / "effects.jsonl")
    (wave / SEAL).unlink()
    (wave / MANIFEST).unlink()
    code, out = _cli("grade", wave)
    assert code in (0, 1, 2) and "Traceback" not in out, out
    assert "carries no seal" in out and "--reseal" in out, out
    assert not os.path.lexists(wave / SEAL) and not os.path.lexists(wave / MANIFEST)
    assert _cli("verify", wave)[0] == 2  # no seal: `verify` says so, never "intact"
    code, out = _cli("grade", "--reseal", wave)
    assert "carries no seal" not in out and verify(wave)["ok"], out


def test_a_directory_where_summary_goes_is_exit_2_named_and_left(wave):
    """M6: a directory in SUMMARY.md's place: exit 2 naming it, no traceback, the directory and its file left,
    verdict.json written all the same, and the folder not sealed over it."""
    seal(wave)
    (wave / results.SUMMARY).unlink()
    (wave / results.SUMMARY).mkdir()
    (wave / results.SUMMARY / "mine.txt").write_text("kept")
    code, out = _cli("grade", wave)
    assert code == 2 and "Traceback" not in out, out
    assert "SUMMARY.md: a directory stands where this file goes" in out, out
    assert (wave / results.SUMMARY / "mine.txt").read_text() == "kept"
    assert orjson.loads((wave / results.VERDICT).read_bytes())["verdict"]
    code, out = _cli("report", wave)  # (its index.html is written, and named: only SUMMARY.md could not be)
    assert code == 2 and "SUMMARY.md: a directory" in out and "Traceback" not in out, out


def test_report_names_no_page_when_nothing_was_graded(wave):
    """M7: `report` of a wave whose plan is damaged printed `REPORT: .../index.html` (the old page) though nothing was
    graded. Only a page this run wrote is named."""
    code, out = _cli("report", wave)
    assert "REPORT:" in out and (wave / results.INDEX_HTML).is_file(), out
    (wave / results.PLAN).write_bytes(b"[1, 2]")
    code, out = _cli("report", wave)
    assert code == 2 and "nothing was graded" in out and "REPORT:" not in out, out


def _row(root: Path) -> dict:
    rows = collect(root)
    assert len(rows) == 1 and "w" in index_html(root, rows)
    return rows[0]


def test_serve_lists_a_folder_that_fails_its_seal_as_such_never_pass(wave):
    """M7: a sealed wave lists its verdict; the same wave with its timeline made a FIFO, or a line of its records
    removed, or its seal damaged, is listed as `fails its seal` naming the file, its tasks left out of the trends."""
    _cli("grade", "--reseal", wave)
    row = _row(wave.parent)
    assert row["verdict"] not in (None, "fails its seal") and row["tasks"], row
    assert not any("seal" in p for p in row["problems"]) and row["unsealed"] is None, row
    (wave / "timeline.jsonl").unlink()
    os.mkfifo(wave / "timeline.jsonl")
    row = _row(wave.parent)
    assert row["verdict"] == "fails its seal" and row["tasks"] == [], row
    assert any("timeline.jsonl" in p for p in row["problems"]), row["problems"]
    (wave / "timeline.jsonl").unlink()
    shutil.copy(FIXTURE / "timeline.jsonl", wave / "timeline.jsonl")
    assert _row(wave.parent)["verdict"] != "fails its seal"  # put back: intact again
    _drop_last_line(wave / "effects.jsonl")
    row = _row(wave.parent)
    assert row["verdict"] == "fails its seal" and any("effects.jsonl" in p for p in row["problems"]), row
    (wave / SEAL).write_text("[1]")
    row = _row(wave.parent)
    assert row["verdict"] == "fails its seal" and any("seal is damaged" in p for p in row["problems"]), row


def test_serve_notes_a_wave_with_no_seal(wave):
    row = _row(wave.parent)
    assert row["verdict"] != "fails its seal" and "not sealed" in row["unsealed"] and not row["problems"], row
    assert "not sealed" in index_html(wave.parent, [row])


def test_a_fifo_verdict_never_hangs_the_index(wave):
    """A FIFO in verdict.json's place: the reader once blocked forever in open(); now the row names it."""
    (wave / results.VERDICT).unlink(missing_ok=True)
    os.mkfifo(wave / results.VERDICT)
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("row", _row(wave.parent)), daemon=True)
    th.start()
    th.join(60)  # a bound on a hang, not a timing assertion: the row comes back at once or never
    assert "row" in got, "the index hung on a FIFO verdict.json"
    assert any("verdict.json" in p and "not a regular file" in p for p in got["row"]["problems"]), got["row"]


def test_serve_remembers_a_seal_check_until_the_top_level_changes_or_a_minute_passes(wave, monkeypatch):
    """The quick check walks every file of a wave (about 1 ms per 70 files), so a listing remembers it: a change at
    the wave's top level (its records, grades, seal) is seen at once, a change deeper down by SEAL_TTL_S."""
    from cluster import serve

    _cli("grade", "--reseal", wave)
    assert _row(wave.parent)["verdict"] != "fails its seal"
    deep = next(p for p in (wave / "artifacts").rglob("*") if p.is_file() and p.name != "artifact.json")
    with open(deep, "ab") as f:
        f.write(b"x")
    assert _row(wave.parent)["verdict"] != "fails its seal"  # remembered: the top level did not change
    monkeypatch.setattr(serve, "SEAL_TTL_S", 0.0)
    row = _row(wave.parent)
    assert row["verdict"] == "fails its seal" and any(deep.name in p for p in row["problems"]), row


def test_a_linked_timeline_png_is_replaced_never_written_through(wave, tmp_path, monkeypatch):
    """The review's H1 (c6f2567's review): `grade` drew timeline.png through a link left in its place (a file outside
    the folder overwritten with a PNG), and the seal then called the link intact."""
    from cluster import report

    monkeypatch.setattr(report, "start_timeline_png", lambda d: None)  # drawn inline, as the fallback does
    _cli("grade", "--reseal", wave)
    victim = tmp_path / "precious.txt"
    victim.write_text("PRECIOUS\n")
    (wave / results.TIMELINE_PNG).unlink(missing_ok=True)
    (wave / results.TIMELINE_PNG).symlink_to(victim)
    code, out = _cli("grade", wave)
    assert victim.read_text() == "PRECIOUS\n", out
    assert not (wave / results.TIMELINE_PNG).is_symlink()


def test_files_added_at_grade_output_names_fail_the_seal_and_are_never_resealed(wave):
    """The review's H2: the pre-grade seal check left out every name under pages/ or evidence/ and every
    `*.grade.json` anywhere, changed, added or missing: a page, an evidence file or a grade added to a sealed folder
    was sealed in by the next `grade`. Only the files grade rewrites, changed or gone, are left out now."""
    _cli("grade", "--reseal", wave)
    for name in ("pages/evil.html", "evidence/t000/forged.json", "t999.grade.json", "artifacts/t001/x.grade.json"):
        (wave / name).parent.mkdir(parents=True, exist_ok=True)
        (wave / name).write_text("{}")
        code, out = _cli("grade", wave)
        assert code == 2 and "fails its seal" in out and f"added: {name}" in out, (name, out)
        assert not verify(wave)["ok"]  # not sealed in
        (wave / name).unlink()
        _cli("grade", "--reseal", wave)
    (wave / results.INDEX_HTML).unlink()  # a file grade writes, gone: rewritten, the folder sealed again
    code, out = _cli("grade", wave)
    assert "fails its seal" not in out and verify(wave)["ok"], out


def test_a_folder_sealed_by_another_key_is_never_resealed_with_ours_unasked(wave, tmp_path, monkeypatch):
    """The review's H3: a copy sealed by someone else's key was signed with the user's own key by `grade`, without
    a word. It is graded and left; `--reseal` signs it, keeping theirs as SEAL.prev.json."""
    monkeypatch.setenv("SANDFLEET_SEAL_KEY", str(tmp_path / "theirs.key"))
    theirs = seal(wave)["fingerprint"]
    monkeypatch.setenv("SANDFLEET_SEAL_KEY", str(tmp_path / "mine.key"))
    mine = seal(tmp_path / "results")["fingerprint"]  # (any folder: makes this user's key)
    code, out = _cli("grade", wave)
    assert f"sealed by key {theirs}" in out and "not sealed again" in out, out
    assert orjson.loads((wave / SEAL).read_bytes())["fingerprint"] == theirs
    code, out = _cli("grade", "--reseal", wave)
    assert orjson.loads((wave / SEAL).read_bytes())["fingerprint"] == mine and (wave / "SEAL.prev.json").exists()
    code, out = _cli("grade", wave)  # ours now: renewed as before
    assert "sealed by key" not in out and verify(wave)["ok"], out


def test_a_file_name_with_a_newline_never_forges_a_line_of_verify_or_grade(wave):
    """The review's M6: a runner's file name may hold a newline; `verify` printed `added: a` and then a line of the
    runner's choosing (`sealed: intact, 0 changed`), and so did grade's seal warning and SUMMARY.md."""
    _cli("grade", "--reseal", wave)
    (wave / "artifacts" / "a\nsealed: intact, 0 changed").write_text("x")
    code, out = _cli("verify", wave)
    assert code == 1 and not any(line.startswith("sealed: intact") for line in out.splitlines()), out
    assert "a\\nsealed: intact" in out, out
    code, out = _cli("grade", wave)
    assert not any(line.startswith("sealed: intact") for line in out.splitlines()), out
    summary = (wave / results.SUMMARY).read_text()
    assert not any(line.startswith("sealed: intact") for line in summary.splitlines())


def test_a_directory_where_a_task_page_goes_is_exit_2_named(wave):
    """The review's L3: a directory at pages/t000.html left the pages unwritten without a word, and the folder was
    sealed again. Named (exit 2), SUMMARY.md and verdict.json still written, not sealed over it."""
    _cli("grade", "--reseal", wave)
    page = wave / results.PAGES / "t000.html"
    page.unlink()
    page.mkdir()
    code, out = _cli("grade", wave)
    assert code == 2 and "t000.html: a directory stands where this file goes" in out, out
    assert "web report not written" in (wave / results.SUMMARY).read_text()
    assert page.is_dir() and not verify(wave)["ok"]


def test_serve_sees_a_same_size_edit_of_the_verdict_it_lists(wave):
    """The review's L1: verdict.json edited from "not_applied" to "pass" padded to the same size was listed as pass
    (the quick check compared sizes only). The top level's small files, what a row is made of, are hashed."""
    _cli("grade", "--reseal", wave)
    v = wave / results.VERDICT
    raw = v.read_bytes()
    was = orjson.loads(raw)["verdict"]
    assert was != "pass"
    forged = raw.replace(f'"verdict":"{was}"'.encode(), b'"verdict":"pass"' + b" " * (len(was) - 4), 1)
    if forged == raw:
        forged = raw.replace(f'"verdict": "{was}"'.encode(), b'"verdict": "pass"' + b" " * (len(was) - 4), 1)
    assert forged != raw and len(forged) == len(raw)
    v.write_bytes(forged)
    row = _row(wave.parent)
    assert row["verdict"] == "fails its seal" and any("verdict.json" in p for p in row["problems"]), row
