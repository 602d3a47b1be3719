"""A tiny agent of the `text` dialect (stdlib only), shaped like mini-swe-agent: no tools in its requests, a
prompt that asks for exactly one fenced bash block per answer, the block's output sent back as the next user
message, and the finish command (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`) ending the run."""
import json
import os
import re
import subprocess
import sys
import urllib.request

FINISH = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SYSTEM = ("You are a helpful assistant that can interact with a computer. Your response must contain exactly ONE "
          "bash code block with ONE command, formatted as:\n```bash\nyour_command_here\n```\n"
          f"When the task is done, run `echo {FINISH}`.")


def chat(messages):
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", method="POST",
                                 data=json.dumps({"model": "any", "messages": messages}).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["choices"][0]["message"]


def main():
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Do the task."}]
    for _ in range(200):
        msg = chat(messages)
        messages.append({"role": "assistant", "content": msg["content"]})
        blocks = re.findall(r"```bash\s*\n(.*?)\n```", msg["content"] or "", re.DOTALL)
        if len(blocks) != 1:
            messages.append({"role": "user", "content": "Format error: give exactly one bash block."})
            continue
        p = subprocess.run(["bash", "-c", blocks[0]], capture_output=True, text=True, timeout=60)
        if FINISH in p.stdout:
            return 0
        messages.append({"role": "user", "content": f"<returncode>{p.returncode}</returncode>\n<output>\n"
                                                    f"{p.stdout[-2000:]}{p.stderr[-2000:]}</output>"})
    return 1


if __name__ == "__main__":
    sys.exit(main())
