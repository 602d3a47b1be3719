"""Claude Code 2.1.328, unmodified (`package.json` pins it; opt-in: `make examples-claude-code`). Its license is
Anthropic's commercial terms, not an open-source one, so this row is off in `make test` and installed only by hand.

This file only launches it as its docs show for a non-interactive run: `claude -p` with
`--dangerously-skip-permissions` (no one is there to approve a command; the sandbox is the wall), talking the
Messages API to the contract's ANTHROPIC_BASE_URL with ANTHROPIC_API_KEY (read by Claude Code itself at every start).
No tool of the workload's: Claude Code answers through its own `Bash` tool (the shell dialect).

Persistence, as shipped: Claude Code writes each session's transcript under `$HOME/.claude/projects/` (the
workspace: the task's disk). A run started again on a disk that kept one continues it as its docs say
(`claude --continue -p`); on a fresh disk it starts over. Exit: Claude Code's own.
"""
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CLAUDE = os.path.join(HERE, "node_modules", ".bin", "claude")
PROMPT = "Patch the repository as the step script asks. Run each command it gives you, then stop."


def main() -> int:
    if not os.access(CLAUDE, os.X_OK):
        print(f"claude_code: {CLAUDE} is missing: run `make examples-claude-code` (npm ci in examples/claude_code)",
              file=sys.stderr)
        return 127
    kept = glob.glob(os.path.join(os.environ["HOME"], ".claude", "projects", "*", "*.jsonl"))
    flags = ["-p", "--dangerously-skip-permissions", "--output-format", "text"]
    if kept:  # a disk that kept the last session: continue it, as `claude --continue` is documented
        argv = [CLAUDE, "--continue", *flags, "Continue the task where you left off."]
    else:
        argv = [CLAUDE, *flags, PROMPT]
    print(f"claude_code: {'continuing' if kept else 'starting'}", file=sys.stderr, flush=True)
    devnull = os.open(os.devnull, os.O_RDONLY)  # -p reads a piped stdin into its prompt: give it none
    os.dup2(devnull, 0)
    os.execv(CLAUDE, argv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
