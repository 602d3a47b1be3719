"""`sandfleet wave replay` and `sandfleet shrink`: one task of a stored wave run again, as it ran or with plans one
step smaller."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from cluster import results
from cluster.cli.common import EXIT_BAD_INPUT, EXIT_HARNESS, EXIT_OK, app, out, err, wave_app
from cluster.cli import wave  # (by module: a test stubs wave.run_wave)
from cluster.results import terminal_safe


def _task_of_wave(task_path: str, address: Optional[str]):
    """`results/<wave>/<task>` read for replay and shrink: (wave dir, task id, plan, config, planned task), or the
    exit code after an error that names what is wrong (254 a bad argument, 2 a damaged plan.json)."""

    from cluster import planfile

    if not task_path or not task_path.strip() or "\0" in task_path:
        err(f"error: argument TASK_PATH: value {task_path!r}: empty; pass results/<wave id>/<task id>, "
             "e.g. results/latest/t003")
        return EXIT_BAD_INPUT
    # `results/latest/t003` is the wave `latest` names now: a shrink's runs move `latest`, and linking it back to
    # `latest` itself made it a loop
    wave_dir, task_id = Path(task_path).parent.resolve(), Path(task_path).name
    try:
        plan = planfile.read(wave_dir / results.PLAN)
    except (FileNotFoundError, NotADirectoryError) as exc:
        err(f"error: argument TASK_PATH: {wave_dir} is not a wave's results directory ({exc.strerror}: "
             f"{results.PLAN}); pass results/<wave id>/<task id>, e.g. results/latest/t003")
        return EXIT_BAD_INPUT
    except planfile.PlanError as exc:
        err(f"error: {exc}")
        return EXIT_HARNESS
    got = wave.stored_config(plan, wave_dir / results.PLAN, address)
    if isinstance(got, int):
        return got
    cfg = got[1]
    tasks = plan["tasks"]
    task = next((t for t in tasks if t["task_id"] == task_id), None)
    if task is None:
        err(f"error: argument TASK_PATH: wave {plan['wave_id']} has no task {task_id!r}; its tasks: "
             f"{', '.join(str(t['task_id']) for t in tasks[:20])}")
        return EXIT_BAD_INPUT
    return wave_dir, task_id, plan, cfg, task


@wave_app.command("replay")
def wave_replay(
    task_path: str = typer.Argument(..., help="results/<wave>/<task>: the task to run again"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray address ('local' = private Ray)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
) -> int:
    """Run one task of a wave again: same seed, same faults at the same times, boundaries or windows."""
    from cluster.driver import WaveRun

    found = _task_of_wave(task_path, address)
    if isinstance(found, int):
        return found
    wave_dir, task_id, plan, cfg, _ = found
    return wave.run_wave(cfg, lambda: WaveRun(cfg, wave_dir.parent, progress=not no_progress, replay=(plan, task_id)))


@app.command("shrink")
def shrink_cmd(
    task_path: str = typer.Argument(..., help="results/<wave>/<task>: a task that failed"),
    budget: int = typer.Option(20, "--budget", min=1, max=200, help="at most this many runs (the first replays "
                                                                    "the task as it ran)"),
    anyway: bool = typer.Option(False, "--anyway", help="shrink even if the runner's code changed since the wave"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray address ('local' = private Ray)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
) -> int:
    """Find the smallest fault plan that still fails the task with the same failure signature."""
    import orjson

    from cluster import shrink
    from cluster.driver import HarnessError, preflight

    found = _task_of_wave(task_path, address)
    if isinstance(found, int):
        return found
    wave_dir, task_id, plan, cfg, task = found
    grade_file = wave_dir / f"{task_id}.grade.json"
    try:
        grade = orjson.loads(grade_file.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        err(f"error: {grade_file} is missing or damaged ({exc}); `sandfleet grade {wave_dir}` grades the wave again")
        return EXIT_HARNESS
    if not isinstance(grade, dict) or grade.get("verdict") not in ("pass", "fail", "unknown", "not_applied") \
            or (grade["verdict"] == "fail" and not isinstance(grade.get("signature"), str)):
        err(f"error: {grade_file} is damaged: not a task's grade (a verdict, and a failure's signature); "
             f"`sandfleet grade {wave_dir}` grades the wave again")
        return EXIT_HARNESS
    if grade.get("verdict") != "fail" or not grade.get("signature"):
        out.print(f"task {task_id} of wave {plan.get('wave_id')} is `{grade.get('verdict')}`, not a failure with a "
                  "signature: nothing to shrink (nothing was run)", highlight=False, soft_wrap=True)
        return EXIT_OK
    changed = shrink.code_changed(plan)
    for line in shrink.manifest_drift(plan, cfg):  # not a refusal: the failure may still be the same one
        err(f"warning: manifest differs from what runs now: {line}")
    if changed and not anyway:
        err(f"error: the runner's code is not what wave {plan.get('wave_id')} ran, so its failure may not be the "
             f"same failure any more: {'; '.join(changed)}. Pass --anyway to shrink it on the code as it is now")
        return EXIT_BAD_INPUT
    for line in changed:
        err(f"warning: manifest differs: {line}")
    signature = grade["signature"]
    from cluster.raycluster import FleetSession

    fleet = None
    try:
        preflight(cfg)
        fleet = FleetSession.lent_for(cfg)
        with _shrink_progress(budget, no_progress) as step:
            s = shrink.Shrinker(plan, task_id, wave_dir.parent, cfg, fleet, budget, on_step=step)
            outcome = s.search(task, signature)
    except HarnessError as exc:
        err(f"error: {exc}")
        return exc.exit_code
    finally:
        if fleet is not None:
            fleet.stop()
    results.link_latest(wave_dir.parent, wave_dir)  # `latest` is the wave shrunk, not its last trial run
    record = shrink.write_record(wave_dir, task_id, signature, outcome, s.tried, budget, changed)
    best = outcome["smallest"]
    if not outcome["reproduced"]:
        err(f"the failure did not reproduce: replayed as it ran, task {task_id} was `{best['verdict']}` "
             f"({best['signature'] or 'no signature'}), not `fail` ({signature}); a flaky failure cannot be shrunk "
             f"(record: {record})")
        return EXIT_HARNESS
    gone = len(task.get("faults") or []) - len(best["faults"])
    out.print(f"smallest plan that still fails `{signature}` ({len(s.tried)} run(s)"
              f"{', budget used up' if outcome['exhausted'] else ''}): {len(best['faults'])} fault(s) "
              f"({gone} dropped), {best['steps']} steps: "
              + "; ".join(f"{f['instance']} {f['fault_id']} {f['trigger']}"
                          + (f" after {f['params'].get('after')}" if f['trigger'] != 'time' else f" at {f['at_s']} s")
                          + (f", window {f['window_s']} s" if f.get('window_s') else "") for f in best["faults"]),
              highlight=False, soft_wrap=True)
    out.print(f"replay it: {shrink.replay_command(wave_dir.parent, best, task_id)}", highlight=False, soft_wrap=True)
    out.print(f"SHRINK: {record}", highlight=False, soft_wrap=True)
    return EXIT_OK


class _shrink_progress:
    """A progress bar over the budget of runs (one line per run tried when there is no terminal)."""

    def __init__(self, budget: int, off: bool):
        self.budget, self.off, self.bar = budget, off, None

    def __enter__(self):
        if not self.off:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(TextColumn("shrink"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.id = self.bar.add_task("replaying the task as it ran", total=self.budget)
        return self.step

    def step(self, st: dict) -> None:
        line = f"run {st['step'] + 1}: {st['what']} -> {st['verdict']} {st['signature'] or ''}"
        if self.bar is not None:
            self.bar.update(self.id, advance=1, description=line[:80])
        else:
            print(terminal_safe(line), file=sys.stderr)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()

