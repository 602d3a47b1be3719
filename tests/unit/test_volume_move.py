"""`move`: a lost node's volume read back as a tar (fleet/sandbox.py pack_volume) and laid on a fresh volume on
another node (unpack_volume). What a runner wrote is untrusted: nothing may land outside the volume."""
from __future__ import annotations

import io
import os
import tarfile

import pytest

import fleet.sandbox as sandbox
from cluster.config import ConfigError, build_config


@pytest.fixture
def own_uid(monkeypatch):
    monkeypatch.setattr(sandbox, "SANDBOX_UID", os.getuid())


def test_a_volume_moves_whole_without_the_harness_files_and_without_a_link_out(tmp_path, own_uid):
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "repo" / "pkg").mkdir(parents=True)
    (src / "repo" / "pkg" / "a.py").write_text("x = 1\n")
    (src / ".journal").write_bytes(b"\x00\x01frame")
    (src / ".sandfleet").mkdir()
    (src / ".sandfleet" / "checkpoints").write_text("window:old\n")
    os.symlink("repo/pkg/a.py", src / "inside")
    os.symlink("/etc/passwd", src / "out")
    dst.mkdir()
    image, got = sandbox.pack_volume(str(src))
    assert got == {"files": 2, "bytes": 6 + 7}
    laid = sandbox.unpack_volume(image, str(dst))
    assert laid["files"] == 2 and laid["refused"] == ["out: AbsoluteLinkError"], laid
    assert sorted(os.listdir(dst)) == [".journal", "inside", "repo"]
    assert (dst / "inside").read_text() == "x = 1\n" and (dst / ".journal").read_bytes() == b"\x00\x01frame"


def test_a_crafted_image_lands_nothing_outside_the_volume(tmp_path, own_uid):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("../escape", "/abs", "ok"):
            data = b"boom"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dst = tmp_path / "vol"
    dst.mkdir()
    laid = sandbox.unpack_volume(buf.getvalue(), str(dst))
    assert not (tmp_path / "escape").exists() and (dst / "ok").read_bytes() == b"boom"
    assert len(laid["refused"]) == 1 and laid["refused"][0].startswith("../escape"), laid  # /abs -> abs, inside
    assert sorted(os.listdir(dst)) == ["abs", "ok"]


def test_move_is_a_node_loss_mode_and_needs_nodes():
    cfg = build_config({"faults": ["PK3"], "nodes": 3, "fault_timing": {"PK3": {"disk": "move"}}})
    assert cfg.keeps_disks() and not cfg.lazy_volumes() and cfg.disk_after("PK3") == "move"
    with pytest.raises(ConfigError, match="fault_timing.PK1.disk"):
        build_config({"faults": ["PK1"], "nodes": 3, "fault_timing": {"PK1": {"disk": "move"}}})
    with pytest.raises(ConfigError, match="sandbox.disk.*PK3.disk: move instead"):
        build_config({"faults": ["PK1"], "sandbox": {"disk": "move"}})
    with pytest.raises(ConfigError, match="nodes >= 3"):
        build_config({"faults": ["PK1"], "fault_timing": {"PK3": {"disk": "move"}}})
