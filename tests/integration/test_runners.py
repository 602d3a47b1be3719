"""Any command is a runner: black-box runners that import nothing of sandfleet, graded
only from what the harness recorded (captured workspace, model/effects/proxy logs)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cluster.grade import exit_code

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DEFECTIVE = str(ROOT / "tests" / "runners" / "defective.py")
QUICK = dict(tasks=2, concurrency=4, seed=21, workload={"steps": 8, "think_ms": 20}, deadline_s=60)


def defective(defect: str) -> dict:
    return {"name": f"defective-{defect}", "command": [sys.executable, DEFECTIVE], "env": {"DEFECT": defect}}


def test_an_effect_sent_before_its_commit_is_caught_as_a_double_effect(run_wave):
    result, d = run_wave(runner=defective("double_effect"), faults=[], **QUICK)
    for g in result["tasks"]:
        c = g["checks"]["no_double_apply"]
        assert c["verdict"] == "fail" and c["effects_applied_twice"], g["checks"]
        assert "no_double_apply" in g["signature"]
        assert c["applied_twice"] == []  # the workspace itself is fine: only the effects log shows it
    assert exit_code(result) == 1


def test_a_reask_of_a_recorded_step_is_caught_as_a_recall(run_wave):
    result, d = run_wave(runner=defective("recall"), faults=[], **QUICK)
    for g in result["tasks"]:
        c = g["checks"]["no_model_recall"]
        assert c["verdict"] == "fail" and c["model_recalls"] == 1, c
        assert c["recalls"][0]["step"] == 2 and c["recalls"][0]["attempt"] == 2
        assert g["checks"]["resume_equivalent"]["verdict"] == "pass"  # the artifact alone would not show it
        assert g["signature"] == "no_model_recall"


def test_a_runner_that_is_not_deterministic_is_unknown_not_pass(run_wave):
    result, _ = run_wave(runner=defective("noise"), faults=[], **QUICK)
    for g in result["tasks"]:
        c = g["checks"]["resume_equivalent"]
        assert c["verdict"] == "unknown" and "not deterministic" in c["detail"]
    assert result["verdict"] == "unknown" and exit_code(result) == 2


def test_a_missing_runner_command_fails_its_tasks_and_the_wave_exits_2(run_wave):
    result, d = run_wave(runner={"command": "/no/such/agent --flag"}, faults=[], tasks=2, concurrency=2, seed=3)
    for g in result["tasks"]:
        assert g["checks"]["completed"]["verdict"] == "fail"
        assert "runner command not found: /no/such/agent" in g["checks"]["completed"]["detail"]
        assert g["attempts"] == 1  # not retried: a missing command never starts
    assert any("no task could start" in e for e in result["harness_errors"])
    assert exit_code(result) == 2


def test_a_runner_the_sandbox_user_cannot_read_is_named_before_it_runs(run_wave, tmp_path):
    """A runner in a mode-0700 dir (a `mktemp -d`, a venv under /root): the sandbox user (uid 65534) cannot reach it.
    Each task fails at once naming the path and the fix (it was retried 6 times, `exec: Permission denied`)."""
    import os

    d0 = tmp_path / "private-agent"
    d0.mkdir(mode=0o700)
    script = d0 / "agent.sh"
    script.write_text("#!/bin/sh\necho working\n")
    script.chmod(0o755)
    os.chmod(d0, 0o700)
    result, d = run_wave(runner={"command": [str(script)], "workdir": str(d0), "name": "private"}, faults=[],
                         tasks=2, concurrency=2, seed=5)
    for g in result["tasks"]:
        detail = g["checks"]["completed"]["detail"]
        assert g["checks"]["completed"]["verdict"] == "fail" and g["attempts"] == 1, g["checks"]
        assert "not executable by the sandbox user (uid 65534)" in detail and str(script) in detail, detail
    assert any("no task could start" in e for e in result["harness_errors"])
    assert exit_code(result) == 2


def test_a_process_that_outlives_an_exit_0_is_named_and_fails_its_check(run_wave):
    """A runner that leaves a detached process (its own session) running when it exits 0: the host lists it at the
    attempt's end by its own /proc, the task fails `no_outliving_process` naming it, and it is killed with the
    sandbox (nothing is left)."""
    result, d = run_wave(runner=defective("daemon"), faults=[], **dict(QUICK, seed=135))
    for g in result["tasks"] + result["references"]:
        c = g["checks"]["no_outliving_process"]
        assert c["verdict"] == "fail" and "sleep" in c["detail"], c
        assert [p["name"] for o in c["outlived"] for p in o["processes"]] == ["sleep"], c["outlived"]
        assert g["checks"]["completed"]["verdict"] == "pass", g["checks"]["completed"]
    ends = [e for e in map(orjson.loads, (d / "timeline.jsonl").read_bytes().splitlines()) if e["event"] == "attempt_end"]
    assert ends and all(e["outlived"] == [{"pid": e["outlived"][0]["pid"], "name": "sleep"}] for e in ends), ends
    assert exit_code(result) == 1


def test_an_attempt_silent_past_liveness_is_ended_and_the_next_one_finishes_within_the_deadline(run_wave):
    """A runner whose first attempt hangs without a sound (no model call, effect or store request): the harness
    ends it once it was silent for `liveness_s` (3 s here, far from the 120 s deadline), and the second attempt
    finishes the task. The silence is still graded: `liveness` fails and says the harness ended it."""
    result, d = run_wave(runner=defective("hang"), faults=[], tasks=1, concurrency=1, seed=4, liveness_s=3,
                         workload={"steps": 6, "think_ms": 20}, deadline_s=120)
    events = [orjson.loads(x) for x in (d / "timeline.jsonl").read_bytes().splitlines()]
    ends = [e for e in events if e["event"] == "attempt_end" and e.get("task") == "t000"]
    assert len(ends) == 2 and ends[0]["cause"].startswith("killed: silent for "), ends
    assert ends[1]["exit_code"] == 0, ends
    silent = [e for e in events if e["event"] == "attempt_silent"]
    assert [e["sandbox"] for e in silent] == ["t000-a1"] and silent[0]["silent_s"] > 3, silent
    g = result["tasks"][0]
    assert g["checks"]["completed"]["verdict"] == "pass", g["checks"]["completed"]
    live = g["checks"]["liveness"]
    assert live["verdict"] == "fail" and "ended by the harness" in live["detail"], live


def test_a_runner_whose_own_reference_hangs_fails_as_the_runner_not_as_the_harness(run_wave):
    """Regression (a hostile user's find): a runner that goes silent in its own fault-free reference too was ended
    at `liveness_s` and reported as a broken positive control, a harness error (exit 2), which a CI retrying exit-2
    waves as flakes would never fail. `liveness` calls it a hang, so it is the runner's failure: exit 1, named."""
    result, d = run_wave(runner=defective("hang_always"), faults=["PK1"], tasks=1, concurrency=1, seed=139,
                         liveness_s=3, max_attempts=2, workload={"steps": 4, "think_ms": 20}, deadline_s=120)
    refs = result["references"]
    if any(g.get("overloaded") for g in refs):
        # the machine running this was itself overloaded while the reference was silent (a loaded suite): starved
        # or hung cannot be told, so the honest outcome is unknown (exit 2), named, never the runner's fail
        assert all(g["verdict"] != "fail" for g in refs) and exit_code(result) == 2, refs
        return
    assert refs and all(g["checks"]["liveness"]["verdict"] == "fail" for g in refs), refs
    assert not result["harness_errors"], result["harness_errors"]
    assert result["runner_failures"] and all("liveness" in f and "hung" in f for f in result["runner_failures"]), \
        result["runner_failures"]
    assert result["verdict"] == "fail" and exit_code(result) == 1


def test_a_runner_waiting_on_a_slow_model_is_not_silent(run_wave):
    """Regression (a hostile user's find): a model that thinks longer than `liveness_s` had the waiting runner
    killed as hung and, with the grading of hung references, blamed (exit 1). A call being answered is the
    harness's time: nothing is killed for silence, and `liveness` counts the answer's span as activity."""
    result, d = run_wave(runner="durable", faults=["PK1"], tasks=1, concurrency=1, seed=141, liveness_s=2.5,
                         max_attempts=3, workload={"steps": 3, "think_ms": 4000}, deadline_s=90,
                         fault_timing={"PK1": {"after_model_calls": [1, 2]}})
    events = [orjson.loads(x) for x in (d / "timeline.jsonl").read_bytes().splitlines()]
    assert not [e for e in events if e["event"] == "attempt_silent"], "a runner waiting on the model was killed"
    for g in result["tasks"] + result["references"]:
        assert g["checks"]["liveness"]["verdict"] == "pass", g["checks"]["liveness"]
    assert not result["runner_failures"] and not result["harness_errors"], result
    assert exit_code(result) == 0, result["verdict"]


def _peak_rss_reset() -> None:
    """Start the kernel's peak-RSS mark (VmHWM) of this process, the wave's driver, again from now."""
    Path("/proc/self/clear_refs").write_text("5")


def _rss_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def test_tasks_flooding_the_services_leave_the_harness_bounded_and_the_task_beside_them_passing(run_wave):
    """The first attempts of t000 and t001 flood the model endpoint and the effects service with their own valid
    keys (8 MiB bodies from 16 threads each, a negative Content-Length and a chunked body streamed at them, then
    200 idle connections) while t002 runs beside them. The services are threads of the driver (this process): its
    peak RSS over the wave stays within the services' large-body pool (the old reader took 4.6 GiB with one such
    runner and still graded pass; without the pool, the per-key in-flight cap alone let these two take 4 x 64 MiB
    of bodies at once); the flood met each bound (its own log says what each request got); t002 passes."""
    from fleet import netns, services

    rss_before = _rss_kib("VmRSS")
    _peak_rss_reset()
    # the flood's refused requests are no sign of life (only a model call or an effect is): a loaded machine can
    # stretch its 4 s past the default 30 s liveness bound, so that bound (and the deadline) is far from it here
    result, d = run_wave(runner=defective("flood"), faults=[], tasks=3, concurrency=4, seed=31, liveness_s=240,
                         workload={"steps": 6, "think_ms": 20}, deadline_s=300)
    peak_growth_mib = (_rss_kib("VmHWM") - rss_before) / 1024
    events = [orjson.loads(x) for x in (d / "timeline.jsonl").read_bytes().splitlines()]
    for task in ("t000", "t001"):
        log = (d / "sandboxes" / f"{task}-a1" / "runner.log").read_text()
        line = next((x for x in log.splitlines() if "flood: " in x), None)
        ended = [e for e in events if e.get("sandbox") == f"{task}-a1" and e["event"] in ("attempt_end",
                                                                                          "attempt_silent")]
        assert line is not None, (ended, log[-2000:])
        got = {k.strip(): int(v) for k, v in (part.rsplit(" x", 1) for part in line.split("flood: ", 1)[1].split(", "))}
        # the flood happened and met the bounds: most big bodies refused unread (429: the pool), the negative
        # length 400 and the chunked body 411 before a byte of them was read, the idle connections past the
        # sandbox's cap closed by its relay
        assert got.get("8MiB:429", 0) >= 16, got
        # (429 when the flood's own key had used its rate or in-flight share: refused unread as well)
        assert got.get("negative:400", 0) + got.get("negative:429", 0) == 2, got
        assert got.get("chunked:411", 0) + got.get("chunked:429", 0) == 2, got
        assert got.get("idle:closed by the harness", 0) >= 200 - netns.MAX_CONNECTIONS_PER_SERVICE, got
    print(f"flood: driver peak RSS +{peak_growth_mib:.0f} MiB; {got}")
    # the bound: per service the pool plus every connection's small body, 2 x (32 MiB + 512 x 256 KiB) = 320 MiB.
    # Measured +116 MiB (glibc's mmap threshold fixed at LARGE_BODY: freed bodies go back at once), +246-258 MiB
    # before that (glibc kept freed 8 MiB buffers resident), 4.6 GiB with the old reader
    bound_mib = 2 * (services.LARGE_BODY_POOL + services.MAX_CONNECTIONS * services.LARGE_BODY) / 2**20
    assert peak_growth_mib < bound_mib, (peak_growth_mib, bound_mib, got)
    honest = next(g for g in result["tasks"] if g["task_id"] == "t002")
    assert honest["verdict"] == "pass", {k: c for k, c in honest["checks"].items() if c["verdict"] != "pass"}


def test_a_runner_that_exits_0_without_the_steps_fails_completed(run_wave):
    """It also writes where the contract says a runner may (its TMPDIR, private /tmp): the write must succeed (an
    agent's session file there could not be opened when bwrap made /tmp root's 0755)."""
    lazy = 'set -e; test "$TMPDIR" = /tmp; echo a > "$TMPDIR/session.db"; mkdir /tmp/d; echo b > /tmp/d/f; cat /tmp/d/f'
    result, d = run_wave(runner={"command": ["/bin/sh", "-c", lazy], "name": "lazy"}, faults=[], tasks=1,
                         concurrency=1, seed=4)
    ends = [e for e in map(orjson.loads, (d / "timeline.jsonl").read_bytes().splitlines())
            if e["event"] == "attempt_end" and e.get("task") == "t000"]
    assert [e["exit_code"] for e in ends] == [0], (ends, (d / "sandboxes" / "t000-a1" / "runner.log").read_text())
    g = result["tasks"][0]
    assert g["checks"]["completed"]["verdict"] == "fail"
    assert "without doing every step" in g["checks"]["completed"]["detail"]
    assert result["verdict"] == "fail"
    # the harness captured the untouched workspace: the fixture only
    art = orjson.loads((d / "artifacts" / "t000" / "artifact.json").read_bytes())
    assert set(art["files"]) == {"README.md", "src/app.py", "src/util.py", "CHANGELOG.md"}


def test_league_writes_its_table_and_picture(fleet, tmp_path):
    """`sandfleet league` through the CLI, on the session's Ray (its own actors and store): the built-in two and an
    agent nobody here wrote (pydantic-ai, unmodified), one labelled fault set, one task each; every wave's plan
    carries the manifest the league compares (no warning: one machine)."""
    import ray

    agent = ROOT / "examples" / "pydantic_ai"
    if not (agent / ".venv" / "bin" / "python").exists():
        pytest.fail("examples/pydantic_ai/.venv is missing: run `make examples` (make test does)")
    cfg = tmp_path / "league.yaml"
    cfg.write_text("name: tiny\n"
                   f"runners: [durable, naive, {{name: pydantic-ai, command: .venv/bin/python run.py, workdir: {agent}}}]\n"
                   "fault_sets: [{faults: [PK1], label: PK1 at 3}]\n"
                   "wave: {tasks: 1, concurrency: 1, seed: 5, workload: {steps: 6, think_ms: 20},\n"
                   f"       address: '{ray.get_runtime_context().gcs_address}',\n"
                   "       fault_timing: {PK1: {after_model_calls: [3, 3]}}}\n")
    p = subprocess.run([sys.executable, "-m", "cluster.cli", "league", str(cfg), "--results", str(tmp_path / "r"),
                        "--no-progress"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "warning:" not in p.stderr, p.stderr[-2000:]
    out = next((tmp_path / "r").glob("league-tiny-*"))
    assert f"LEAGUE: {out / 'LEAGUE.md'}" in p.stdout
    table = (out / "LEAGUE.md").read_text()
    assert (out / "league.png").stat().st_size > 1000
    rows = [line for line in table.splitlines() if line.startswith("| durable | PK1 at 3 |")]
    assert rows and "| pass | 1/1 | 1/1 |" in rows[0], table
    # the agent keeps no state anywhere a new sandbox finds it: it starts over, and the table says so
    agent_row = next(line for line in table.splitlines() if line.startswith("| pydantic-ai | PK1 at 3 |"))
    assert "| fail | 0/1 | 0/1 |" in agent_row, table
    data = orjson.loads((out / "league.json").read_bytes())
    assert [(r["runner"], r["faults"], r["label"]) for r in data["rows"]] == [
        ("durable", ["PK1"], "PK1 at 3"), ("naive", ["PK1"], "PK1 at 3"), ("pydantic-ai", ["PK1"], "PK1 at 3")]
    assert all(r["interrupted"] == 1 for r in data["rows"])  # the boundary trigger landed mid-run
    page = (out / "index.html").read_text()  # the league as a page: each wave's id links to that wave's report
    assert "<table>" in page and "league.png" in page, page[:2000]
    assert all(f"href='waves/{r['wave_id']}/index.html'" in page for r in data["rows"]), page[:3000]
    for r in data["rows"]:
        m = orjson.loads(next((out / "waves").glob(f"{r['wave_id']}/plan.json")).read_bytes())["manifest"]
        assert m == r["manifest"] and m["runner"]["name"] == r["runner"] and m["harness"]["ray"], m
        assert m["sandbox"]["backend"] == "process" and m["machine"]["kernel"] and m["workload"]["code_digest"]


@pytest.mark.parametrize("code, sandbox, cause", [
    ("b = bytearray(600 * 1024 * 1024)", {"memory_mb": 128}, "OOM kill"),
    ("open('/workspace/f', 'wb').write(b'0' * 64 * 1024 * 1024)", {"workspace_mb": 16}, "workspace full"),
    ("import os, time\nfor i in range(1000):\n    if os.fork() == 0:\n        time.sleep(30)\n        os._exit(0)",
     {"pids_max": 32}, "pids limit"),
])
def test_an_attempt_says_why_it_ended(run_wave, code, sandbox, cause):
    """Diagnosable attempts: OOM, a full workspace and the pids limit are named, not just 'exit 137'."""
    result, d = run_wave(runner={"name": "limits", "command": [sys.executable, "-c", code]}, faults=[], tasks=1,
                         concurrency=1, seed=3, max_attempts=1, sandbox=sandbox)
    g = result["tasks"][0]
    assert g["attempts"] == 1 and cause in g["attempt_causes"][0], g["attempt_causes"]
    assert cause in (d / "SUMMARY.md").read_text()


def test_a_leaked_upload_fails_the_task_that_started_it(run_wave):
    """A runner that starts a multipart upload and walks away: the store audit finds it, and the task whose
    prefix it is under fails `no_leaked_upload` (not only the wave)."""
    result, d = run_wave(runner=defective("leak_upload"), faults=[], **QUICK)
    for g in result["tasks"] + result["references"]:
        c = g["checks"]["no_leaked_upload"]
        assert c["verdict"] == "fail" and c["uploads"][0]["key"].endswith(f"/{g['task_id']}/snapshot.tar"), c
        assert g["signature"] == "no_leaked_upload" and g["checks"]["completed"]["verdict"] == "pass"
    assert result["wave_checks"]["no_leaked_upload"] == "fail"
    assert exit_code(result) == 1


def test_a_defect_its_reference_shows_too_is_the_runners_failure_not_the_harness(run_wave):
    """Under faults, a runner that leaks an upload on every fault-free run too: its reference fails the same check.
    That is the runner's own failure (exit 1, named in SUMMARY), not a positive control the harness broke (exit 2,
    which a CI retrying exit-2 waves as flakes would never fail)."""
    # (a seed of its own: a reference cached by an earlier wave of this runner would not run here)
    result, d = run_wave(runner=defective("leak_upload"), faults=["PK1"],
                         fault_timing={"PK1": {"after_model_calls": [3, 3]}}, **dict(QUICK, seed=131))
    assert result["references"] and all(g["checks"]["no_leaked_upload"]["verdict"] == "fail"
                                        for g in result["references"]), result["references"]
    assert not result["harness_errors"], result["harness_errors"]
    assert len(result["runner_failures"]) == len(result["references"]), result["runner_failures"]
    assert all("no_leaked_upload" in f for f in result["runner_failures"])
    assert result["verdict"] == "fail" and exit_code(result) == 1
    summary = (d / "SUMMARY.md").read_text()
    assert "The runner fails with no fault at all" in summary and "Harness errors" not in summary


def test_a_wrapper_that_execs_a_missing_script_is_the_runners_failure_quoting_what_it_said(run_wave):
    """A wrapper that execs a script that is not there: python's `can't open file` is the failure's cause, so each
    attempt is `diagnosable`, and the wave's runner failure quotes that line (it said "no line of output")."""
    result, d = run_wave(runner={"command": [str(ROOT / "tests" / "runners" / "missing_script.sh")],
                                 "name": "missing-script"}, faults=["PK1"], **dict(QUICK, seed=137))
    assert result["references"] and not result["harness_errors"], result["harness_errors"]
    for g in result["tasks"] + result["references"]:
        assert g["checks"]["completed"]["verdict"] == "fail", g["checks"]
        assert g["checks"]["diagnosable"]["verdict"] == "pass", g["checks"]["diagnosable"]
    assert result["runner_failures"] and all("can't open file '/no/such/dir/agent.py'" in f
                                             for f in result["runner_failures"]), result["runner_failures"]
    assert exit_code(result) == 1
    assert "can't open file" in (d / "SUMMARY.md").read_text()


@pytest.mark.parametrize("runner", ["storm", "durable"])
def test_a_retry_storm_in_an_outage_fails_retry_loop_with_its_figures(run_wave, runner):
    """A runner that retries a failed store call at once: an outage (ST1, armed right after the 2nd model answer so
    it meets the next journal write) becomes a storm, which `retry_loop` fails with its count and rate, although
    every answer in it was the fault's. durable, backing off, meets the same outage and passes."""
    result, d = run_wave(runner=defective("storm") if runner == "storm" else "durable", faults=["ST1"], tasks=1,
                         concurrency=1, seed=133, workload={"steps": 6, "think_ms": 20}, deadline_s=60,
                         fault_timing={"ST1": {"after_model_calls": [2, 2], "window_s": [3.0, 3.0]}})
    receipts = orjson.loads((d / "faults.json").read_bytes())
    assert [r["status"] for r in receipts] == ["applied"], receipts
    g = result["tasks"][0]
    c = g["checks"]["retry_loop"]
    print(runner, c["detail"])
    if runner == "durable":
        assert g["verdict"] == "pass", g["checks"]
        return
    assert c["verdict"] == "fail" and c["storm"]["requests"] >= 20 and c["storm"]["per_s"] > 20, c
    assert "no backoff" in c["detail"]


def test_evidence_of_a_failed_task_never_shows_its_keys(run_wave):
    """A runner that prints its whole environment and its store credentials, then fails: neither the evidence
    written for the failure nor the raw log has any of them (the raw log shows where each was printed)."""
    leak = ('env; eval "$(sed -n "s/^credential_process *= *//p" "$AWS_CONFIG_FILE")"; '
            'echo "Authorization: Bearer $OPENAI_API_KEY"; echo "fatal: giving up"; exit 1')
    result, d = run_wave(runner={"command": ["sh", "-c", leak], "name": "leaky"}, faults=[], tasks=1,
                         concurrency=1, seed=9, max_attempts=1, deadline_s=30)
    g = result["tasks"][0]
    assert g["verdict"] == "fail" and g["checks"]["diagnosable"]["verdict"] == "pass", g["checks"]
    raw = (d / "sandboxes" / "t000-a1" / "runner.log").read_text()
    import re

    shapes = r"sf-[A-Za-z0-9_-]{32}"
    # the model key, the effects key, the bearer header and the store secret were printed, and taken out of results/
    for printed in ("OPENAI_API_KEY=<redacted>", "SANDFLEET_EFFECTS_KEY=<redacted>", "Bearer <redacted>"):
        assert printed in raw, (printed, raw[:2000])
    assert re.search(r'"SecretAccessKey": ?"<redacted>"', raw), raw[:2000]
    keys = set(re.findall(shapes, raw)) | {k for k in re.findall(r'"SecretAccessKey": ?"([^"]+)"', raw)
                                           if k != "<redacted>"}
    assert not keys, keys
    ev = d / "evidence" / "t000"
    files = sorted(ev.iterdir())
    assert {p.name for p in files} >= {"grade.json", "attempts.json", "runner-logs.txt", "around-faults.json"}
    text = "".join(p.read_text() for p in files)
    assert "fatal: giving up" in text
    assert not re.findall(shapes, text) and not re.findall(r'"SecretAccessKey": ?"(?!<redacted>)', text), text[:2000]
    assert re.search(r'"SecretAccessKey": ?"<redacted>', text)  # the secret was in the log tail the evidence shows


@pytest.mark.parametrize("agent,dialect", [("shell_agent.py", "shell"), ("text_agent.py", "text")])
def test_an_agent_that_speaks_only_one_dialect_passes_an_uninterrupted_wave(tmp_path, agent, dialect):
    """A tiny agent that knows none of the workload's tools (a `bash` tool only, or one fenced bash block per
    answer) does every step through the model's commands: its wave passes (the positive control), and every model
    call of it was answered in its dialect."""
    import orjson

    runner = Path(__file__).resolve().parents[1] / "runners" / agent
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", "--tasks", "2", "--concurrency", "2",
                        "--faults", "none", "--steps", "6", "--runner-cmd", f"python3 {runner}", "--results",
                        str(tmp_path / "r"), "--no-progress"], cwd=Path(__file__).resolve().parents[2],
                       capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")})
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    wave = (tmp_path / "r" / "latest").resolve()
    calls = [orjson.loads(x) for x in (wave / "model-calls.jsonl").read_bytes().splitlines()]
    assert calls and {c["dialect"] for c in calls} == {dialect}, {c["dialect"] for c in calls}
    assert {c["kind"] for c in calls} == {"tool", "final"}
