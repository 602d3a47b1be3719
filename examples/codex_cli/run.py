"""Codex CLI 0.169.0, unmodified (`package.json` pins it; `make examples-codex` installs it with `npm ci`).

This file only launches it as its docs show for a non-interactive run against an OpenAI-compatible endpoint:
`codex exec` with a `model_providers` entry (`wire_api = "responses"`, `env_key = "OPENAI_API_KEY"`) whose
`base_url` is the contract's `OPENAI_BASE_URL`, given as `-c` overrides (read from the environment at every start,
never saved). No tool of the workload's: Codex answers through its own `exec_command` tool (the shell dialect).

Codex's own sandbox is off (`--dangerously-bypass-approvals-and-sandbox`, "intended solely for running in
environments that are externally sandboxed"): it needs a user namespace (bubblewrap) or landlock, and sandfleet's
sandbox refuses new user namespaces to its runners.

Persistence, as shipped: Codex writes each session's rollout under `$CODEX_HOME/sessions` (here `$HOME/.codex`, the
workspace: the task's disk). A run started again on a disk that kept a session resumes it as its docs say
(`codex exec resume --last`); on a fresh disk it starts over. Exit: Codex's own.
"""
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CODEX = os.path.join(HERE, "node_modules", ".bin", "codex")
PROMPT = "Patch the repository as the step script asks. Run each command it gives you, then stop."


def main() -> int:
    if not os.access(CODEX, os.X_OK):
        print(f"codex_cli: {CODEX} is missing: run `make examples-codex` (npm ci in examples/codex_cli)",
              file=sys.stderr)
        return 127
    home = os.environ.setdefault("CODEX_HOME", os.path.join(os.environ["HOME"], ".codex"))
    os.makedirs(home, exist_ok=True)
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    conf = ["-c", f'model="{os.environ.get("OPENAI_MODEL", "sandfleet-script")}"',
            "-c", 'model_provider="sandfleet"',
            "-c", f'model_providers.sandfleet={{name="sandfleet", base_url="{base}", env_key="OPENAI_API_KEY", '
                  'wire_api="responses"}']
    flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
    kept = glob.glob(os.path.join(home, "sessions", "**", "rollout-*.jsonl"), recursive=True)
    if kept:  # a disk that kept the last session: resume it, as `codex exec resume` is documented
        argv = [CODEX, "exec", "resume", *conf, *flags, "--last", "Continue the task where you left off."]
    else:
        argv = [CODEX, "exec", *conf, *flags, PROMPT]
    print(f"codex_cli: {'resuming' if kept else 'starting'}", file=sys.stderr, flush=True)
    # codex exec appends a piped stdin to its prompt and reads it to its end: give it none
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.execv(CODEX, argv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
