"""Every example runner (examples/*: a real agent framework in its own venv) runs on two isolated nodes as a user's
cluster runs it. Its venv (109-755 MB) is never shipped: the snapshot leaves it out and the wave names it as an
environment each node must have at the same path (built there by `make examples`, as the cluster's setup_commands
do, or on a filesystem every node mounts), so only the example's own files travel (a few KB). Each node binds its
own venv read-only over the shipped code, on the empty place the snapshot keeps for it (before, bwrap could not make
that mount point in the read-only staged copy: every attempt of every example exited 1); the uninterrupted
reference passes on the nodes, and under PK1 each example gets the verdict examples/README.md gives it.

Each example is a wave of its own on a fresh isolated cluster (10-18 s each here; 91 s for the first seven, 53 s for
LangGraph ReAct, AG2, DBOS and Temporal), so
`make test` runs a representative pair: `openai_journal` (store-backed: passes PK1) and `mini_swe_agent` (the
biggest venv, 755 MB, and the text dialect; unmodified: a named verdict). SANDFLEET_ALL_EXAMPLES_ISOLATED=1 runs the others too.

The opt-in installs run here only once installed and opted in (skipped otherwise, naming the make target): Codex CLI
and Claude Code (npm: each node's own `node_modules`, 404 and 356 MB) and CrewAI (its 1 GB venv). Run once each
(`SANDFLEET_ALL_EXAMPLES_ISOLATED=1 SANDFLEET_CLAUDE_CODE=1 pytest ...[codex_cli|crewai|claude_code]`): 10-20 KB
shipped; both references pass on the nodes; under PK1 on the wiped disk each starts over and fails
`no_model_recall` (Codex 13.7 s, CrewAI 24.5 s, Claude Code 12.5 s of wave wall time)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest

from cluster import isolated
from tests import leftovers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ALL = os.environ.get("SANDFLEET_ALL_EXAMPLES_ISOLATED") == "1"
_REST = pytest.mark.skipif(not ALL, reason="one isolated cluster per example: SANDFLEET_ALL_EXAMPLES_ISOLATED=1 runs "
                                           "it (make test runs openai_journal and mini_swe_agent)")
# example -> (its script, what PK1 earns it: "pass", "no_model_recall" (state in the workspace: caught re-asking the
# model), "named" (an unmodified agent that starts over: pass or a fail with a signature))
EXAMPLES = {"openai_journal": ("agent.py", "pass"), "mini_swe_agent": ("run.py", "named"),
            "langgraph_s3": ("agent.py", "pass"), "langgraph_sqlite": ("agent.py", "no_model_recall"),
            "dbos_sqlite": ("agent.py", "no_model_recall"), "openai_agents_sdk": ("run.py", "named"),
            "pydantic_ai": ("run.py", "named"), "langgraph_react": ("run.py", "named"), "ag2": ("run.py", "named"),
            "dbos_workflow": ("run.py", "named"), "temporal_workflow": ("run.py", "named")}
# the opt-in rows (examples/README.md): a heavy install, or a license that is not open source, so never in `make test`.
# example -> (its command, what PK1 earns it, its environment (each node's own), a file the install leaves, how to
# install it, its extra env, the variable that opts it in)
CREW_ENV = {"CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "true"}
CLAUDE_ENV = {"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
OPT_IN = {"codex_cli": ("python3 run.py", "named", "node_modules", "node_modules/.bin/codex", "make examples-codex",
                        {}, "SANDFLEET_ALL_EXAMPLES_ISOLATED"),
          "crewai": (".venv/bin/python run.py", "no_model_recall", ".venv", ".venv/bin/python", "make examples-crewai",
                     CREW_ENV, "SANDFLEET_ALL_EXAMPLES_ISOLATED"),
          "claude_code": ("python3 run.py", "named", "node_modules", "node_modules/.bin/claude",
                          "make test-claude-code", CLAUDE_ENV, "SANDFLEET_CLAUDE_CODE")}
PARAMS = [pytest.param(n, marks=() if n in ("openai_journal", "mini_swe_agent") else _REST) for n in EXAMPLES]
PARAMS += [pytest.param(n) for n in OPT_IN]


def _example(name: str) -> tuple[str, str, str, dict]:
    """(command, expected PK1 verdict, environment dir, runner env) of an example; an opt-in one that is not installed
    or not opted in is skipped, naming the make target that runs it."""
    if name in EXAMPLES:
        script, expect = EXAMPLES[name]
        if not (ROOT / "examples" / name / ".venv" / "bin" / "python").exists():
            pytest.fail(f"examples/{name}/.venv is missing: run `make examples` (make test does)")
        return f".venv/bin/python {script}", expect, ".venv", {}
    command, expect, env_dir, installed, how, env, var = OPT_IN[name]
    if not (ROOT / "examples" / name / installed).exists():
        pytest.skip(f"examples/{name} is not installed ({installed} missing): run `{how}` (opt-in, not in make test)")
    if os.environ.get(var) != "1":
        pytest.skip(f"examples/{name} on isolated nodes is opt-in: {var}=1 runs it ("
                    + (f"installed by `{how}`" if var == "SANDFLEET_ALL_EXAMPLES_ISOLATED" else f"`{how}` sets it") + ")")
    return command, expect, env_dir, env


def test_an_environment_in_the_workdir_that_a_node_lacks_is_exit_2_naming_node_and_path(tmp_path):
    """A workdir under /tmp (the nodes' /tmp is their own) holding a `node_modules`: the code ships, the environment
    does not, and no node has it at that path, so the wave stops before any task, naming the node and the path,
    instead of a runner that fails on every node for want of it."""
    work = Path(tempfile.mkdtemp(prefix="sf-env-", dir="/tmp"))
    try:
        os.chmod(work, 0o755)
        (work / "node_modules" / ".bin").mkdir(parents=True)
        (work / "agent.py").write_text((ROOT / "fleet" / "runners" / "durable.py").read_text())
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", "--tasks", "1", "--faults", "none",
                            "--nodes", "2", "--isolated-nodes", "--runner-cmd", f"{sys.executable} agent.py",
                            "--runner-workdir", str(work), "--results", str(tmp_path / "r"), "--no-progress"],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert f"node node-1: {work}/node_modules is not there" in r.stderr, r.stderr[-2000:]
    wave = (tmp_path / "r" / "latest").resolve()
    assert not [line for line in (wave / "timeline.jsonl").read_bytes().splitlines() if b"attempt_start" in line]


@pytest.mark.parametrize("name", PARAMS)
def test_an_example_runs_on_two_isolated_nodes_with_its_venv_the_nodes_own(tmp_path, name):
    work = ROOT / "examples" / name
    command, expect, env_dir, runner_env = _example(name)
    before = leftovers.snapshot()
    # (the suite's own fleet, lent to other tests, may hold a host dir of its node-0 for the session: not this wave's)
    host_dirs = set(Path("/tmp").glob("sandfleet-host-*"))
    cfg = tmp_path / "wave.yaml"  # PK1 at a boundary (the runner's 2nd-3rd model answer), never a clock
    cfg.write_text("workload: {steps: 6, think_ms: 50}\ndeadline_s: 150\n"
                   "fault_timing: {PK1: {after_model_calls: [2, 3]}}\n")
    # the runner as a user's command line gives it; one with an environment of its own (telemetry off, ...) as the
    # config's runner block, the only place that takes one
    runner = ["--runner-cmd", command, "--runner-workdir", str(work)]
    if runner_env:
        spec = {"name": name, "command": command, "workdir": str(work), "env": runner_env}
        cfg.write_text(cfg.read_text() + f"runner: {orjson.dumps(spec).decode()}\n")  # (JSON is YAML)
        runner = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", str(cfg), "--tasks", "2", "--concurrency",
                        "2", "--faults", "PK1", "--seed", "7", "--nodes", "3", "--isolated-nodes", *runner,
                        "--results", str(tmp_path / "r"), "--no-progress"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert r.returncode in ((0,) if expect == "pass" else (0, 1)), (r.returncode, r.stdout[-2000:],
                                                                     r.stderr[-3000:])
    wave = (tmp_path / "r" / "latest").resolve()
    tl = [orjson.loads(line) for line in (wave / "timeline.jsonl").read_bytes().splitlines()]

    # only the example's own files travel; its venv is named as the nodes' own
    shipped = [e for e in tl if e["event"] == "code_shipped"]
    assert len(shipped) == 1 and shipped[0]["node_envs"] == [str(work / env_dir)], shipped
    assert shipped[0]["bytes"] < 256 * 1024, shipped  # a few KB, not the venv's 109-755 MB

    starts = [e for e in tl if e["event"] == "attempt_start"]
    assert starts and {e["node"] for e in starts} <= {"node-1", "node-2"}, [e["node"] for e in starts]
    for e in starts:  # every attempt's runner.log came back from its node
        assert (wave / "sandboxes" / e["sandbox"] / "runner.log").is_file(), e["sandbox"]

    refs = {p.name: orjson.loads(p.read_bytes()) for p in wave.glob("ref-t*.grade.json")}
    assert len(refs) == 2 and all(g["verdict"] == "pass" for g in refs.values()), {
        k: g.get("checks") for k, g in refs.items()}  # uninterrupted, on the nodes: the positive control
    tasks = [orjson.loads(p.read_bytes()) for p in sorted(wave.glob("t*.grade.json"))]
    assert len(tasks) == 2 and all(g["interrupted"] for g in tasks), [(g["task_id"], g["verdict"]) for g in tasks]
    for g in tasks:
        if expect == "pass":
            assert g["verdict"] == "pass" and g["model_recalls"] == 0, g["checks"]
        elif expect == "no_model_recall":
            assert g["verdict"] == "fail" and g["checks"]["no_model_recall"]["verdict"] == "fail", g["checks"]
            assert g["checks"]["no_double_apply"]["verdict"] == "pass", g["checks"]
        else:
            assert g["verdict"] in ("pass", "fail") and (g["verdict"] == "pass" or g["signature"]), g

    left = leftovers.wait_clean(before)
    assert not left, left
    assert not isolated.leftover_node_cgroups()
    assert not set(Path("/tmp").glob("sandfleet-host-*")) - host_dirs

