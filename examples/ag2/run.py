"""AG2 (formerly AutoGen) 0.14.0, unmodified: its classic two-agent pattern as its docs show it, an `assistant`
`ConversableAgent` on an OpenAI-compatible `config_list` and a `user_proxy` that executes its tool calls, with one
generic `bash` tool registered between them (`register_function`). No tool of the workload's (the scripted model
speaks the shell dialect), no sandfleet import; the endpoint and key come from OPENAI_BASE_URL / OPENAI_API_KEY at
every start.

Persistence, as shipped: none. The conversation is the agents' in-memory state (DCP-2.0's "in-memory
ConversableAgent state"); AG2's LLM cache needs the `diskcache` extra and is off. A new attempt starts the chat
over, on any disk. Exit 0 when the assistant ended with a plain answer.
"""
import os
import subprocess
import sys
from typing import Annotated

from autogen import ConversableAgent, register_function


def bash(command: Annotated[str, "the bash command to run"]) -> str:
    """Run a bash command in the repository and return its exit code and output."""
    p = subprocess.run(["bash", "-c", command], cwd=os.environ.get("SANDFLEET_REPO"), capture_output=True, text=True,
                       timeout=60)
    return f"exit {p.returncode}\n{p.stdout[-4000:]}{p.stderr[-4000:]}"


def main() -> int:
    llm_config = {"config_list": [{"api_type": "openai", "model": os.environ.get("OPENAI_MODEL", "sandfleet-script"),
                                   "base_url": os.environ["OPENAI_BASE_URL"],
                                   "api_key": os.environ["OPENAI_API_KEY"]}],
                  "cache_seed": None}
    assistant = ConversableAgent("assistant", llm_config=llm_config, human_input_mode="NEVER",
                                 system_message="You are a coding agent. Use the bash tool to do the task.")
    user_proxy = ConversableAgent("user_proxy", llm_config=False, human_input_mode="NEVER",
                                  is_termination_msg=lambda m: not m.get("tool_calls"),
                                  max_consecutive_auto_reply=200)
    register_function(bash, caller=assistant, executor=user_proxy, description="Run a bash command in the repository")
    chat = user_proxy.initiate_chat(assistant, message="Patch the repository as the step script asks.", max_turns=200,
                                    silent=True)
    last = chat.chat_history[-1] if chat.chat_history else {}
    print(f"ag2: {str(last.get('content'))[:200]}", file=sys.stderr)
    return 0 if last.get("content") and not last.get("tool_calls") else 1


if __name__ == "__main__":
    sys.exit(main())
