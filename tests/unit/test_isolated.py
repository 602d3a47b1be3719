"""What `--isolated-nodes` refuses before it makes anything (exit 254, naming what is missing)."""
from __future__ import annotations

import pytest

from cluster import isolated


def test_nodes_below_two_root_and_tools_are_named(monkeypatch):
    with pytest.raises(isolated.IsolationError, match=r"nodes: 1 .*nodes >= 2") as e:
        isolated.check_available(1)
    assert e.value.bad_input
    monkeypatch.setattr(isolated.os, "geteuid", lambda: 1000)
    with pytest.raises(isolated.IsolationError, match="need root") as e:
        isolated.check_available(3)
    assert e.value.bad_input
    monkeypatch.setattr(isolated.os, "geteuid", lambda: 0)
    monkeypatch.setattr(isolated.shutil, "which", lambda t: None if t == "nsenter" else f"/usr/bin/{t}")
    with pytest.raises(isolated.IsolationError, match=r"`nsenter` \(util-linux\)") as e:
        isolated.check_available(3)
    assert e.value.bad_input


def test_node_addresses_are_from_the_benchmarking_range():
    assert isolated.HEAD_IP == isolated.node_ip(0) == "198.18.0.1" and isolated.node_ip(2) == "198.18.0.3"


def test_isolation_without_nodes_names_the_default_it_was_checked_at():
    from cluster.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"field `nodes`: value 1: nodes 1 with node_isolation 'namespaces'"):
        load_config(None, {"node_isolation": "namespaces"})


def test_the_install_under_the_nodes_private_tmp_is_found_and_tmp_itself_is_refused(monkeypatch, tmp_path):
    """The harness's own install (checkout, prefixes, `ray`) where it lies under the nodes' private /tmp is bound
    back on each node (outermost paths only); an install that is that dir itself, or a `ray` missing beside the
    interpreter, is refused before anything runs (a harness error, exit 2, naming the path)."""
    import sys
    from pathlib import Path

    root = str(Path(isolated.__file__).resolve().parents[1])
    monkeypatch.setattr(isolated, "PRIVATE", str(Path(root).parent))
    assert root in isolated.install_paths()
    assert all(not p.startswith(root + "/") for p in isolated.install_paths())
    monkeypatch.setattr(isolated, "PRIVATE", root)
    with pytest.raises(isolated.IsolationError, match=f"install is {root} itself") as e:
        isolated.check_install()
    assert not e.value.bad_input
    monkeypatch.setattr(isolated, "PRIVATE", "/tmp")
    (tmp_path / "bin").mkdir()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python3"))
    with pytest.raises(isolated.IsolationError, match=f"{tmp_path}/bin/ray is not there") as e:
        isolated.check_install()
    assert not e.value.bad_input and "never used" in str(e.value)
