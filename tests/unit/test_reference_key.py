"""The reference cache's key is the runner's content, never its path (issue 45): the same runner copied or checked out
elsewhere reuses its references; a change of its code, its workdir's files, its env, the workload, the steps or the
seed runs them again."""
import os
import sys

from cluster.artifacts import reference_key, runner_digest


def _runner(d, body: str = "print('hi')\n", workdir: bool = True) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.py").write_text(body)
    (d / "lib").mkdir(exist_ok=True)
    (d / "lib" / "helper.py").write_text("X = 1\n")
    return {"name": "mine", "command": [sys.executable, str(d / "run.py")], "env": {"A": "1"},
            "workdir": str(d) if workdir else None}


def test_the_same_runner_at_another_path_keys_the_same(tmp_path):
    a, b = _runner(tmp_path / "a"), _runner(tmp_path / "elsewhere" / "b")
    os.utime(tmp_path / "elsewhere" / "b" / "run.py", (1, 1))  # a copy's mtime differs
    assert reference_key(a, "patch-repo", 6, 3) == reference_key(b, "patch-repo", 6, 3)


def test_what_the_runner_is_changes_the_key(tmp_path):
    r = _runner(tmp_path / "a")
    before = reference_key(r, "patch-repo", 6, 3)
    assert reference_key(r, "patch-repo", 6, 4) != before
    assert reference_key(r, "patch-repo", 7, 3) != before
    assert reference_key(r, "other", 6, 3) != before
    assert reference_key(dict(r, env={"A": "2"}), "patch-repo", 6, 3) != before
    (tmp_path / "a" / "lib" / "helper.py").write_text("X = 2\n")  # a file of the workdir
    os.utime(tmp_path / "a" / "lib" / "helper.py", (5, 5))  # (a digest is remembered while size and mtime stay)
    after_lib = reference_key(r, "patch-repo", 6, 3)
    assert after_lib != before
    (tmp_path / "a" / "run.py").write_text("print('ho')\n")  # the script itself
    os.utime(tmp_path / "a" / "run.py", (5, 5))
    assert reference_key(r, "patch-repo", 6, 3) not in (before, after_lib)


def test_a_script_outside_any_workdir_is_keyed_by_its_bytes_and_a_bare_command_by_its_words(tmp_path):
    a = _runner(tmp_path / "a", workdir=False)
    b = _runner(tmp_path / "b", workdir=False)
    c = _runner(tmp_path / "c", body="print('other')\n", workdir=False)
    assert runner_digest(a) == runner_digest(b) != runner_digest(c)
    sh = {"name": "sh", "command": ["sh", "-c", "echo hi"], "env": {}}
    assert runner_digest(sh) == runner_digest(dict(sh)) != runner_digest(dict(sh, command=["sh", "-c", "echo ho"]))


def test_a_builtin_runner_keys_the_same_every_time():
    from cluster.config_fields import resolve_runner

    r = resolve_runner("durable")
    keys = {reference_key(r, "patch-repo", 10, s) for s in range(50)}
    assert len(keys) == 50 and reference_key(r, "patch-repo", 10, 7) in keys
