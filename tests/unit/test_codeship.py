"""A runner's workdir shipped to a node (fleet/codeship.py): the snapshot is deterministic and names its bytes,
unpacks to files the sandbox user can read whatever the source's modes, checks its digest, leaves out what it is
told to (results, the wave's private dir) and refuses a workdir over the cap."""
from __future__ import annotations

import os

import pytest

from fleet import codeship


def _tree(root):
    (root / "pkg").mkdir(parents=True)
    (root / "agent.py").write_text("print('hi')\n")
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\necho\n")
    os.chmod(root / "run.sh", 0o700)
    os.symlink("agent.py", root / "link.py")
    os.chmod(root / "agent.py", 0o600)
    os.chmod(root, 0o700)


def test_the_snapshot_is_deterministic_and_unpacks_readable_by_anyone(tmp_path):
    src = tmp_path / "src"
    _tree(src)
    d1, data = codeship.snapshot(str(src))
    os.utime(src / "agent.py", (1, 1))  # times and owners are not part of it
    assert codeship.snapshot(str(src))[0] == d1
    out = codeship.unpack(data, str(tmp_path / "dst" / d1), d1)
    assert (tmp_path / "dst" / d1 / "pkg" / "mod.py").read_text() == "X = 1\n"
    assert os.stat(out).st_mode & 0o777 == 0o755
    assert os.stat(f"{out}/agent.py").st_mode & 0o777 == 0o644
    assert os.stat(f"{out}/run.sh").st_mode & 0o777 == 0o755
    assert os.readlink(f"{out}/link.py") == "agent.py"
    assert codeship.unpack(data, out, d1) == out  # again: already there and checked


def test_a_changed_file_is_another_digest_and_wrong_bytes_are_refused(tmp_path):
    src = tmp_path / "src"
    _tree(src)
    d1, data = codeship.snapshot(str(src))
    (src / "agent.py").write_text("print('changed')\n")
    assert codeship.snapshot(str(src))[0] != d1
    with pytest.raises(codeship.ShipError, match="do not match its digest"):
        codeship.unpack(data[:-1] + b"x", str(tmp_path / "dst"), d1)
    assert not (tmp_path / "dst").exists()


def test_excluded_dirs_are_left_out_and_the_cap_holds(tmp_path, monkeypatch):
    src = tmp_path / "src"
    _tree(src)
    (src / "results").mkdir()
    (src / "results" / "big.bin").write_bytes(b"x" * 1000)
    d_without, _ = codeship.snapshot(str(src), [str(src / "results")])
    assert d_without != codeship.snapshot(str(src))[0]
    monkeypatch.setattr(codeship, "MAX_BYTES", 500)
    with pytest.raises(codeship.ShipError, match="is over"):
        codeship.snapshot(str(src))
    assert codeship.snapshot(str(src), [str(src / "results")])[0] == d_without


def test_venvs_caches_git_and_what_sandfleetignore_names_are_left_out(tmp_path):
    """Every documented example failed on a cluster: `make examples` puts each venv (109 MB) in the runner's
    workdir and the snapshot refused anything over 64 MiB. A venv (found by its pyvenv.cfg, whatever its name),
    caches, .git and the globs of `.sandfleetignore` are left out; the node runs its own venv at the same path."""
    import io
    import tarfile

    src = tmp_path / "agent"
    _tree(src)
    for venv in ("venv-any-name", "sub/.venv"):
        (src / venv / "lib").mkdir(parents=True)
        (src / venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (src / venv / "lib" / "big.so").write_bytes(b"\0" * (65 * 1024 * 1024))
    for junk in ("__pycache__/a.pyc", ".git/HEAD", "data/cache.bin", "notes/keep.txt"):
        (src / junk).parent.mkdir(parents=True, exist_ok=True)
        (src / junk).write_text("x")
    (src / codeship.IGNORE_FILE).write_text("# local only\ndata\n*.log\n")
    (src / "run.log").write_text("x")
    _, data = codeship.snapshot(str(src))
    names = set(tarfile.open(fileobj=io.BytesIO(data)).getnames())
    assert {"agent.py", "pkg/mod.py", "notes/keep.txt", "sub", codeship.IGNORE_FILE} <= names, names
    assert not [n for n in names if n.startswith(("venv-any-name/", "sub/.venv/", "__pycache__", ".git", "data"))
                or n.endswith(".log")], names
    assert {"venv-any-name", "sub/.venv"} <= names  # (only its place: an empty dir, the node's own is mounted on)


def test_node_modules_is_an_environment_left_out_and_named_for_the_nodes(tmp_path):
    """A Node runner's `node_modules` (Codex CLI's: 404 MB with its per-platform binary) is an installed
    environment as a venv is: never shipped, and named (absolute path, as every node must have it) beside the
    venvs, so the wave checks each node for it and each node binds its own. Ignored or excluded ones are not."""
    import io
    import tarfile

    src = tmp_path / "agent"
    _tree(src)
    for env in ("node_modules/.bin", ".venv", "web/node_modules/pkg", "skip/node_modules", "results/.venv"):
        (src / env).mkdir(parents=True)
    (src / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (src / "results" / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (src / "node_modules" / ".bin" / "codex").write_bytes(b"\0" * (65 * 1024 * 1024))
    (src / "web" / "app.js").write_text("x")
    (src / codeship.IGNORE_FILE).write_text("skip\n")
    _, data = codeship.snapshot(str(src), [str(src / "results")])
    names = set(tarfile.open(fileobj=io.BytesIO(data)).getnames())
    assert "web/app.js" in names and not [n for n in names if "node_modules/" in n or ".venv/" in n], names
    # a read-only staged copy cannot make a mount point: each environment keeps its place as an empty dir
    assert {".venv", "node_modules", "web/node_modules"} <= names, names
    assert codeship.environments(str(src), [str(src / "results")]) == [
        str(src / ".venv"), str(src / "node_modules"), str(src / "web" / "node_modules")]
