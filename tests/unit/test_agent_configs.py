"""The agent configs (configs/agents/*.yaml, configs/league-agents.yaml) are valid wave and league configs, each runs
an unmodified agent from examples/ with pinned requirements, and no such agent implements a workload tool."""
import json
import re
from pathlib import Path

import pytest

from cluster.config import load_config
from cluster.league import load_league

ROOT = Path(__file__).resolve().parents[2]
AGENTS = sorted((ROOT / "configs" / "agents").glob("*.yaml"))
WORKLOAD_TOOLS = re.compile(r"\b(def|name=|\"name\":)\s*['\"]?(apply_patch|publish|apply_edits|run_tests)\b")


def _agent_dirs() -> set[Path]:
    return {(ROOT / load_config(p).runner_spec()["workdir"]).resolve() for p in AGENTS}


def test_there_are_three_agents_or_more_each_pinned():
    dirs = _agent_dirs()
    assert len(dirs) >= 3, dirs
    for d in dirs:
        if (d / "package.json").is_file():  # an npm agent (Codex CLI): exact versions, and a lock file beside them
            deps = json.loads((d / "package.json").read_text())["dependencies"]
            assert deps and all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in deps.values()), (d, deps)
            assert (d / "package-lock.json").is_file(), d
            continue
        optin = d / "requirements-optin.txt"  # a heavy row's pins, which `make examples` skips (examples/README.md)
        req = (optin if optin.is_file() else d / "requirements.txt").read_text().split()
        assert req and all("==" in r for r in req if not r.startswith("#")), (d, req)


@pytest.mark.parametrize("path", AGENTS, ids=[p.stem for p in AGENTS])
def test_an_agent_config_is_a_valid_wave_on_its_example(path):
    cfg = load_config(path)
    spec = cfg.runner_spec()
    assert spec["name"] == path.stem and (ROOT / spec["workdir"] / "run.py").is_file(), spec


def test_no_unmodified_agent_implements_a_workload_tool():
    for d in _agent_dirs():
        for f in d.glob("*.py"):
            hit = WORKLOAD_TOOLS.search(f.read_text())
            assert not hit, f"{f.relative_to(ROOT)} implements the workload tool {hit.group(2)!r}"


def test_the_agents_league_runs_every_agent_config_at_every_boundary_and_under_storage_faults():
    league = load_league(ROOT / "configs" / "league-agents.yaml")
    waves = league.waves()
    runners = {n for n, _, _ in waves}
    assert {load_config(p).runner_spec()["name"] for p in AGENTS} <= runners and "durable" in runners
    assert any(c.enumerate_boundaries for _, _, c in waves)
    assert any(f.startswith("ST") for _, fs, _ in waves for f in fs.faults)


def test_the_claude_code_league_is_opt_in_and_valid():
    """Claude Code is not open source: its league is a config of its own (`make league-claude-code`), and it is in no
    league `make test` or the agents league runs."""
    league = load_league(ROOT / "configs" / "league-claude-code.yaml")
    assert {n for n, _, _ in league.waves()} == {"durable", "claude-code"}
    assert "claude-code" not in {n for n, _, _ in load_league(ROOT / "configs" / "league-agents.yaml").waves()}
    pins = json.loads((ROOT / "examples" / "claude_code" / "package.json").read_text())["dependencies"]
    assert pins == {"@anthropic-ai/claude-code": "2.1.328"}
