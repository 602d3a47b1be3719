"""A wave is always graded: what a runner sends can never erase the grade of its own task or any other."""
from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from cluster import results
from cluster.grade import exit_code

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
GARBAGE = str(ROOT / "tests" / "runners" / "garbage_s3.py")


def test_a_runner_that_sends_a_garbage_request_line_gets_a_graded_wave(run_wave):
    result, d = run_wave(runner={"name": "garbage-s3", "command": [sys.executable, GARBAGE]}, faults=["PK1"],
                         fault_timing={"PK1": {"after_model_calls": [2, 4]}}, tasks=2, concurrency=2, seed=39,
                         workload={"steps": 6, "think_ms": 20}, deadline_s=90)
    logged = results.read_jsonl(Path(d) / results.PROXY_REQUESTS)
    assert any(r.get("key") is None and r.get("status") == 400 for r in logged), "the proxy logged no garbage"
    for name in (results.SUMMARY, results.VERDICT, results.INDEX_HTML):
        assert (Path(d) / name).is_file(), name
    for g in result["tasks"]:
        assert "graded" not in g["checks"], g["checks"]
        assert results.ResultsDir(d).grade(g["task_id"]).is_file()
    assert orjson.loads((Path(d) / results.VERDICT).read_bytes())["verdict"] == result["verdict"]
    # apart from its garbage the runner is the durable reference: it passes
    assert result["verdict"] == "pass", [(g["task_id"], g["verdict"], g["signature"]) for g in result["tasks"]]
    assert exit_code(result) == 0


STAMP = str(ROOT / "tests" / "runners" / "stamp.py")
PK1_AT_ANSWERS = {"PK1": {"after_model_calls": [2, 4]}}


def stamp(**env) -> dict:
    return {"name": "stamp", "command": [sys.executable, STAMP], "env": env}


def test_a_build_stamp_is_unknown_undeclared_and_pass_declared(run_wave):
    """The hostile find: an honest runner that writes repo/BUILD_INFO (time, uuid) failed resume_equivalent in 6 of
    6 tasks under PK1 (one reference per seed: the "two uninterrupted runs differ" rule never fired). The wave now
    runs a second uninterrupted run of the seed when a task differs: they differ there too, so `unknown`, named;
    declared volatile, `pass`."""
    cfg = dict(faults=["PK1"], fault_timing=PK1_AT_ANSWERS, tasks=2, concurrency=2, seed=41,
               workload={"steps": 6, "think_ms": 20}, deadline_s=90)
    result, d = run_wave(runner=stamp(), **cfg)
    seconds = {g["task_id"] for g in result["references"] if g["task_id"].endswith("-b")}
    assert seconds == {"ref-t000-b", "ref-t001-b"}, [g["task_id"] for g in result["references"]]
    for g in result["tasks"]:
        c = g["checks"]["resume_equivalent"]
        assert c["verdict"] == "unknown" and "not deterministic" in c["detail"], c
        assert "BUILD_INFO" in c["detail"] and c["not_deterministic"] == ["BUILD_INFO"], c
    assert exit_code(result) == 2
    result, d = run_wave(runner=stamp(), volatile=[{"glob": "BUILD_INFO", "why": "a build stamp"}], **cfg)
    for g in result["tasks"]:
        c = g["checks"]["resume_equivalent"]
        assert c["verdict"] == "pass" and c["volatile"] == {"BUILD_INFO": "a build stamp"}, c
    assert not [g for g in result["references"] if g["task_id"].endswith("-b")]  # nothing differed: none run
    assert exit_code(result) == 0, [(g["task_id"], g["signature"]) for g in result["tasks"]]


def test_damage_under_a_fault_that_killed_nothing_is_a_fail_naming_the_lost_line(run_wave):
    """The hostile find: a task DF1 met but never killed lost a line of src/app.py and was graded `unknown` (it
    counted as a second uninterrupted run, so its damage "proved" the runner not deterministic). Now two
    uninterrupted runs that agree show it: `fail`, the line named."""
    result, d = run_wave(runner=stamp(STAMP="0", DAMAGE="1"), faults=["DF1"], tasks=1, concurrency=1, seed=43,
                         fault_timing={"DF1": {"after_model_calls": [2, 2], "window_s": [0.5, 0.5]}},
                         workload={"steps": 6, "think_ms": 20}, deadline_s=90)
    g = result["tasks"][0]
    assert g["attempts"] == 1 and g["checks"]["fault_applied"]["verdict"] == "pass", g["checks"]
    c = g["checks"]["resume_equivalent"]
    assert c["verdict"] == "fail" and c["damaged"] and " lost: " in c["detail"], c
    assert "ref-t000-b" in {r["task_id"] for r in result["references"]}
    assert exit_code(result) == 1


DEFECTIVE = str(ROOT / "tests" / "runners" / "defective.py")


def test_a_runner_the_harness_ended_on_an_overloaded_host_is_never_failed(run_wave):
    """The hostile find: 200 tasks on 2 cores (load ~100), 55 tasks `fail` though their own liveness check said the
    host was overloaded. Here the host is overloaded on purpose, by spinning processes outside every sandbox (nice
    19, so the harness and the runner still get the CPU; started and ended by PID), and the runner goes silent: the
    same wave that fails it on a quiet host (test_runners: exit 1) is `unknown` here, the load named, never `fail`."""
    import os
    import signal
    import subprocess

    cores = os.cpu_count() or 1
    spin = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
            for _ in range(5 * cores + 2)]
    try:
        result, d = run_wave(runner={"name": "defective-hang_always", "command": [sys.executable, DEFECTIVE],
                                     "env": {"DEFECT": "hang_always"}}, faults=["PK1"], tasks=1, concurrency=1,
                             seed=139, liveness_s=3, max_attempts=2, workload={"steps": 4, "think_ms": 20},
                             deadline_s=120)
    finally:
        for p in spin:
            p.send_signal(signal.SIGKILL)
        for p in spin:
            p.wait()
    hung = [g for g in result["tasks"] + result["references"] if g["verdict"] != "pass"]
    assert hung, "nothing hung: the runner's defect did not show"  # (the reference always hangs; a task killed by
    # its PK1 before its 2nd step resumes past it and may pass)
    for g in hung:
        assert g["verdict"] != "fail", (g["task_id"], g["signature"], g["checks"])
        # named as the load (or, on a machine loaded past what the harness itself stands, a harness fault)
        assert (g.get("overloaded") and "overloaded" in g["overloaded"]["why"]) or g["harness_fault"], \
            (g["task_id"], g["verdict"], {k: c["detail"][:200] for k, c in g["checks"].items()})
    assert not result["runner_failures"] and result["verdict"] != "fail" and exit_code(result) == 2


def test_a_runners_escape_laden_names_reach_no_terminal_raw(tmp_path):
    """The hostile find: tool names an agent declares were quoted raw in the dialect refusal, and from there reached
    `completed`'s detail, the CLI's `runner failure:` line on stderr and SUMMARY.md (ESC ]0; retitles a terminal,
    ESC ]52; writes its clipboard). The wave runs as a user runs it, and no raw control byte comes out."""
    import subprocess

    cfg = tmp_path / "wave.yaml"
    cfg.write_text(f"runner: {{name: escapes, command: [{sys.executable}, {ROOT / 'tests' / 'runners' / 'escapes.py'}]}}\n"
                   "tasks: 1\nconcurrency: 1\nfaults: none\nmax_attempts: 1\ndeadline_s: 60\n"
                   "workload: {steps: 2, think_ms: 10}\n")
    p = subprocess.run([str(Path(sys.executable).parent / "sandfleet"), "wave", "run", str(cfg), "--no-progress",
                        "--results", str(tmp_path / "results")], capture_output=True, timeout=600,
                       stdin=subprocess.DEVNULL)
    assert p.returncode in (1, 2), (p.returncode, p.stderr[-2000:])
    summary = next((tmp_path / "results").glob("w-*/SUMMARY.md")).read_bytes()
    for where, data in (("stdout", p.stdout), ("stderr", p.stderr), ("SUMMARY.md", summary)):
        raw = [c for c in data.decode("utf-8", "replace") if c not in "\n\t" and (ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0
                                                                                  or c == "\u202e")]
        assert not raw, (where, raw[:5], data[-1500:])
    assert b"\\x1b" in p.stderr + summary, (p.stderr[-1500:], summary[-1500:])  # said, but escaped


ODDNAME = str(ROOT / "tests" / "runners" / "oddname.py")


@pytest.mark.parametrize("disk, odd_exit", [("wipe", "0"), ("keep", "1"), ("torn", "0")])
def test_a_file_name_that_is_not_utf8_is_named_and_never_ends_the_wave(run_wave, disk, odd_exit):
    """A hostile review: one file named `odd\\xffname.txt` in the repo ended the whole wave as a harness error
    (exit 2, every verdict gone), under wipe, keep and torn. Now the wave is graded, the name is left out of the
    artifact, escaped, and no harness error is said."""
    faults = ["PK1"] if disk == "torn" else []
    timing = {"PK1": {"after_model_calls": [1, 1]}} if disk == "torn" else {}
    result, d = run_wave(runner={"name": "oddname", "command": [sys.executable, ODDNAME], "env": {"ODD_EXIT": odd_exit}},
                         faults=faults, fault_timing=timing, tasks=1, concurrency=1, seed=3, sandbox={"disk": disk},
                         workload={"steps": 2, "think_ms": 20}, deadline_s=90)
    assert not result["harness_errors"], result["harness_errors"]
    # every task graded, each by its own checks (what the grader makes of a capture that left a file out is theirs)
    assert result["tasks"] and all(g.get("checks") for g in result["tasks"] + result["references"])
    manifests = [p.read_text() for p in d.glob("artifacts/*/artifact.json")]
    assert manifests and all("odd\\\\xffname.txt" in m for m in manifests), manifests[:1]
    # the harness's own skip fails no reference (it once failed `completed`: "the runner fails on its own", exit 1);
    # the skip is named in the grade, escaped
    assert not result["runner_failures"], result["runner_failures"]
    for g in result["references"]:
        done = g["checks"]["completed"]
        assert done["verdict"] == "pass" and "odd\\xffname.txt" in done["detail"], (g["task_id"], done)
