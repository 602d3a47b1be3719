import os
import sys

from cluster.driver import RUNNERS_DIR, runtime_binds


def test_runner_binds_bring_code_and_interpreter_and_hide_results(tmp_path):
    work = tmp_path / "agent"
    (work / "results").mkdir(parents=True)
    (work / "agent.py").write_text("")
    runner = {"command": [sys.executable, str(work / "agent.py")], "workdir": str(work)}
    binds, hide = runtime_binds(runner, [work / "results", "/tmp/sandfleet-w-x"])
    assert str(work) in binds and RUNNERS_DIR in binds
    assert os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))) in binds  # the interpreter
    assert not any(b in ("/", "/usr", "/etc") for b in binds)
    assert hide == [str(work / "results")]  # a bind that would show results/ gets it covered


def test_bare_commands_bind_nothing_extra():
    binds, hide = runtime_binds({"command": ["/bin/true"]}, ["/tmp/x"])
    assert binds == [RUNNERS_DIR] and hide == []


def test_a_script_runner_brings_its_own_dir_not_the_dir_above_it(tmp_path):
    """`/tmp/x/run.sh` shows /tmp/x, never all of /tmp (other waves' dirs, a node's credentials); an executable in
    a `bin` dir still brings its installation prefix."""
    work = tmp_path / "x"
    (work / "bin").mkdir(parents=True)
    for f in (work / "run.sh", work / "bin" / "agent"):
        f.write_text("#!/bin/sh\n")
    binds, _ = runtime_binds({"command": [str(work / "run.sh")]}, [])
    assert binds == sorted([RUNNERS_DIR, str(work)]) and str(tmp_path) not in binds
    binds, _ = runtime_binds({"command": [str(work / "bin" / "agent")]}, [])
    assert str(work) in binds


def test_the_interpreter_a_scripts_shebang_names_is_shown_too(tmp_path):
    script = tmp_path / "agent"
    script.write_text(f"#!{sys.executable} -u\nprint('hi')\n")
    binds, _ = runtime_binds({"command": [str(script)]}, [])
    assert os.path.dirname(os.path.dirname(os.path.abspath(sys.executable))) in binds and str(tmp_path) in binds
    script.write_text("#!/usr/bin/env python3\n")
    assert runtime_binds({"command": [str(script)]}, [])[0] == sorted([RUNNERS_DIR, str(tmp_path)])


def test_a_path_right_under_a_top_level_dir_brings_only_itself(tmp_path):
    """`python3 /tmp/agent.py /tmp/data`: the script and the directory named, never all of /tmp (the host's /tmp,
    bound read-only over the sandbox's own, showed other sessions' files and made $TMPDIR read-only)."""
    import tempfile

    d = tempfile.mkdtemp(prefix="sf-bind-", dir="/tmp")
    script = tempfile.NamedTemporaryFile(prefix="sf-bind-", suffix=".py", dir="/tmp", delete=False).name
    try:
        binds, _ = runtime_binds({"command": [sys.executable, script, d]}, [])
        assert script in binds and d in binds and "/tmp" not in binds, binds
        sub = os.path.join(d, "data")
        os.mkdir(sub)
        binds, _ = runtime_binds({"command": [sys.executable, sub]}, [])
        assert sub in binds and d not in binds, binds  # a directory brings itself, not its parent
    finally:
        os.unlink(script)
        import shutil

        shutil.rmtree(d)
