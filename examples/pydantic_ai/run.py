"""pydantic-ai, unmodified: its own `Agent` on its `OpenAIChatModel` with an `OpenAIProvider` pointed at the
contract's endpoint, as its docs show for an OpenAI-compatible server, with one generic shell tool. No tool of the
workload's: the scripted model speaks the shell dialect (docs/runner-contract.md, "Run an agent you did not
write"). Exit 0 when the run ended with an output.
"""
import os
import subprocess
import sys

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

agent = Agent(OpenAIChatModel(os.environ.get("OPENAI_MODEL", "sandfleet-script"),
                              provider=OpenAIProvider(base_url=os.environ["OPENAI_BASE_URL"],
                                                      api_key=os.environ["OPENAI_API_KEY"])),
              instructions="You are a coding agent. Use the bash tool to do the task.")


@agent.tool_plain
def bash(command: str) -> str:
    """Run a bash command in the repository and return its exit code and output."""
    p = subprocess.run(["bash", "-c", command], cwd=os.environ.get("SANDFLEET_REPO"), capture_output=True, text=True,
                       timeout=60)
    return f"exit {p.returncode}\n{p.stdout[-4000:]}{p.stderr[-4000:]}"


def main() -> int:
    result = agent.run_sync("Patch the repository as the step script asks.",
                            usage_limits=UsageLimits(request_limit=200))
    print(f"pydantic-ai: {str(result.output)[:200]}", file=sys.stderr)
    return 0 if result.output else 1


if __name__ == "__main__":
    sys.exit(main())
