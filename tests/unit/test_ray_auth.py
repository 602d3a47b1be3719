"""A Ray cluster started by hand uses token auth (Ray 2.60's `ray start --head`): the driver sets the mode when a
token is at hand, as Ray's docs describe for a user, and a refusal names what to export."""
from __future__ import annotations

import pytest

from cluster.raysession import auth_hint, token_auth_for_cluster


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return monkeypatch


def test_no_token_leaves_the_mode_unset(clean_env):
    import os

    assert token_auth_for_cluster() is None and "RAY_AUTH_MODE" not in os.environ


@pytest.mark.parametrize("how", ["env", "path", "home"])
def test_a_token_at_hand_turns_token_mode_on(clean_env, tmp_path, how):
    import os

    if how == "env":
        clean_env.setenv("RAY_AUTH_TOKEN", "abc")
    elif how == "path":
        (tmp_path / "tok").write_text("abc")
        clean_env.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "tok"))
    else:
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text("abc")
    assert token_auth_for_cluster() is not None
    assert os.environ["RAY_AUTH_MODE"] == "token"


def test_a_mode_the_user_set_stands(clean_env):
    import os

    clean_env.setenv("RAY_AUTH_MODE", "disabled")
    clean_env.setenv("RAY_AUTH_TOKEN", "abc")
    assert token_auth_for_cluster() is None and os.environ["RAY_AUTH_MODE"] == "disabled"


def test_a_refusal_names_what_to_export():
    hint = auth_hint("10.0.0.5:6379", RuntimeError("Authentication token is missing ... Set RAY_AUTH_MODE=disabled"))
    assert "export RAY_AUTH_TOKEN" in hint and "10.0.0.5:6379" in hint and "disabled" not in hint
    assert auth_hint("x:1", RuntimeError("Failed to connect to GCS")) is None


def test_min_sandbox_nodes_is_for_an_existing_cluster():
    from cluster.config import ConfigError, build_config

    assert build_config({"address": "10.0.0.5:6379", "min_sandbox_nodes": 2}).min_sandbox_nodes == 2
    with pytest.raises(ConfigError, match="min_sandbox_nodes 2 is for an existing cluster"):
        build_config({"min_sandbox_nodes": 2})
    with pytest.raises(ConfigError, match="gateway.port"):
        build_config({"gateway": {"port": 70000}})
