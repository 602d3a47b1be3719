"""What the sandbox user can reach inside the sandbox: a path shows through its bind, so only the bind itself and
what is below it count (bwrap makes the directories above a bind 0755)."""
from __future__ import annotations

import os

from fleet.sandbox import command_problem, unreadable_by_sandbox_user


def test_only_the_bind_and_below_count(tmp_path):
    hidden = tmp_path / "home"  # like /root: mode 0700, not bound
    hidden.mkdir(mode=0o700)
    venv = hidden / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "agent"
    exe.write_text("#!/bin/sh\necho hi\n")
    os.chmod(hidden, 0o700)
    for mode, ok in ((0o755, True), (0o711, False), (0o700, False)):  # a script needs r as well as x
        exe.chmod(mode)
        assert (unreadable_by_sandbox_user([("x", str(exe))], [str(venv)]) == []) is ok, oct(mode)
    exe.chmod(0o755)
    os.chmod(venv, 0o700)  # the bind itself is 0700 (a venv made in `mktemp -d`)
    assert unreadable_by_sandbox_user([("x", str(exe))], [str(venv)]) == [("x", str(exe))]
    assert "not executable by the sandbox user (uid 65534)" in command_problem([str(exe)], "/usr/bin", [str(venv)])
    os.chmod(venv, 0o755)
    assert command_problem([str(exe)], "/usr/bin", [str(venv)]) is None
    assert unreadable_by_sandbox_user([("d", str(venv)), ("r", "/etc/hostname"), ("x", "/bin/sh")], [str(venv)]) == []
    assert unreadable_by_sandbox_user([("r", str(venv / "missing"))], [str(venv)]) == [("r", str(venv / "missing"))]


def test_a_bare_command_is_looked_up_as_the_sandbox_would(tmp_path):
    """A PATH entry the sandbox is not shown (like /root/.pyenv/shims on the driver's PATH) is skipped, as the
    sandbox's own lookup skips it; a command found only where the sandbox user cannot reach is named."""
    shims = tmp_path / "shims"
    shims.mkdir(mode=0o700)
    for name in ("python3", "agent-x"):
        (shims / name).write_text("#!/bin/sh\n")
        (shims / name).chmod(0o755)
    os.chmod(shims, 0o700)
    assert command_problem(["python3", "-c", "pass"], f"{shims}:/usr/bin:/bin", []) is None
    assert "not executable by the sandbox user" in command_problem(["agent-x"], f"{shims}:/usr/bin", [str(shims)])


def test_a_runner_named_by_its_path_inside_a_mount_is_checked_where_the_mount_comes_from(tmp_path):
    """On an isolated node the runner's workdir exists only as the node's staged copy, mounted at the workdir's
    path: a script named by that path (and a PATH entry under it) is found in the copy, not reported missing."""
    staged = tmp_path / "staged"
    (staged / "bin").mkdir(parents=True)
    (staged / "run.sh").write_text("#!/bin/sh\n")
    (staged / "bin" / "agent").write_text("#!/bin/sh\n")
    for f in (staged / "run.sh", staged / "bin" / "agent"):
        f.chmod(0o755)
    inside = "/tmp/no-such-workdir-here"
    mounts = {str(staged): inside}
    assert "not found" in command_problem([f"{inside}/run.sh"], "/usr/bin", [])
    assert command_problem([f"{inside}/run.sh"], "/usr/bin", [], mounts) is None
    assert command_problem(["agent"], f"{inside}/bin:/usr/bin", [], mounts) is None
    assert command_problem(["/bin/sh", f"{inside}/run.sh"], "/usr/bin", [], mounts) is None
    (staged / "run.sh").chmod(0o700)  # the copy itself unreadable by the sandbox user: named
    assert "not executable by the sandbox user" in command_problem([f"{inside}/run.sh"], "/usr/bin", [], mounts)
