"""Reading a workspace back survives any tree a runner leaves: 1,300 directories deep (os.walk raised
RecursionError out of the host's run), links to host files, more files than the cap; what a cap left out is named."""
from __future__ import annotations

import os

from fleet.sandbox import artifacts as sandbox  # (the caps are read there)
from fleet.sandbox import read_tree


def _deep(root, levels: int) -> list[int]:
    """`levels` nested dirs named d under root, made by directory fds as a runner would (the whole path is longer
    than PATH_MAX); returns the fds, root's first."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    for _ in range(levels):
        os.mkdir("d", dir_fd=fds[-1])
        fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    return fds


def _remove_deep(fds: list[int]) -> None:
    for parent, child in zip(reversed(fds[:-1]), reversed(fds[1:])):
        for name in os.listdir(child):
            os.unlink(name, dir_fd=child)
        os.close(child)
        os.rmdir("d", dir_fd=parent)
    os.close(fds[0])


def test_a_tree_deeper_than_python_can_recurse_is_read_up_to_the_cap(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "top.txt").write_text("top")
    fds = _deep(root, 1300)
    try:
        fd = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fds[-1])
        os.close(fd)
        out = read_tree(str(root))
    finally:
        _remove_deep(fds)
    assert out["files"] == {"top.txt": b"top"}
    assert out["capped"] == [f"artifact capture skipped: depth > {sandbox.MAX_ARTIFACT_DEPTH}"]
    assert len(out["skipped"]) == 1 and out["skipped"][0].count("/") == sandbox.MAX_ARTIFACT_DEPTH


def test_links_are_skipped_and_a_file_cap_is_named(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "a" / "b").mkdir(parents=True)
    for i in range(5):
        (root / "a" / "b" / f"f{i}.txt").write_text(str(i))
    os.symlink("/etc/passwd", root / "passwd")
    os.symlink("/etc", root / "etc")
    out = read_tree(str(root))
    assert sorted(out["files"]) == [f"a/b/f{i}.txt" for i in range(5)] and out["skipped"] == ["etc", "passwd"]
    assert "capped" not in out  # links are skipped, not a cap
    monkeypatch.setattr(sandbox, "MAX_ARTIFACT_FILES", 3)
    out = read_tree(str(root))
    assert len(out["files"]) == 3 and out["capped"] == ["artifact capture skipped: files > 3"]


def test_a_name_that_is_not_utf8_is_named_escaped_and_left_out(tmp_path):
    """A hostile review: one file a runner named `odd\\xffname.txt` ended the whole wave as a harness error (its
    name, with a surrogate in it, reached orjson and an .encode()). It is left out, named escaped, and the rest is
    read; everything returned can be written as JSON."""
    import orjson

    root = tmp_path / "repo"
    root.mkdir()
    (root / "ok.txt").write_text("ok")
    with open(os.path.join(os.fsencode(root), b"odd\xffname.txt"), "wb") as f:
        f.write(b"x")
    os.mkdir(os.path.join(os.fsencode(root), b"dir\xfe"))
    out = read_tree(str(root))
    assert out["files"] == {"ok.txt": b"ok"}
    assert sorted(out["skipped"]) == ["dir\\xfe", "odd\\xffname.txt"], out["skipped"]
    assert out["capped"] == ["artifact capture skipped: a file name that is not UTF-8 (shown escaped)"]
    orjson.dumps({k: v for k, v in out.items() if k != "files"})
