"""Every damaged input is an error with a name (issue 42, item 6): `wave resume`, `wave replay`, `shrink`, `grade`,
`report`, `serve` and `verify`, given a real wave's plan.json, faults.json, grade, verdict and seal files with any
field set to any JSON value, deleted, or the whole file replaced (any JSON value, torn bytes), exit 0, 1, 2 or 254,
never with a traceback; an error names the file (and the field); nothing printed holds a raw control byte; and no
path is built from an id the plan gave unchecked. The running of a wave itself is stubbed (these are unit tests of
the CLI's reading): what reaches it has passed every check."""
from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import cli, results, serve
from cluster.wave.errors import HarnessError
from tests.unit.test_grade_fuzz import FIXTURE, json_values, no_picture  # noqa: F401 - a fixture, used by name

TASK = "t000"
FILES = (results.PLAN, f"{TASK}.grade.json", results.VERDICT, results.SEAL_MANIFEST, results.SEAL, results.FAULTS,
         results.STORE_AUDIT, results.SANDBOX_SWEEP, results.SWEEPER)
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
PLAN_IDS = ("wave_id", "task_id", "instance", "reference_of")


def _paths(x, at=()):
    """Every path into a JSON value (keys and list indexes), the root first."""
    yield at
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, at + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _paths(v, at + (i,))


@st.composite
def damage(draw):
    """(file, path into it, what): set a value, delete it, or replace the whole file with JSON or torn bytes."""
    name = draw(st.sampled_from(FILES))
    how = draw(st.sampled_from(["set", "set", "set", "delete", "file", "torn"]))
    return name, draw(st.integers(0, 10_000)), how, draw(json_values), draw(st.binary(max_size=40))


def _apply(d: Path, name: str, pick: int, how: str, value, raw: bytes) -> None:
    p = d / name
    if how == "torn":
        p.write_bytes(p.read_bytes()[: pick % max(1, p.stat().st_size)] + raw)
        return
    if how == "file":
        p.write_bytes(orjson.dumps(value))
        return
    doc = orjson.loads(p.read_bytes())
    paths = [x for x in _paths(doc) if x] or [()]
    at = paths[pick % len(paths)]
    if not at:
        p.write_bytes(orjson.dumps(value))
        return
    parent = doc
    for k in at[:-1]:
        parent = parent[k]
    if how == "delete":
        del parent[at[-1]]
    else:
        parent[at[-1]] = value
    p.write_bytes(orjson.dumps(doc))


@pytest.fixture(scope="module")
def base(tmp_path_factory, no_picture):  # noqa: F811 - the fixture imported above
    """A real wave's folder, sealed, whose t000 failed with a signature (so `shrink` reads as far as it can), its
    timeline cut before wave_end (so `wave resume` reads as far as it can)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SANDFLEET_SEAL_KEY", str(tmp_path_factory.mktemp("key") / "seal.key"))
    d = tmp_path_factory.mktemp("base") / "w"
    shutil.copytree(FIXTURE, d)
    lines = (d / results.TIMELINE).read_bytes().splitlines(keepends=True)
    (d / results.TIMELINE).write_bytes(b"".join(x for x in lines if b'"event":"wave_end"' not in x))
    from cluster.report import write_summary
    from cluster.grade import grade_wave

    write_summary(d, grade_wave(d))
    g = orjson.loads((d / f"{TASK}.grade.json").read_bytes())
    (d / f"{TASK}.grade.json").write_bytes(orjson.dumps(dict(g, verdict="fail", signature="no_model_recall")))
    from cluster.seal import seal

    seal(d)
    yield d
    mp.undo()


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    """Nothing runs: a wave that passed every check reaches `run_wave` (stubbed: exit 0), a shrink reaches preflight
    (stubbed: a harness error, exit 2); a resume's private dir is under a temporary dir, with its store there."""
    private = tmp_path_factory.mktemp("private")
    reached = []
    mp = pytest.MonkeyPatch()
    mp.setattr("cluster.cli.wave.run_wave", lambda cfg, make_wave, before=None: reached.append("run") or 0)
    mp.setattr("cluster.cli.wave.private_dir", lambda wave_id: _private(private, wave_id))

    def preflight(cfg):
        reached.append("preflight")
        raise HarnessError("fuzz: nothing runs past preflight")

    mp.setattr("cluster.driver.preflight", preflight)
    yield reached
    mp.undo()


def _private(root: Path, wave_id: str) -> Path:
    assert "/" not in wave_id and ".." not in wave_id and RAW.search(wave_id) is None, wave_id  # checked before use
    (root / wave_id / "store").mkdir(parents=True, exist_ok=True)
    return root / wave_id


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main([str(a) for a in argv])
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


COMMANDS = {
    "resume": lambda d: ("wave", "resume", d, "--no-progress"),
    "replay": lambda d: ("wave", "replay", d / TASK, "--no-progress"),
    "shrink": lambda d: ("shrink", d / TASK, "--anyway", "--no-progress"),
    "grade": lambda d: ("grade", d),
    "report": lambda d: ("report", d),
    "verify": lambda d: ("verify", d),
}


@settings(max_examples=int(os.environ.get("SF_FUZZ_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damaged=damage(), command=st.sampled_from(sorted(COMMANDS)))
def test_every_damaged_input_is_an_error_with_a_name(tmp_path_factory, base, stubs, damaged, command):
    d = tmp_path_factory.mktemp("wave") / "w"
    shutil.copytree(base, d, symlinks=True)
    name = damaged[0]
    before = (d / name).read_bytes()
    _apply(d, *damaged)
    same = (d / name).read_bytes() == before
    stubs.clear()
    code, out, err = _cli(*COMMANDS[command](d))  # a traceback would escape as an exception, failing the test
    assert code in (0, 1, 2, 254), (command, code, out, err)
    assert not RAW.search(out + err), (command, out, err)
    if code in (2, 254) and not out and "preflight" not in stubs:  # (graded `unknown` is exit 2 too, on stdout)
        assert err.startswith("error:") or "warning:" in err, (command, code, err)
        assert re.search(r"\.json|RESULTS_DIR|TASK_PATH|field|argument", err), (command, err, damaged)
    if command == "shrink" and name != f"{TASK}.grade.json" and code == 0:  # t000 failed: shrunk, or refused
        raise AssertionError(("shrink", out, err, damaged))
    if command == "verify" and not same:  # the seal covers every one of these files
        if name == results.SEAL:  # (damaged: exit 2; a change that leaves it the same seal: 0)
            assert code in (0, 2), (code, out, err)
        elif name == results.SEAL_MANIFEST:
            assert code == 2, (code, out, err)
        else:
            assert code == 1 and f"changed: {name}" in err, (code, out, err)
    if name == results.PLAN and command in ("resume", "replay") and code == 0:
        assert stubs and stubs[-1] == "run", (command, out, err)
    # serve's index over the same folder: the wave's row is there, a damaged file named on it
    rows = serve.collect(d.parent)
    assert [r["dir"] for r in rows] == ["w"]
    page = serve.index_html(d.parent, rows)
    assert "<td>" in page and not RAW.search(page)


@pytest.mark.parametrize("wave_id", ["../../etc", "/etc", "a/b", "..", ".hidden", "w\x1b]0;x\x07", "", 7, None])
def test_resume_never_builds_a_path_from_a_wave_id_it_did_not_check(tmp_path, stubs, wave_id):
    """A hostile review's find: `wave resume` used a plan's `wave_id` of `../../etc` in a /tmp path."""
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    plan = orjson.loads((d / results.PLAN).read_bytes())
    (d / results.PLAN).write_bytes(orjson.dumps(dict(plan, wave_id=wave_id)))
    code, out, err = _cli("wave", "resume", d)
    assert code == 2 and "field `wave_id`" in err and "plan.json" in err, (code, err)
    assert not RAW.search(err)


@pytest.mark.parametrize("command", ["resume", "replay", "shrink"])
@pytest.mark.parametrize("change, field", [
    (lambda p: p.pop("config"), "field `config`: missing"),
    (lambda p: p.update(config="local"), "field `config`: value 'local'"),
    (lambda p: p.pop("runner"), "field `runner`: missing"),
    (lambda p: p["tasks"][0]["faults"][0].update(params="after=3"), "field `tasks[0].faults[0].params`"),
    (lambda p: p["tasks"][0].update(task_id="../t000"), "field `tasks[0].task_id`"),
    (lambda p: p.update(tasks={"t000": 1}), "field `tasks`"),
])
def test_the_plan_fields_a_review_broke_are_named(tmp_path, stubs, command, change, field):
    """A hostile review's finds: `wave resume` of a plan.json with no `config`, or `config` a string, and `shrink`
    of one with no `runner` or a fault's `params` a string, were tracebacks (exit 1)."""
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    plan = orjson.loads((d / results.PLAN).read_bytes())
    change(plan)
    (d / results.PLAN).write_bytes(orjson.dumps(plan))
    (d / results.TIMELINE).write_bytes(b"".join(x for x in (d / results.TIMELINE).read_bytes().splitlines(True)
                                                if b'"event":"wave_end"' not in x))
    code, out, err = _cli(*COMMANDS[command](d))
    assert code == 2 and field in err and str(d / results.PLAN) in err, (code, err)


@pytest.mark.parametrize("command", ["resume", "replay", "shrink", "grade", "report", "verify", "serve"])
@pytest.mark.parametrize("arg", ["", "{missing}"])
def test_an_empty_or_missing_directory_argument_is_254_named(tmp_path, stubs, command, arg):
    """`''` is never the current directory, and a path that does not exist is bad input (254), named."""
    arg = arg.format(missing=tmp_path / "nope")
    argv = {"resume": ("wave", "resume", arg), "replay": ("wave", "replay", arg), "shrink": ("shrink", arg),
            "grade": ("grade", arg), "report": ("report", arg), "verify": ("verify", arg),
            "serve": ("serve", arg)}[command]
    code, out, err = _cli(*argv)
    assert code == 254 and re.search("RESULTS_DIR|TASK_PATH|RESULTS_ROOT", err), (code, err)


@pytest.mark.parametrize("command", ["resume", "replay", "shrink", "grade", "report"])
@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_plan_that_is_a_fifo_or_a_link_is_named_never_read(tmp_path, stubs, command, kind):
    """A plan.json that is a FIFO would hang a plain read, and a link to a huge file would be read whole: both are
    named without being read (exit 2, or 254 where the folder is then no wave's)."""
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    (d / results.PLAN).rename(tmp_path / "real-plan.json")
    if kind == "fifo":
        os.mkfifo(d / results.PLAN)
    else:
        os.symlink(tmp_path / "real-plan.json", d / results.PLAN)
    code, out, err = _cli(*COMMANDS[command](d))
    assert code in (2, 254) and "plan.json" in err, (code, out, err)


def test_resume_of_a_wave_whose_timeline_is_a_fifo_is_named_never_hangs(tmp_path, stubs):
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    (d / results.TIMELINE).unlink()
    os.mkfifo(d / results.TIMELINE)
    code, out, err = _cli("wave", "resume", d)
    assert code == 2 and "timeline.jsonl" in err and "not a regular file" in err, (code, err)


@pytest.mark.parametrize("name", [results.STORE_AUDIT, results.FAULTS, f"{TASK}.grade.json", results.SWEEPER,
                                  results.SANDBOX_SWEEP, results.PLAN])
@pytest.mark.parametrize("command", ["grade", "report"])
def test_a_fifo_in_place_of_a_stored_file_is_named_never_waited_on(tmp_path, base, name, command):
    """A hostile review's find: a FIFO in place of store-audit.json, faults.json or t000.grade.json hung `grade`
    forever, and plan.json as a FIFO was "has no plan.json" (254). Every stored file is read only when it is a
    regular file; a file the grade writes (t000.grade.json) is replaced whole, never written through. (Run in a child
    with a timeout: a hang must fail the test, not the suite.)"""
    import subprocess
    import sys

    d = tmp_path / "w"
    shutil.copytree(base, d, symlinks=True)
    (d / name).unlink()
    os.mkfifo(d / name)
    p = subprocess.run([sys.executable, "-m", "cluster.cli", command, str(d)], capture_output=True, text=True,
                       timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert "Traceback" not in p.stderr
    if name.endswith(".grade.json"):  # an output of the grade: replaced by the new grade
        assert (d / name).is_file() and orjson.loads((d / name).read_bytes())["task_id"] == TASK
        return
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert f"{name}: not a regular file" in p.stdout + p.stderr + (
        (d / "SUMMARY.md").read_text() if (d / "SUMMARY.md").is_file() else ""), (p.stdout, p.stderr)
