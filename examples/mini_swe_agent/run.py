"""mini-swe-agent, unmodified: its own `DefaultAgent`, its own text-based LiteLLM model and local environment, and
its own `mini_textbased.yaml` agent config, shipped in its package. This launcher only builds them as mini-swe-agent's
docs show and runs the task; it has no tool of ours (the scripted model speaks its text dialect:
docs/runner-contract.md, "Run an agent you did not write").

The endpoint and key come from the contract's OPENAI_BASE_URL / OPENAI_API_KEY (LiteLLM's `openai/` provider);
LITELLM_LOCAL_MODEL_COST_MAP keeps LiteLLM offline. Exit 0 when the agent submitted, 1 otherwise.
"""
import os
import sys
from importlib.resources import files

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MSWEA_CONFIGURED", "true")  # no first-run setup prompt
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

import yaml  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel  # noqa: E402

TASK = "Patch the repository in the current directory as the step script asks, then submit."


def main() -> int:
    cfg = yaml.safe_load((files("minisweagent") / "config" / "mini_textbased.yaml").read_text())
    mcfg = dict(cfg.get("model") or {})
    mcfg["model_kwargs"] = dict(mcfg.get("model_kwargs") or {}, api_base=os.environ["OPENAI_BASE_URL"],
                                api_key=os.environ["OPENAI_API_KEY"])
    model = LitellmTextbasedModel(model_name="openai/" + os.environ.get("OPENAI_MODEL", "sandfleet-script"),
                                  cost_tracking="ignore_errors", **mcfg)
    env = LocalEnvironment(cwd=os.environ["SANDFLEET_REPO"], timeout=60, **(cfg.get("environment") or {}))
    agent = DefaultAgent(model, env, **{k: v for k, v in cfg["agent"].items() if k != "mode"})
    result = agent.run(TASK)
    print(f"mini-swe-agent: {result.get('exit_status')}", file=sys.stderr)
    return 0 if result.get("exit_status") == "Submitted" else 1


if __name__ == "__main__":
    sys.exit(main())
