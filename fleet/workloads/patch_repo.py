"""`patch-repo`: an agent patches a small repository and announces its progress.

Each step is one tool call: `apply_patch` appends one line carrying the step's
marker (`sf-step=N`) to a file of the repository, so a step applied twice is
visible in the artifact itself; `publish` is an external effect (a message sent
through the effects service, identified by its `effect_id`); `run_tests` only
reads. The content of every step is fixed by (seed, step).
"""
from __future__ import annotations

from fleet.workloads.base import MARK, ToolStep, effect_ids, marker_counts, rng, tools

FILES = ("README.md", "src/app.py", "src/util.py", "CHANGELOG.md")
VERBS = ("add", "fix", "rename", "document", "guard", "inline", "split", "test")
NOUNS = ("parser", "retry loop", "cache", "config", "logger", "handler", "index", "timeout")
def _kind(step: int) -> str:
    if step % 4 == 2:
        return "publish"
    if step % 5 == 4:
        return "run_tests"
    return "apply_patch"


class PatchRepo:
    name = "patch-repo"

    def fixture(self, seed: int) -> dict[str, str]:
        r = rng(seed, "fixture")
        return {
            "README.md": f"# fixture-{r.randrange(16**6):06x}\n\nA small repository an agent patches.\n",
            "src/app.py": f"def main():\n    return {r.randrange(1000)}\n",
            "src/util.py": f"def helper(x):\n    return x * {r.randrange(2, 9)}\n",
            "CHANGELOG.md": "# Changelog\n",
        }

    def step(self, seed: int, step: int) -> ToolStep:
        r = rng(seed, "step", step)
        kind = _kind(step)
        if kind == "apply_patch":
            path = r.choice(FILES)
            comment = "#" if path.endswith(".py") else "-"
            line = f"{comment} {r.choice(VERBS)} {r.choice(NOUNS)} ({MARK}{step})"
            return ToolStep(step, "apply_patch", {"path": path, "append": line}, 20 + len(line), "workspace")
        if kind == "publish":
            eid = f"e{step:04d}-{r.randrange(16**8):08x}"
            text = f"{r.choice(VERBS)}ed the {r.choice(NOUNS)} (step {step})"
            return ToolStep(step, "publish", {"effect_id": eid, "channel": "#deploys", "text": text},
                            30 + len(text), "effect")
        return ToolStep(step, "run_tests", {}, 12, "read")

    def script(self, seed: int, steps: int) -> list[ToolStep]:
        return [self.step(seed, i) for i in range(steps)]

    def final_message(self, seed: int, steps: int) -> str:
        return f"All {steps} steps are done."

    def tools(self) -> list[dict]:
        return tools("apply_patch", "publish", "run_tests")

    def step_counts(self, files: dict[str, bytes]) -> dict[int, int]:
        return marker_counts(files)

    def effect_steps(self, seed: int, steps: int) -> dict[str, int]:
        return effect_ids(self.script(seed, steps))
