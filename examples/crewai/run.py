"""CrewAI 1.15.30, unmodified: one `Agent` with one generic `bash` tool (`crewai.tools.tool`), one `Task`, a `Crew`,
on CrewAI's own `LLM` pointed at the OpenAI-compatible endpoint (OPENAI_BASE_URL / OPENAI_API_KEY, read at every
start). No tool of the workload's (the scripted model speaks the shell dialect), no sandfleet import. Telemetry is
off through CrewAI's documented variables (the runner config sets them; the sandbox has no network to send it on).

Two rows, as DCP-2.0 and CrewAI's docs draw them:
- plain (default): a crew kicked off; its state is in memory, and a new attempt starts over;
- `--flow`: the same crew inside a `Flow` with `@persist` (CrewAI's SQLite flow persistence, its default file under
  `$HOME/.local/share`, the workspace), kicked off with a fixed state `id`, as its docs resume a flow: a new attempt
  restores the state saved after the last method that finished. The flow's one method is the crew's whole run, so
  what a kill mid-crew leaves to restore is what the grader shows.
Exit 0 when the crew gave a final answer.
"""
import argparse
import os
import subprocess
import sys

from crewai import LLM, Agent, Crew, Task
from crewai.flow.flow import Flow, start
from crewai.flow.persistence import persist
from crewai.tools import tool
from pydantic import BaseModel

FLOW_ID = "00000000-0000-4000-8000-00000000a6e1"


@tool("bash")
def bash(command: str) -> str:
    """Run a bash command in the repository and return its exit code and output."""
    p = subprocess.run(["bash", "-c", command], cwd=os.environ.get("SANDFLEET_REPO"), capture_output=True, text=True,
                       timeout=60)
    return f"exit {p.returncode}\n{p.stdout[-4000:]}{p.stderr[-4000:]}"


def crew() -> Crew:
    llm = LLM(model=f"openai/{os.environ.get('OPENAI_MODEL', 'sandfleet-script')}",
              base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
    coder = Agent(role="coder", goal="Patch the repository as the step script asks.",
                  backstory="You are a coding agent. Use the bash tool to do the task.", tools=[bash], llm=llm,
                  max_iter=200, allow_delegation=False, verbose=False)
    task = Task(description="Patch the repository as the step script asks.", expected_output="What you did.",
                agent=coder)
    return Crew(agents=[coder], tasks=[task], verbose=False)


class PatchState(BaseModel):
    id: str = FLOW_ID
    result: str = ""


@persist()
class PatchFlow(Flow[PatchState]):
    @start()
    def patch(self) -> str:
        if not self.state.result:  # a restored state that holds the result has nothing left to do
            self.state.result = str(crew().kickoff())
        return self.state.result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flow", action="store_true", help="run the crew in a Flow with @persist (SQLite)")
    args = ap.parse_args()
    out = PatchFlow().kickoff(inputs={"id": FLOW_ID}) if args.flow else str(crew().kickoff())
    print(f"crewai: {str(out)[:200]}", file=sys.stderr)
    return 0 if out else 1


if __name__ == "__main__":
    sys.exit(main())
