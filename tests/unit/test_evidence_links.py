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
