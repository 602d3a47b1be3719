"""`sandfleet wave run` and `wave resume`, and the run of a wave every wave command ends in (`run_wave`: preflight,
run, grade, print the verdict, exit as the grade says)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cluster import results
from cluster.cli.common import (EXIT_BAD_INPUT, EXIT_HARNESS, check_results_root, dir_arg, out, err,
                                results_path, wave_app)


@wave_app.command("run")
def wave_run(
    config: Optional[Path] = typer.Argument(None, help="wave config (YAML); defaults if omitted"),
    tasks: Optional[int] = typer.Option(None, "--tasks", help="number of tasks"),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="tasks in flight"),
    seed: Optional[int] = typer.Option(None, "--seed", help="wave seed (plans every random choice)"),
    faults: Optional[str] = typer.Option(None, "--faults", help="comma-separated fault ids, e.g. PK1,ST1; "
                                                                 "'none' for no faults"),
    runner: Optional[str] = typer.Option(None, "--runner", help="built-in runner: durable | durable-local | naive"),
    workload: Optional[str] = typer.Option(None, "--workload",
                                           help="patch-repo | rename4 | hunks8 | longtool (the model's script)"),
    steps: Optional[int] = typer.Option(None, "--steps", help="steps per task (workload.steps)"),
    runner_cmd: Optional[str] = typer.Option(None, "--runner-cmd",
                                             help="any command as the runner, e.g. \"python agent.py\""),
    runner_workdir: Optional[Path] = typer.Option(None, "--runner-workdir",
                                                  help="directory of the runner's code (with --runner-cmd)"),
    results: Path = typer.Option(Path("results"), "--results", help="results root", parser=results_path,
                                 metavar="<path>"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray address ('local' = private Ray)"),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="simulated Ray nodes on this machine (head + N-1 "
                                                              "sandbox nodes); needed by PK3"),
    isolated_nodes: bool = typer.Option(False, "--isolated-nodes",
                                        help="with --nodes N: each node in namespaces of its own (its own network "
                                             "address, /tmp, /proc and cgroups), linked only to the head (root)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
    enumerate_boundaries: bool = typer.Option(
        False, "--enumerate-boundaries", help="run one uninterrupted task, count its boundaries (model answers, "
                                              "effects, store writes), then kill one task at each"),
    boundaries: Optional[int] = typer.Option(None, "--boundaries",
                                             help="with --enumerate-boundaries: a seeded sample of at most N"),
    min_sandbox_nodes: Optional[int] = typer.Option(
        None, "--min-sandbox-nodes", help="with --address: exit 2 before any task unless the cluster has at least "
                                          "N alive sandbox nodes (other than the driver's own)"),
) -> int:
    """Run a wave and grade it; prints where SUMMARY.md is."""
    from cluster.config import ConfigError, load_config

    if runner and runner_cmd:
        err("error: option --runner and --runner-cmd: give one of them (a built-in name, or a command)")
        return EXIT_BAD_INPUT
    if runner_workdir is not None and not runner_cmd:
        err("error: option --runner-workdir: only valid with --runner-cmd")
        return EXIT_BAD_INPUT
    if runner_cmd is not None:
        runner = {"command": runner_cmd, **({"workdir": str(runner_workdir)} if runner_workdir else {})}
    overrides = {"tasks": tasks, "concurrency": concurrency, "seed": seed, "runner": runner, "address": address,
                 "nodes": nodes, "enumerate_boundaries": enumerate_boundaries or None, "boundaries": boundaries,
                 "workload_name": workload, "workload_steps": steps,
                 "node_isolation": "namespaces" if isolated_nodes else None, "min_sandbox_nodes": min_sandbox_nodes}
    if faults is not None:
        overrides["faults"] = faults  # `none` = no faults; an empty string is refused (say `none`)
    try:
        cfg = load_config(config, overrides)
        check_results_root(results)
    except ConfigError as exc:
        err(f"error: {exc}")
        return EXIT_BAD_INPUT
    from cluster.driver import WaveRun

    try:
        from cluster import sweep

        dead = sweep.find()["waves"]
        if dead:
            err(f"warning: {len(dead)} dead wave(s) left things behind ({', '.join(sorted(dead)[:3])}); "
                 "`sandfleet wave resume RESULTS/<wave>` continues one, `sandfleet sweep --dry-run` lists what "
                 "they left and `sandfleet sweep` removes it")
    except OSError:
        pass
    return run_wave(cfg, lambda: WaveRun(cfg, results, progress=not no_progress),
                lambda: results.mkdir(parents=True, exist_ok=True))


def run_wave(cfg, make_wave, before=None) -> int:
    """Preflight, then run and grade the wave; a harness that cannot run it exits 2 with its message."""
    from cluster.driver import HarnessError

    if getattr(cfg, "node_isolation", "none") == "namespaces":
        from cluster import isolated

        try:  # first, before any thread: every later thread and child of this driver is in the head's namespace
            isolated.check_available(cfg.nodes)
            isolated.check_install()  # its own install under /tmp, where each node has a private one
            isolated.enter_once()
        except isolated.IsolationError as exc:
            err(f"error: {exc}")
            return EXIT_BAD_INPUT if exc.bad_input else EXIT_HARNESS
    try:
        wave = make_wave()  # (makes nothing on disk)
        wave.preflight()  # before anything is written; the wave's set-up does not check again
        if before is not None:
            before()
        result = wave.run()
    except HarnessError as exc:
        err(f"error: {exc}")
        return exc.exit_code
    return _report(wave, result)


def _report(wave, result: dict) -> int:
    from cluster.grade import exit_code

    summary = wave.out.summary
    if result.get("interrupted"):
        out.print(f"wave {result['wave_id']}: interrupted by {result['interrupted']}; graded what finished",
                  highlight=False, soft_wrap=True)
        out.print(f"SUMMARY: {summary}", highlight=False, soft_wrap=True)
        return 130 if result["interrupted"] == "SIGINT" else 143
    for e in result.get("harness_errors", []):
        err(f"harness error: {e}")
    if result.get("harness_errors") and wave.cfg.address == "fleet":
        from cluster import fleetrecord

        try:
            gone = fleetrecord.read() is None
        except fleetrecord.FleetError:
            gone = True
        if gone:  # the likely why: say it rather than leave the user with a refused connection
            err("harness error: the fleet of `sandfleet up` this wave ran on is no longer up (stopped with "
                 "`sandfleet down`, or a part of it died: its log is beside its record)")
    for e in result.get("runner_failures", []):
        err(f"runner failure: {e}")
    counts = {}
    for g in result["tasks"]:
        counts[g["verdict"]] = counts.get(g["verdict"], 0) + 1
    out.print(f"wave {result['wave_id']}: {result['verdict']} "
              f"({', '.join(f'{v} {n}' for v, n in sorted(counts.items()))})", highlight=False, soft_wrap=True)
    out.print(f"SUMMARY: {summary}", highlight=False, soft_wrap=True)
    return exit_code(result)


def stored_config(plan: dict, plan_path: Path, address: Optional[str]):
    """(the config a stored wave ran with, the same with `--address`), or the exit code after the error: a stored
    config that no longer validates is a damaged results file (2, naming plan.json and the field), an `--address`
    it refuses is bad input (254, naming the option)."""
    from cluster.config import ConfigError, build_config

    try:
        ran = build_config(plan["config"], source=f"{plan_path}, field config")
    except ConfigError as exc:
        err(f"error: {exc} (the stored plan is damaged)")
        return EXIT_HARNESS
    try:
        return ran, build_config(plan["config"], {"address": address}, source=f"option --address {address!r}")
    except ConfigError as exc:
        err(f"error: {exc}")
        return EXIT_BAD_INPUT


@wave_app.command("resume")
def wave_resume(
    results_dir: str = typer.Argument(..., help="the results directory of a wave whose driver died"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray address ('local' = private Ray)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
) -> int:
    """Continue a wave whose driver died: finished tasks keep their results, the others run on (next fence). Exit
    254 when RESULTS_DIR is not a wave's results directory, 2 when its plan.json is damaged (file and field named)."""
    import orjson

    from cluster import planfile, sweep
    from cluster.driver import WaveRun

    where = results_dir
    results_dir = dir_arg(results_dir, "RESULTS_DIR", "results/<wave id> of a wave whose driver died")
    if results_dir is None:
        return EXIT_BAD_INPUT
    try:
        plan = planfile.read(results_dir / results.PLAN)
    except FileNotFoundError as exc:
        err(f"error: argument RESULTS_DIR: {where} is not a wave's results directory ({exc.strerror}: "
             f"{results.PLAN}); pass results/<wave id>")
        return EXIT_BAD_INPUT
    except planfile.PlanError as exc:
        err(f"error: cannot resume: {exc}")
        return EXIT_HARNESS
    wave_id = plan["wave_id"]
    from cluster.artifacts import regular_bytes

    try:  # a regular file only: a FIFO there would hang the read
        ended = b'"event":"wave_end"' in regular_bytes(results_dir / results.TIMELINE)
    except FileNotFoundError:
        ended = False
    except (OSError, ValueError) as exc:
        err(f"error: cannot resume: {results_dir / results.TIMELINE}: not a readable regular file ({exc})")
        return EXIT_HARNESS
    if ended:
        err(f"error: wave {wave_id} already ended; grade it again with `sandfleet grade {results_dir}`")
        return EXIT_HARNESS
    private = private_dir(wave_id)
    try:
        alive = sweep.driver_alive(private)
    except (KeyError, TypeError, ValueError, AttributeError):  # a damaged driver record: no driver it names runs
        alive = False
    if alive:
        try:
            pid = orjson.loads((private / results.DRIVER_RECORD).read_bytes()).get("pid")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            pid = "?"
        err(f"error: wave {wave_id} is still running (driver pid {pid}); resume only a wave whose driver died")
        return EXIT_HARNESS
    got = stored_config(plan, results_dir / results.PLAN, address)
    if isinstance(got, int):
        return got
    ran, cfg = got
    if ran.address == "fleet":  # its data is in the fleet's store and ledger, not its own
        err(f"error: cannot resume {wave_id}: it ran on the fleet of `sandfleet up` (--address fleet), and a wave "
             "on a fleet cannot be resumed yet; run it again, and grade what finished with "
             f"`sandfleet grade {results_dir}`")
        return EXIT_HARNESS
    if not (private / "store").is_dir() and not ran.store.url:
        err(f"error: cannot resume {wave_id}: its store data ({private}/store) is gone (was it swept?). "
             f"Grade what finished with `sandfleet grade {results_dir}`")
        return EXIT_HARNESS
    def before():
        found = sweep.find(wave_id)
        for line in sweep.remove(found, keep_data=True) if found["waves"] else []:
            out.print(f"swept: {line}", highlight=False, soft_wrap=True)

    return run_wave(cfg, lambda: WaveRun(cfg, progress=not no_progress, resume_dir=results_dir), before)


def private_dir(wave_id: str) -> Path:
    """A wave's private dir (the driver's `/tmp/sandfleet-<wave id>`), of a wave id cluster/planfile.py checked: a
    plain name, never a path."""
    return Path(f"/tmp/sandfleet-{wave_id}")

