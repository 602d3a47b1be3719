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
