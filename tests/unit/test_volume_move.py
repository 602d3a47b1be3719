"""`move`: a lost node's volume read back as a tar (fleet/sandbox/workspace.py pack_volume) and laid on a fresh volume on
another node (unpack_volume). What a runner wrote is untrusted: nothing may land outside the volume."""
from __future__ import annotations

import io
import os
import tarfile

import pytest

import fleet.sandbox.workspace as sandbox  # (SANDBOX_UID is read there)
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


def test_only_the_lost_nodes_running_tasks_whose_disk_the_loss_moves_are_detached():
    """The attempts' room asks the lost node's host for the volume of each task running there whose ending fault
    moves its disk (its own PK3's `disk`, else sandbox.disk), keeps the image for its next attempt, and says why
    one was not moved."""
    import asyncio
    from types import SimpleNamespace

    from cluster.wave.taskdisk import TaskDisks

    cfg = build_config({"faults": ["PK3"], "nodes": 3, "fault_timing": {"PK3": {"disk": "move"}}})
    asked = []

    class Host:
        class detach_volume:  # noqa: N801 - a Ray actor method's shape: .remote(...) -> awaitable
            @staticmethod
            def remote(wave_id, sandbox_id, task_id):
                asked.append((wave_id, sandbox_id, task_id))

                async def answer():
                    if task_id == "t001":
                        return {"image": None, "why": "no volume of task t001 is mounted on node-1", "stopped": 0}
                    return {"image": b"tar", "files": 3, "bytes": 12, "stopped": 2, "node": "node-1"}
                return answer()

    def run(tid, sid, faults):
        return SimpleNamespace(current=(Host, sid) if sid else None, plan=SimpleNamespace(faults=faults))

    pk3 = [{"fault_id": "PK3", "instance": "t000-PK3"}]
    room = SimpleNamespace(cfg=cfg, wave_id="w", moved={}, nodes=SimpleNamespace(host=lambda node: Host()),
                           context=SimpleNamespace(runs={
                               "t000": run("t000", "t000-a1", pk3), "t001": run("t001", "t001-a1", []),
                               "t002": run("t002", "t002-a1", []), "t003": run("t003", None, [])}))
    got = asyncio.run(TaskDisks.detach(room, "node-1", "t000-PK3", ["t000-a1", "t001-a1"]))
    # t000: its own PK3 moves it; t001: another task on the node, sandbox.disk (wipe) would say so, not moved
    assert asked == [("w", "t000-a1", "t000")], asked
    assert got == {"t000": {"moved": True, "files": 3, "bytes": 12, "stopped": 2}}
    assert room.moved["t000"]["image"] == b"tar" and room.moved["t000"]["node"] == "node-1"

    room.cfg = build_config({"faults": ["PK3"], "nodes": 3, "sandbox": {"disk": "move"}})
    room.moved, asked[:] = {}, []
    got = asyncio.run(TaskDisks.detach(room, "node-1", "t000-PK3", ["t000-a1", "t001-a1"]))
    assert [a[2] for a in asked] == ["t000", "t001"]  # sandbox.disk move: every task on the lost node
    assert got["t001"] == {"moved": False, "why": "no volume of task t001 is mounted on node-1"}
    assert set(room.moved) == {"t000"}
