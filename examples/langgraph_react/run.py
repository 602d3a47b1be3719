"""LangGraph with `SqliteSaver`, as its docs write an agent: the prebuilt ReAct agent (`create_react_agent`) on
`ChatOpenAI`, one generic `bash` tool, and a `SqliteSaver` checkpointer with a thread id. Unmodified: no tool of the
workload's (the scripted model speaks the shell dialect), no sandfleet import; `ChatOpenAI` reads OPENAI_BASE_URL and
OPENAI_API_KEY from the environment at every start.

Persistence, as shipped: the checkpoints are in `--db` (default `.langgraph.sqlite` in the workspace, the task's own
disk), under one thread id. A run started again finds the thread's last checkpoint and, as LangGraph's docs resume
an interrupted thread, invokes the graph with `None` on the same `thread_id`: it goes on from the last superstep it
saved. On a fresh disk there is no checkpoint and it starts over. Exit 0 when the agent ended with a final answer.

`create_react_agent` warns that LangGraph 1.0 moved it to `langchain.agents.create_agent` (the `langchain` package,
not pinned here); langgraph-prebuilt 1.1.3 still ships it, and it is what DCP-2.0's LangGraph row and most deployed
LangGraph agents run. The warning is left as shipped.
"""
import argparse
import os
import sqlite3
import subprocess
import sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt import create_react_agent

PROMPT = "You are a coding agent. Use the bash tool to do the task."


@tool
def bash(command: str) -> str:
    """Run a bash command in the repository and return its exit code and output."""
    p = subprocess.run(["bash", "-c", command], cwd=os.environ.get("SANDFLEET_REPO"), capture_output=True, text=True,
                       timeout=60)
    return f"exit {p.returncode}\n{p.stdout[-4000:]}{p.stderr[-4000:]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=".langgraph.sqlite", help="the SqliteSaver database (LangGraph's own persistence)")
    ap.add_argument("--thread", default="sandfleet-task", help="the checkpointer's thread id")
    args = ap.parse_args()
    model = ChatOpenAI(model=os.environ.get("OPENAI_MODEL", "sandfleet-script"), max_retries=6)
    conn = sqlite3.connect(args.db, check_same_thread=False)
    checkpointer = SqliteSaver(conn)
    agent = create_react_agent(model, [bash], prompt=PROMPT, checkpointer=checkpointer)
    config = {"configurable": {"thread_id": args.thread}, "recursion_limit": 200}
    state = agent.get_state(config)
    if state.values.get("messages"):  # a checkpoint of this thread: go on from it
        print(f"langgraph: resuming thread {args.thread} ({len(state.values['messages'])} messages, "
              f"next {list(state.next)})", file=sys.stderr, flush=True)
        out = agent.invoke(None, config) if state.next else state.values
    else:
        out = agent.invoke({"messages": [("user", "Patch the repository as the step script asks.")]}, config)
    last = out["messages"][-1]
    print(f"langgraph: {str(last.content)[:200]}", file=sys.stderr)
    conn.close()
    return 0 if last.type == "ai" and not getattr(last, "tool_calls", None) else 1


if __name__ == "__main__":
    sys.exit(main())
