"""A node's first process (`cluster/isonode.py`) in a mount namespace of its own: its private /tmp."""
from __future__ import annotations

import pytest

from cluster import isolated


@pytest.mark.skipif(__import__("os").geteuid() != 0 or __import__("shutil").which("unshare") is None,
                    reason="needs root and unshare (a mount namespace of its own)")
def test_a_nodes_private_tmp_binds_the_kept_paths_back_read_only_and_hides_the_rest():
    """`cluster.isonode.private_tmp` in a mount namespace of its own (gone with its process): a kept dir under /tmp
    is there with its files, read-only; a file beside it is hidden by the private tmpfs."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    keep = Path(tempfile.mkdtemp(prefix="sf-keep-", dir="/tmp"))
    other = Path(tempfile.mkdtemp(prefix="sf-other-", dir="/tmp"))
    try:
        (keep / "inside").write_text("kept")
        (other / "beside").write_text("hidden")
        probe = ("import json, os, sys; from cluster.isonode import private_tmp; private_tmp([sys.argv[1]]); "
                 "k = os.path.join(sys.argv[1], 'inside'); w = None\n"
                 "try:\n    open(k, 'a').close()\nexcept OSError as e:\n    w = e.strerror\n"
                 "print(json.dumps({'kept': open(k).read(), 'write': w, "
                 "'other': os.path.exists(os.path.join(sys.argv[2], 'beside'))}))")
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", probe,
                            str(keep), str(other)], capture_output=True, text=True, timeout=30,
                           cwd=str(Path(isolated.__file__).resolve().parents[1]))
        assert r.returncode == 0, r.stderr
        import json

        assert json.loads(r.stdout) == {"kept": "kept", "write": "Read-only file system", "other": False}
        assert (keep / "inside").read_text() == "kept" and os.access(keep / "inside", os.W_OK)  # unchanged here
    finally:
        import shutil

        shutil.rmtree(keep, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)
