"""A tiny agent of the `shell` dialect (stdlib only): it declares one `bash` tool, runs every command the model
asks for in its working directory, and stops when the model answers without a tool call. It knows nothing of the
workload's tools and keeps no state: an attempt starts the conversation over."""
import json
import os
import subprocess
import sys
import urllib.request

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a bash command.",
                                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                        "required": ["command"]}}}


def chat(messages):
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", method="POST",
                                 data=json.dumps({"model": "any", "messages": messages, "tools": [BASH]}).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["choices"][0]["message"]


def main():
    messages = [{"role": "system", "content": "You are a coding agent with a bash tool."},
                {"role": "user", "content": "Do the task."}]
    for _ in range(200):
        msg = chat(messages)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return 0
        for call in msg["tool_calls"]:
            cmd = json.loads(call["function"]["arguments"])["command"]
            p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": f"exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}"})
            if p.returncode != 0:
                print(f"command failed: {cmd[:200]}: {p.stderr[-500:]}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
