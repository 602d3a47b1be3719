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
