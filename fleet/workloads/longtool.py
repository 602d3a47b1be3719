"""`longtool`: the `patch-repo` steps, except that one seeded step runs a shell tool
(`run_command`) for a seeded 1-4 s before it writes its marked line, so a fault
lands mid-tool (a build, a test run, a migration an agent started).

The command is `sleep S && echo '... (sf-step=N)' >> build.log`, run in the
repository: a tool re-run after a kill that kept a previous run's output shows as
the marker twice.
"""
from __future__ import annotations

from fleet.workloads.base import MARK, ToolStep, effect_ids, marker_counts, rng, tools
from fleet.workloads.patch_repo import PatchRepo


class Longtool(PatchRepo):
    name = "longtool"

    def tool_step(self, seed: int, steps: int) -> int:
        return min(rng(seed, "longtool-at").randint(1, 4), steps - 1)

    def tool_seconds(self, seed: int) -> float:
        return round(rng(seed, "longtool-s").uniform(1.0, 4.0), 2)

    def step(self, seed: int, step: int, steps: int | None = None) -> ToolStep:
        if steps is not None and step == self.tool_step(seed, steps):
            s = self.tool_seconds(seed)
            cmd = f"sleep {s} && echo 'build ok after {s}s ({MARK}{step})' >> build.log"
            return ToolStep(step, "run_command", {"command": cmd, "timeout_s": 60}, 20 + len(cmd))
        return super().step(seed, step)

    def script(self, seed: int, steps: int) -> list[ToolStep]:
        return [self.step(seed, i, steps) for i in range(steps)]

    def tools(self) -> list[dict]:
        return tools("apply_patch", "run_command", "publish", "run_tests")

    def step_counts(self, files: dict[str, bytes]) -> dict[int, int]:
        return marker_counts(files)

    def effect_steps(self, seed: int, steps: int) -> dict[str, int]:
        return effect_ids(self.script(seed, steps))
