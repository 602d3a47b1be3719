"""The hostile review's H1-H3 and M5: a results folder someone shaped (links, FIFOs) is never written through or read
through by `grade`/`report`: evidence files and pages are replaced, runner logs are read only as regular files."""
import os
from types import SimpleNamespace

from cluster import results
from cluster.grade.evidence import write_evidence


def _h():
    return SimpleNamespace(events=[], writes=[], receipts=[], requests=[], calls=[])


def test_links_and_fifos_in_a_shaped_folder_are_never_followed(tmp_path):
    d = tmp_path / "w"
    outside = tmp_path / "outside"
    outside.mkdir()
    victim, secret = outside / "bashrc", outside / "secret.txt"
    victim.write_text("untouched\n")
    secret.write_text("TOP-SECRET\n")
    logs = d / results.SANDBOXES
    (logs / "t000-a1").mkdir(parents=True)
    (logs / "t000-a1" / results.RUNNER_LOG).symlink_to(secret)  # a linked log
    (logs / "t000-a2").symlink_to(outside)  # a linked attempt folder
    (outside / results.RUNNER_LOG).write_text("TOP-SECRET-TOO\n")
    (logs / "t000-a3").mkdir()
    os.mkfifo(logs / "t000-a3" / results.RUNNER_LOG)  # a FIFO: would hang a plain read
    ev = results.ResultsDir(d).evidence("t000")
    ev.mkdir(parents=True)
    (ev / results.EVIDENCE_RUNNER_LOGS).symlink_to(victim)  # a linked evidence file
    write_evidence(d, {"task_id": "t000"}, _h())
    assert victim.read_text() == "untouched\n"
    got = (ev / results.EVIDENCE_RUNNER_LOGS).read_text()
    assert not (ev / results.EVIDENCE_RUNNER_LOGS).is_symlink()
    assert "TOP-SECRET" not in got and got.count("(not read:") == 3, got
    assert results.ResultsDir(d).runner_log_tails("t000") == {}


def test_a_linked_evidence_or_pages_folder_is_replaced_never_written_into(tmp_path):
    d, outside = tmp_path / "w", tmp_path / "outside"
    d.mkdir()
    outside.mkdir()
    (d / results.EVIDENCE).symlink_to(outside)
    (d / results.PAGES).symlink_to(outside)
    write_evidence(d, {"task_id": "t000"}, _h())
    assert results.own_dir(d, results.PAGES) == d / results.PAGES
    assert list(outside.iterdir()) == []
    assert not (d / results.EVIDENCE).is_symlink() and (d / results.EVIDENCE / "t000" / results.EVIDENCE_GRADE).exists()
    link = tmp_path / "latest"
    link.symlink_to(d)
    assert results.own_dir(link, results.PAGES) == link / results.PAGES and link.is_symlink()  # the root is kept


def test_a_fifo_artifact_manifest_never_hangs_grade_and_a_linked_evidence_log_stays_off_the_page(tmp_path):
    """The review's H2 (reproduced at c6f2567): a FIFO in `artifacts/t001/artifact.json` hung `grade` forever (its
    digest was read with a plain open). And a page read a task's evidence log through a link (a link to the seal key
    would have put it in the page). Both are read as regular files only: named unreadable, never followed."""
    import shutil
    import threading
    from pathlib import Path

    from cluster.grade import grade_wave
    from cluster.htmlreport import _log_tails

    d = tmp_path / "w"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "wave-before-results-py", d)
    art = d / "artifacts" / "t001" / "artifact.json"
    art.unlink()
    os.mkfifo(art)
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("r", grade_wave(d)), daemon=True)
    th.start()
    th.join(120)  # a bound on a hang, not a timing assertion
    assert "r" in got, "grade hung on a FIFO artifact.json"
    t001 = next(g for g in got["r"]["tasks"] if g["task_id"] == "t001")
    assert "artifacts/t001/artifact.json" in t001["inputs"]["unreadable"], t001["inputs"]
    secret = tmp_path / "seal.key"
    secret.write_text("TOP-SECRET-KEY\n")
    ev = results.own_dir(d, results.EVIDENCE, "t000")
    (ev / results.EVIDENCE_RUNNER_LOGS).unlink(missing_ok=True)
    (ev / results.EVIDENCE_RUNNER_LOGS).symlink_to(secret)
    assert "TOP-SECRET" not in _log_tails(d, "t000")


def test_redaction_of_runner_logs_never_reads_or_writes_through_a_link(tmp_path):
    from cluster.grade.evidence import redact_runner_logs

    d, outside = tmp_path / "w", tmp_path / "outside"
    outside.mkdir()
    (outside / results.RUNNER_LOG).write_text("key AKIAEXAMPLEKEY12345 here\n")
    victim = tmp_path / "victim.log"
    victim.write_text("key AKIAEXAMPLEKEY12345 there\n")
    logs = d / results.SANDBOXES
    (logs / "t000-a1").mkdir(parents=True)
    (logs / "t000-a1" / results.RUNNER_LOG).write_text("key AKIAEXAMPLEKEY12345 mine\n")
    (logs / "t000-a2").symlink_to(outside)
    (logs / "t000-a3").mkdir()
    (logs / "t000-a3" / results.RUNNER_LOG).symlink_to(victim)
    (logs / "t000-a4").mkdir()
    os.mkfifo(logs / "t000-a4" / results.RUNNER_LOG)
    assert redact_runner_logs(results.ResultsDir(d), ["AKIAEXAMPLEKEY12345"]) == 1
    assert "AKIAEXAMPLEKEY12345" not in (logs / "t000-a1" / results.RUNNER_LOG).read_text()
    assert "AKIAEXAMPLEKEY12345" in (outside / results.RUNNER_LOG).read_text()  # never written through
    assert "AKIAEXAMPLEKEY12345" in victim.read_text()


def test_an_artifact_is_never_read_through_a_linked_directory(tmp_path):
    """The review's M5: O_NOFOLLOW guards a path's last name only: `artifacts/t001` (or a directory inside its files)
    made a link to a copy outside was graded from the outside files. Any linked directory there is named."""
    import shutil

    import pytest

    from cluster.artifacts import read_artifact, write_artifact

    d = tmp_path / "w" / "artifacts"
    d.mkdir(parents=True)
    write_artifact(d / "t001", {"src/app.py": b"x = 1\n", "README.md": b"r\n"}, {})
    assert read_artifact(d / "t001")[0]["src/app.py"] == b"x = 1\n"
    outside = tmp_path / "outside"
    shutil.copytree(d / "t001", outside)
    shutil.rmtree(d / "t001")
    (d / "t001").symlink_to(outside)
    with pytest.raises(ValueError, match="a link, not followed"):
        read_artifact(d / "t001")
    (d / "t001").unlink()
    shutil.copytree(outside, d / "t001")
    shutil.rmtree(d / "t001" / "files" / "src")
    (d / "t001" / "files" / "src").symlink_to(outside / "files" / "src")
    with pytest.raises(ValueError, match="a link, not followed"):
        read_artifact(d / "t001")
    (d / "t001" / "files" / "src").unlink()
    shutil.copytree(outside / "files" / "src", d / "t001" / "files" / "src")
    assert read_artifact(d / "t001")[0]["src/app.py"] == b"x = 1\n"
    link_root = tmp_path / "latest"  # the wave's folder itself reached through a link (results/latest) is fine
    link_root.symlink_to(tmp_path / "w")
    assert read_artifact(link_root / "artifacts" / "t001")[0]["README.md"] == b"r\n"


def test_the_evidence_log_tail_holds_no_raw_control_byte(tmp_path):
    """The review's L4: evidence/<task>/runner-logs.txt kept a runner's ESC and BEL bytes raw (36-42 a file), so a
    `cat` of the evidence ran the runner's terminal escapes. The tail is escaped as SUMMARY.md is."""
    d = tmp_path / "w"
    logs = d / results.SANDBOXES / "t000-a1"
    logs.mkdir(parents=True)
    (logs / results.RUNNER_LOG).write_bytes(b"step 1\n\x1b]0;PWNED\x07\x1b[2J\x9b31m done\n")
    write_evidence(d, {"task_id": "t000"}, _h())
    got = (results.ResultsDir(d).evidence("t000") / results.EVIDENCE_RUNNER_LOGS).read_text()
    assert "step 1" in got and "PWNED" in got and "\\x1b" in got, got
    assert not any(c in got for c in "\x1b\x07\x9b"), repr(got)
