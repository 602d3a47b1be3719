"""The OpenAI Agents SDK, unmodified: its own `Agent` and `Runner`, in Chat Completions mode with tracing off, as its
docs show for an OpenAI-compatible endpoint, with one generic shell tool (the SDK has no local shell tool for Chat
Completions). No tool of the workload's: the scripted model speaks the shell dialect (docs/runner-contract.md, "Run
an agent you did not write"). Exit 0 when the run ended with a final output.

`--session PATH` switches on the SDK's own persistence as its docs show: a `SQLiteSession` at PATH passed to
`Runner.run`, so a run started again with the same session continues its conversation.
"""
import argparse
import os
import subprocess
import sys

from agents import (Agent, OpenAIChatCompletionsModel, Runner, SQLiteSession, function_tool, set_default_openai_api,
                    set_tracing_disabled)
from openai import AsyncOpenAI


@function_tool
def bash(command: str) -> str:
    """Run a bash command in the repository and return its exit code and output."""
    p = subprocess.run(["bash", "-c", command], cwd=os.environ.get("SANDFLEET_REPO"), capture_output=True, text=True,
                       timeout=60)
    return f"exit {p.returncode}\n{p.stdout[-4000:]}{p.stderr[-4000:]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--session", help="a SQLiteSession database file (the SDK's own persistence)")
    args = ap.parse_args()
    session = SQLiteSession("sandfleet-task", args.session) if args.session else None
    set_tracing_disabled(True)
    set_default_openai_api("chat_completions")
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
    model = OpenAIChatCompletionsModel(model=os.environ.get("OPENAI_MODEL", "sandfleet-script"), openai_client=client)
    agent = Agent(name="coder", instructions="You are a coding agent. Use the bash tool to do the task.",
                  tools=[bash], model=model)
    result = Runner.run_sync(agent, "Patch the repository as the step script asks.", max_turns=200, session=session)
    print(f"agents sdk: {str(result.final_output)[:200]}", file=sys.stderr)
    return 0 if result.final_output else 1


if __name__ == "__main__":
    sys.exit(main())
