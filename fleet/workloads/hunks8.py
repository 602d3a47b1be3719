"""`hunks8`: eight steps, each appending a distinct multi-line hunk (a new handler
function carrying the step's marker `sf-step=N`) to the repository.

A hunk applied twice still passes any test of the code (the second definition of a
function just replaces the first: ../shared/reference/001), so only the marker count
in the artifact shows it: `no_double_apply`. The task always has 8 steps.
"""
from __future__ import annotations

from fleet.workloads.base import MARK, ToolStep, effect_ids, marker_counts, rng, tools

STEPS = 8
FILES = ("src/handlers.py", "src/routes.py")
NAMES = ("health", "login", "logout", "upload", "search", "export", "import_", "metrics", "audit", "reset")


class Hunks8:
    name = "hunks8"
    fixed_steps = STEPS

    def fixture(self, seed: int) -> dict[str, str]:
        r = rng(seed, "fixture")
        return {"README.md": f"# hunks-{r.randrange(16**6):06x}\n",
                "src/handlers.py": "HANDLERS = {}\n", "src/routes.py": "ROUTES = []\n"}

    def step(self, seed: int, step: int) -> ToolStep:
        r = rng(seed, "hunk", step)
        name = f"{r.choice(NAMES)}_{step}"
        path = FILES[step % 2]
        hunk = (f"\n\ndef {name}(request):  # ({MARK}{step})\n"
                f"    return {{'handler': {name!r}, 'status': {200 + r.randrange(5)}}}\n")
        return ToolStep(step, "apply_patch", {"path": path, "append": hunk}, 30 + len(hunk))

    def script(self, seed: int, steps: int) -> list[ToolStep]:
        return [self.step(seed, i) for i in range(steps)]

    def final_message(self, seed: int, steps: int) -> str:
        return f"All {steps} hunks are in."

    def tools(self) -> list[dict]:
        return tools("apply_patch")

    def step_counts(self, files: dict[str, bytes]) -> dict[int, int]:
        return marker_counts(files)

    def effect_steps(self, seed: int, steps: int) -> dict[str, int]:
        return effect_ids(self.script(seed, steps))
