"""A failed reference (the fault-free positive control) is the runner's own failure only when the runner ended every
attempt by itself and every check it did not pass failed; anything the harness did (a kill, a start error, an
unknown check) keeps it a broken positive control, which is a harness error."""
from __future__ import annotations

from types import SimpleNamespace

from cluster.grade import runner_failures, runner_own_failure
from cluster.grade.wave import _control_errors  # (the one module's own helper, tested here)

LEAK = {"verdict": "fail", "detail": "upload 1a2b of w/ref-t000/snapshot.tar was never completed or aborted"}
OK = {"verdict": "pass", "detail": ""}


def _wave(*ends: dict, ready: bool = True) -> SimpleNamespace:
    return SimpleNamespace(timeline=[{"event": "parts_ready"}] * ready + [
        {"event": "attempt_end", "task": "ref-t000", "attempt": i + 1, "exit_code": 0, "killed_by": None,
         "error": None, "start_error": None, **e} for i, e in enumerate(ends)],
                           plan={"tasks": [{"task_id": "t000", "faults": [{"fault_id": "PK1"}]}]}, hfault=None)


def _ref(**checks) -> dict:
    return {"task_id": "ref-t000", "verdict": "fail" if any(c["verdict"] == "fail" for c in checks.values())
            else "unknown", "checks": {"completed": OK, **checks}}


def test_a_leak_on_a_run_the_runner_ended_itself_is_its_own_failure():
    w, g = _wave({}), _ref(no_leaked_upload=LEAK)
    assert runner_own_failure(w, g) == [f"no_leaked_upload: {LEAK['detail']}"]
    assert _control_errors(w, [g]) == []
    assert "ref-t000" in runner_failures(w, [g])[0] and "no_leaked_upload" in runner_failures(w, [g])[0]
    assert runner_failures(w, [g])[0].endswith("its last line of output: none (it printed nothing)")
    key = "sf-" + "k" * 32  # a key of the harness's shape, as a re-grade (which no longer knows the values) sees it
    h = SimpleNamespace(log_tails={1: "x", 2: f"working\nfatal: {key} refused\n\n"})
    said = runner_failures(w, [g], {"ref-t000": h})[0]
    assert said.endswith("its last line of output: 'fatal: sf-<redacted> refused'"), said


def test_an_exit_1_before_the_steps_on_every_attempt_is_its_own_failure():
    w = _wave({"exit_code": 1}, {"exit_code": 1})
    g = _ref(completed={"verdict": "fail", "detail": "state=failed (out of attempts)"},
             attempt_budget={"verdict": "fail", "detail": "2 of 2 attempts"})
    assert runner_own_failure(w, g) and _control_errors(w, [g]) == []


def test_a_runner_that_never_finishes_is_its_own_failure_though_artifact_checks_are_unknown():
    """A silent exit 1 on every attempt: no artifact, so `no_double_apply` is unknown ("no artifact to inspect");
    `completed` failing by the runner's own exits is enough."""
    w = _wave({"exit_code": 1}, {"exit_code": 1})
    g = _ref(completed={"verdict": "fail", "detail": "state=failed (max_attempts 2 reached)"},
             no_double_apply={"verdict": "unknown", "detail": "no artifact to inspect"})
    assert runner_own_failure(w, g) == ["completed: state=failed (max_attempts 2 reached)"]
    assert _control_errors(w, [g]) == []


def test_a_reference_killed_for_a_silence_liveness_calls_a_hang_is_its_own_failure():
    """The harness ends a silent attempt at `liveness_s`; when `liveness` fails it (a hang, the host not
    overloaded), that reference is the runner's failure (exit 1), not a broken control (exit 2)."""
    silent = {"exit_code": None, "killed_by": "silent for 3 s (liveness_s 3)"}
    w = _wave(silent, silent)
    g = _ref(completed={"verdict": "fail", "detail": "state=failed (max_attempts 2 reached)"},
             liveness={"verdict": "fail", "detail": "attempt 1 went 3.2 s with no model call ...: hung"},
             no_double_apply={"verdict": "unknown", "detail": "no artifact to inspect"})
    assert runner_own_failure(w, g) and _control_errors(w, [g]) == []
    assert "liveness: attempt 1 went" in runner_failures(w, [g])[0]


def test_what_the_harness_did_keeps_it_a_broken_positive_control():
    silent = {"exit_code": None, "killed_by": "silent for 3 s (liveness_s 3)"}
    cases = [
        (_wave({"exit_code": None, "killed_by": "deadline"}), _ref(completed={"verdict": "fail", "detail": "x"})),
        # killed for a silence on an overloaded host: starved or hung cannot be told
        (_wave(silent), _ref(completed={"verdict": "fail", "detail": "x"},
                             liveness={"verdict": "unknown", "detail": "while the host was overloaded"})),
        # a silence kill and a deadline kill: the deadline is the harness's
        (_wave(silent, {"exit_code": None, "killed_by": "deadline"}),
         _ref(completed={"verdict": "fail", "detail": "x"}, liveness={"verdict": "fail", "detail": "hung"})),
        (_wave({"exit_code": None, "start_error": "the sandbox did not start"}),
         _ref(completed={"verdict": "fail", "detail": "the sandbox did not start"})),
        (_wave({"error": "host lost"}), _ref(no_leaked_upload=LEAK)),
        (_wave({}), _ref(no_leaked_upload=LEAK, liveness={"verdict": "unknown", "detail": "overloaded"})),
        (_wave(), _ref(no_leaked_upload=LEAK)),  # no attempt recorded at all
    ]
    for w, g in cases:
        assert runner_own_failure(w, g) is None, (w.timeline, g)
        assert runner_failures(w, [g]) == []
        errs = _control_errors(w, [g])
        assert errs and errs[0].startswith("positive control 0/1"), errs


def test_a_wave_that_never_reached_its_parts_says_nothing_of_a_positive_control():
    """A cluster that refused the driver (no token): the wave failed at set-up, and a "positive control 0/2" beside
    the real error sent the user looking at the runner."""
    assert _control_errors(_wave(ready=False), [_ref(completed={"verdict": "unknown", "detail": "no task_end"})]) == []
