"""`sandfleet` command line.

Exit codes: 0 all passed, 1 a verdict failed, 2 unknown / not applied / harness
error, 254 bad arguments or config.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from cluster import results
from cluster.results import terminal_safe  # (a command's `results` option shadows the module in it)

EXIT_OK, EXIT_FAIL, EXIT_HARNESS, EXIT_BAD_INPUT = 0, 1, 2, 254

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
wave_app = typer.Typer(no_args_is_help=True, help="Run waves.")
app.add_typer(wave_app, name="wave")
campaign_app = typer.Typer(no_args_is_help=True, help="Search how strong a fault a runner survives.")
app.add_typer(campaign_app, name="campaign")
class _SafeConsole(Console):
    """A console that never prints a raw control byte: every string passes `results.terminal_safe` (what a runner
    wrote reaches the user's terminal only escaped), and rich markup and emoji codes in it are not interpreted."""

    def __init__(self, **kw):
        super().__init__(markup=False, emoji=False, **kw)

    def print(self, *objects, **kw):
        return super().print(*(terminal_safe(o) if isinstance(o, str) else o for o in objects), **kw)


out = _SafeConsole()


def _results_path(value: str) -> Path:
    """--results as typed: an empty one is refused (as a Path it would be the current directory)."""
    if not str(value).strip() or "\0" in str(value):
        raise typer.BadParameter(f"value {str(value)!r}: empty; give a directory (it is created if missing)")
    return Path(value)


def check_results_root(results: Path) -> None:
    """--results must be a directory we can create and write, checked before anything is written."""
    from cluster.config import ConfigError

    p = results.resolve()
    for top in ("/proc", "/sys", "/dev"):
        if p == Path(top) or Path(top) in p.parents:
            raise ConfigError(f"option --results {str(results)!r}: {str(p)!r} is under {top}, a kernel file system "
                              "that holds no results; give a directory on a disk (it is created if missing)")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"option --results {str(results)!r}: {str(probe)!r} is a file, not a directory; "
                          "give a directory (it is created if missing)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"option --results {str(results)!r}: {str(probe)!r} is not writable; "
                          "give a directory you can write")


def _dir_arg(value: str, name: str, what: str = "a wave's results directory (e.g. results/latest)") -> Path | None:
    """A directory argument, checked before anything reads it: None (after naming the argument on stderr) when it
    is empty (`''` is not the current directory), does not exist, or is not a directory."""
    if not value or not value.strip() or "\0" in value:
        _err(f"error: argument {name}: value {value!r}: empty; pass {what}")
        return None
    p = Path(value)
    if not p.is_dir():
        why = "is not a directory" if p.exists() or p.is_symlink() else "does not exist"
        _err(f"error: argument {name}: {value!r} {why}; pass {what}")
        return None
    return p


def _seal(results_dir: Path) -> None:
    """Seal a wave's folder again after its files were rewritten (a seal that fails is said, never fatal)."""
    from cluster.seal import SealError, seal

    try:
        seal(results_dir)
    except (SealError, OSError) as exc:
        _err(f"warning: {results_dir} not sealed: {exc}")


def _err(msg: str) -> None:
    """Errors go to stderr unwrapped, so a long valid-choices list stays greppable; escaped (`terminal_safe`)."""
    sys.stderr.write(terminal_safe(msg.rstrip("\n")) + "\n")


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
    results: Path = typer.Option(Path("results"), "--results", help="results root", parser=_results_path,
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
        _err("error: option --runner and --runner-cmd: give one of them (a built-in name, or a command)")
        return EXIT_BAD_INPUT
    if runner_workdir is not None and not runner_cmd:
        _err("error: option --runner-workdir: only valid with --runner-cmd")
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
        _err(f"error: {exc}")
        return EXIT_BAD_INPUT
    from cluster.driver import WaveRun

    try:
        from cluster import sweep

        dead = sweep.find()["waves"]
        if dead:
            _err(f"warning: {len(dead)} dead wave(s) left things behind ({', '.join(sorted(dead)[:3])}); "
                 "`sandfleet wave resume RESULTS/<wave>` continues one, `sandfleet sweep --dry-run` lists what "
                 "they left and `sandfleet sweep` removes it")
    except OSError:
        pass
    return _run(cfg, lambda: WaveRun(cfg, results, progress=not no_progress),
                lambda: results.mkdir(parents=True, exist_ok=True))


def _run(cfg, make_wave, before=None) -> int:
    """Preflight, then run and grade the wave; a harness that cannot run it exits 2 with its message."""
    from cluster.driver import HarnessError, preflight

    if getattr(cfg, "node_isolation", "none") == "namespaces":
        from cluster import isolated

        try:  # first, before any thread: every later thread and child of this driver is in the head's namespace
            isolated.check_available(cfg.nodes)
            isolated.check_install()  # its own install under /tmp, where each node has a private one
            isolated.enter_once()
        except isolated.IsolationError as exc:
            _err(f"error: {exc}")
            return EXIT_BAD_INPUT if exc.bad_input else EXIT_HARNESS
    try:
        preflight(cfg)
        if before is not None:
            before()
        wave = make_wave()
        result = wave.run()
    except HarnessError as exc:
        _err(f"error: {exc}")
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
        _err(f"harness error: {e}")
    if result.get("harness_errors") and wave.cfg.address == "fleet":
        from cluster import localfleet

        try:
            gone = localfleet.read() is None
        except localfleet.FleetError:
            gone = True
        if gone:  # the likely why: say it rather than leave the user with a refused connection
            _err("harness error: the fleet of `sandfleet up` this wave ran on is no longer up (stopped with "
                 "`sandfleet down`, or a part of it died: its log is beside its record)")
    for e in result.get("runner_failures", []):
        _err(f"runner failure: {e}")
    counts = {}
    for g in result["tasks"]:
        counts[g["verdict"]] = counts.get(g["verdict"], 0) + 1
    out.print(f"wave {result['wave_id']}: {result['verdict']} "
              f"({', '.join(f'{v} {n}' for v, n in sorted(counts.items()))})", highlight=False, soft_wrap=True)
    out.print(f"SUMMARY: {summary}", highlight=False, soft_wrap=True)
    return exit_code(result)


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
    from cluster.config import ConfigError, build_config
    from cluster.driver import WaveRun

    where = results_dir
    results_dir = _dir_arg(results_dir, "RESULTS_DIR", "results/<wave id> of a wave whose driver died")
    if results_dir is None:
        return EXIT_BAD_INPUT
    try:
        plan = planfile.read(results_dir / results.PLAN)
    except FileNotFoundError as exc:
        _err(f"error: argument RESULTS_DIR: {where} is not a wave's results directory ({exc.strerror}: "
             f"{results.PLAN}); pass results/<wave id>")
        return EXIT_BAD_INPUT
    except planfile.PlanError as exc:
        _err(f"error: cannot resume: {exc}")
        return EXIT_HARNESS
    wave_id = plan["wave_id"]
    from cluster.artifacts import _regular_bytes

    try:  # a regular file only: a FIFO there would hang the read
        ended = b'"event":"wave_end"' in _regular_bytes(results_dir / results.TIMELINE)
    except FileNotFoundError:
        ended = False
    except (OSError, ValueError) as exc:
        _err(f"error: cannot resume: {results_dir / results.TIMELINE}: not a readable regular file ({exc})")
        return EXIT_HARNESS
    if ended:
        _err(f"error: wave {wave_id} already ended; grade it again with `sandfleet grade {results_dir}`")
        return EXIT_HARNESS
    private = _private_dir(wave_id)
    try:
        alive = sweep.driver_alive(private)
    except (KeyError, TypeError, ValueError, AttributeError):  # a damaged driver record: no driver it names runs
        alive = False
    if alive:
        try:
            pid = orjson.loads((private / results.DRIVER_RECORD).read_bytes()).get("pid")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            pid = "?"
        _err(f"error: wave {wave_id} is still running (driver pid {pid}); resume only a wave whose driver died")
        return EXIT_HARNESS
    try:
        ran = build_config(plan["config"], source=f"{results_dir / results.PLAN}, field config")
        cfg = build_config(plan["config"], {"address": address}, source=str(results_dir / results.PLAN))
    except ConfigError as exc:
        _err(f"error: {exc}")
        return EXIT_BAD_INPUT
    if ran.address == "fleet":  # its data is in the fleet's store and ledger, not its own
        _err(f"error: cannot resume {wave_id}: it ran on the fleet of `sandfleet up` (--address fleet), and a wave "
             "on a fleet cannot be resumed yet; run it again, and grade what finished with "
             f"`sandfleet grade {results_dir}`")
        return EXIT_HARNESS
    if not (private / "store").is_dir() and not ran.store.url:
        _err(f"error: cannot resume {wave_id}: its store data ({private}/store) is gone (was it swept?). "
             f"Grade what finished with `sandfleet grade {results_dir}`")
        return EXIT_HARNESS
    def before():
        found = sweep.find(wave_id)
        for line in sweep.remove(found, keep_data=True) if found["waves"] else []:
            out.print(f"swept: {line}", highlight=False, soft_wrap=True)

    return _run(cfg, lambda: WaveRun(cfg, progress=not no_progress, resume_dir=results_dir), before)


def _private_dir(wave_id: str) -> Path:
    """A wave's private dir (the driver's `/tmp/sandfleet-<wave id>`), of a wave id cluster/planfile.py checked: a
    plain name, never a path."""
    return Path(f"/tmp/sandfleet-{wave_id}")


def _task_of_wave(task_path: str, address: Optional[str]):
    """`results/<wave>/<task>` read for replay and shrink: (wave dir, task id, plan, config, planned task), or the
    exit code after an error that names what is wrong (254 a bad argument, 2 a damaged plan.json)."""

    from cluster import planfile
    from cluster.config import ConfigError, build_config

    if not task_path or not task_path.strip() or "\0" in task_path:
        _err(f"error: argument TASK_PATH: value {task_path!r}: empty; pass results/<wave id>/<task id>, "
             "e.g. results/latest/t003")
        return EXIT_BAD_INPUT
    # `results/latest/t003` is the wave `latest` names now: a shrink's runs move `latest`, and linking it back to
    # `latest` itself made it a loop
    wave_dir, task_id = Path(task_path).parent.resolve(), Path(task_path).name
    try:
        plan = planfile.read(wave_dir / results.PLAN)
    except (FileNotFoundError, NotADirectoryError) as exc:
        _err(f"error: argument TASK_PATH: {wave_dir} is not a wave's results directory ({exc.strerror}: "
             f"{results.PLAN}); pass results/<wave id>/<task id>, e.g. results/latest/t003")
        return EXIT_BAD_INPUT
    except planfile.PlanError as exc:
        _err(f"error: {exc}")
        return EXIT_HARNESS
    try:
        cfg = build_config(plan["config"], {"address": address}, source=str(wave_dir / results.PLAN))
    except ConfigError as exc:
        _err(f"error: {exc}")
        return EXIT_BAD_INPUT
    tasks = plan["tasks"]
    task = next((t for t in tasks if t["task_id"] == task_id), None)
    if task is None:
        _err(f"error: argument TASK_PATH: wave {plan['wave_id']} has no task {task_id!r}; its tasks: "
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
    return _run(cfg, lambda: WaveRun(cfg, wave_dir.parent, progress=not no_progress, replay=(plan, task_id)))


@app.command("grade")
def grade_cmd(results_dir: str = typer.Argument(..., help="a wave's results directory")) -> int:
    """Re-grade a finished wave from its stored files (runs nothing). Exit as a wave does (0, 1, 2); 2 also when a
    stored file it needs is damaged (named), 254 when RESULTS_DIR is empty, missing or not a wave's directory."""
    from cluster.grade import exit_code, grade_wave
    from cluster.report import write_summary

    results_dir = _dir_arg(results_dir, "RESULTS_DIR") if isinstance(results_dir, str) else results_dir
    if results_dir is None:
        return EXIT_BAD_INPUT
    if not (results_dir / results.PLAN).is_file():
        _err(f"error: {results_dir} has no plan.json; pass a wave's results directory (e.g. results/latest)")
        return EXIT_BAD_INPUT
    from cluster.grade import Unreadable

    damaged = _damaged_plan(results_dir)  # the plan is the grade's spine: one of another shape is named, not guessed
    if damaged:
        _err(f"error: cannot grade {results_dir}: {damaged} (the file is damaged; nothing was graded, SUMMARY.md and "
             "the grade files there are from before)")
        return EXIT_HARNESS
    try:
        result = grade_wave(results_dir)
    except Unreadable as exc:
        _err(f"error: cannot grade {results_dir}: {exc} (the file is damaged; nothing was graded, "
             "SUMMARY.md and the grade files there are from before)")
        return EXIT_HARNESS
    except Exception as exc:  # noqa: BLE001 - a damaged wave dir is a harness problem, never a verdict
        _err(f"error: cannot grade {results_dir}: {_damaged_plan(results_dir) or f'{type(exc).__name__}: {exc}'} "
             "(a results file has unexpected content; nothing was graded)")
        return EXIT_HARNESS
    write_summary(results_dir, result)
    _seal(results_dir)
    out.print(f"wave {result['wave_id']}: {result['verdict']}", highlight=False, soft_wrap=True)
    out.print(f"SUMMARY: {results_dir / results.SUMMARY}", highlight=False, soft_wrap=True)
    return exit_code(result)


def _damaged_plan(results_dir: Path) -> str | None:
    """What is wrong with a wave's plan.json (file and field, cluster/planfile.py), or None when it has the shape the
    planner writes: said when the grader could not read a wave, rather than the error it stumbled on."""

    from cluster import planfile

    try:
        planfile.read(results_dir / results.PLAN)
    except planfile.PlanError as exc:
        return str(exc)
    except OSError as exc:
        return f"{results_dir / results.PLAN}: {exc.strerror or exc}"
    return None


@app.command("verify")
def verify_cmd(results_dir: str = typer.Argument(..., help="a wave's results directory"),
               public_key: Optional[str] = typer.Option(None, "--public-key",
                                                       help="the sealer's Ed25519 public key (hex): refuse a seal "
                                                            "made with any other")) -> int:
    """Check that a wave's folder is the one its seal names: the seal's signature, and every file's sha256 (exit 0
    intact, 1 a file changed, added or missing, each named; 2 no seal, or a damaged or foreign one; 254 RESULTS_DIR
    empty, missing or not a directory). A link is named with its target's digest, never followed; a file the seal
    does not list is named without being read."""
    from cluster.seal import SealError, verify

    results_dir = _dir_arg(results_dir, "RESULTS_DIR")
    if results_dir is None:
        return EXIT_BAD_INPUT

    if public_key is not None and not (len(public_key) == 64 and all(c in "0123456789abcdefABCDEF"
                                                                     for c in public_key)):
        _err(f"error: option --public-key: value {public_key!r}: expected 64 hex digits (an Ed25519 public key)")
        return EXIT_BAD_INPUT
    try:
        got = verify(results_dir, public_key)
    except SealError as exc:
        _err(f"error: cannot verify {results_dir}: {exc}")
        return EXIT_HARNESS
    if got["ok"]:
        out.print(f"{results_dir}: intact, sealed by key {got['fingerprint']}", highlight=False, soft_wrap=True)
        return EXIT_OK
    for what in ("changed", "added", "missing"):
        for name in got[what]:
            _err(f"{what}: {name}")
    _err(f"{results_dir}: NOT the folder key {got['fingerprint']} sealed: {len(got['changed'])} changed, "
         f"{len(got['added'])} added, {len(got['missing'])} missing")
    return EXIT_FAIL


@app.command("report")
def report_cmd(results_dir: str = typer.Argument(..., help="a wave's results directory")) -> int:
    """Render a finished wave's SUMMARY.md and index.html again from its stored files (graded again from them, as
    `sandfleet grade` does, with its exit codes; runs nothing)."""
    results_dir = _dir_arg(results_dir, "RESULTS_DIR")
    if results_dir is None:
        return EXIT_BAD_INPUT
    code = grade_cmd(results_dir)
    if code in (0, 1, 2) and (results_dir / results.INDEX_HTML).is_file():
        out.print(f"REPORT: {results_dir / results.INDEX_HTML}", highlight=False, soft_wrap=True)
    return code


@app.command("league")
def league_cmd(
    config: Path = typer.Argument(..., help="league config (YAML): runners, fault_sets, wave"),
    results: Path = typer.Option(Path("results"), "--results", help="results root", parser=_results_path,
                                 metavar="<path>"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars"),
) -> int:
    """Run the same seeded waves over several runners and fault sets; writes LEAGUE.md and league.png."""
    from cluster.config import ConfigError
    from cluster.driver import HarnessError, preflight
    from cluster.league import load_league, run_league

    try:
        league = load_league(config)
        check_results_root(results)
    except ConfigError as exc:
        _err(f"error: {exc}")
        return EXIT_BAD_INPUT
    try:
        preflight(league.waves()[0][2])
        results.mkdir(parents=True, exist_ok=True)
        out = run_league(league, results, progress=not no_progress)
    except HarnessError as exc:
        _err(f"error: {exc}")
        return exc.exit_code
    import orjson

    from cluster.league import manifest_warnings
    from cluster.results import LEAGUE_JSON, LEAGUE_MD  # (`results` here is the --results dir)

    rows = orjson.loads((out / LEAGUE_JSON).read_bytes())["rows"]
    for line in manifest_warnings(rows)[3:]:
        _err(f"warning: {line[2:]}")
    print(terminal_safe((out / LEAGUE_MD).read_text()))
    out_console = _SafeConsole()
    out_console.print(f"LEAGUE: {out / LEAGUE_MD}", highlight=False, soft_wrap=True)
    return EXIT_OK


@app.command("serve")
def serve_cmd(
    results_root: str = typer.Argument("results", help="a results root (every wave under it)"),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="the port on 127.0.0.1 (0: one it picks)"),
) -> int:
    """Every wave under a results root as a web page on 127.0.0.1: by date, runner, faults and verdict, each
    cell's trend across waves, flaky cells marked."""
    from cluster.serve import serve

    results_root = _dir_arg(results_root, "RESULTS_ROOT", "a results root (e.g. results)")
    if results_root is None:
        return EXIT_BAD_INPUT
    try:
        serve(results_root, port, lambda url: out.print(f"serving {results_root.resolve()} at {url} (Ctrl-C stops)",
                                                        highlight=False, soft_wrap=True))
    except OSError as exc:
        _err(f"error: cannot listen on 127.0.0.1:{port}: {exc}")
        return EXIT_HARNESS
    except KeyboardInterrupt:
        pass
    return EXIT_OK


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
        _err(f"error: {grade_file} is missing or damaged ({exc}); `sandfleet grade {wave_dir}` grades the wave again")
        return EXIT_HARNESS
    if not isinstance(grade, dict) or grade.get("verdict") not in ("pass", "fail", "unknown", "not_applied") \
            or (grade["verdict"] == "fail" and not isinstance(grade.get("signature"), str)):
        _err(f"error: {grade_file} is damaged: not a task's grade (a verdict, and a failure's signature); "
             f"`sandfleet grade {wave_dir}` grades the wave again")
        return EXIT_HARNESS
    if grade.get("verdict") != "fail" or not grade.get("signature"):
        out.print(f"task {task_id} of wave {plan.get('wave_id')} is `{grade.get('verdict')}`, not a failure with a "
                  "signature: nothing to shrink (nothing was run)", highlight=False, soft_wrap=True)
        return EXIT_OK
    changed = shrink.code_changed(plan)
    for line in shrink.manifest_drift(plan, cfg):  # not a refusal: the failure may still be the same one
        _err(f"warning: manifest differs from what runs now: {line}")
    if changed and not anyway:
        _err(f"error: the runner's code is not what wave {plan.get('wave_id')} ran, so its failure may not be the "
             f"same failure any more: {'; '.join(changed)}. Pass --anyway to shrink it on the code as it is now")
        return EXIT_BAD_INPUT
    for line in changed:
        _err(f"warning: manifest differs: {line}")
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
        _err(f"error: {exc}")
        return exc.exit_code
    finally:
        if fleet is not None:
            fleet.stop()
    results.link_latest(wave_dir.parent, wave_dir)  # `latest` is the wave shrunk, not its last trial run
    record = shrink.write_record(wave_dir, task_id, signature, outcome, s.tried, budget, changed)
    best = outcome["smallest"]
    if not outcome["reproduced"]:
        _err(f"the failure did not reproduce: replayed as it ran, task {task_id} was `{best['verdict']}` "
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


@campaign_app.command("storage")
def campaign_storage(
    fault: str = typer.Option(..., "--fault", help="ST1 ST2 ST3 ST4 ST5 ST7 ST8 or CR1"),
    runner: str = typer.Option("durable", "--runner", help="built-in runners, comma-separated (durable,naive)"),
    runner_cmd: Optional[str] = typer.Option(None, "--runner-cmd", help="your runner's command (beside --runner)"),
    runner_workdir: Optional[Path] = typer.Option(None, "--runner-workdir", help="its code's directory"),
    window: str = typer.Option(..., "--window", help="the strength range LO-HI, e.g. 0.5-300 (seconds for ST1)"),
    probes: int = typer.Option(6, "--probes", min=2, max=50, help="waves per runner"),
    tasks: int = typer.Option(3, "--tasks", min=1, max=1000, help="tasks per wave"),
    seed: int = typer.Option(1, "--seed", min=0, help="wave seed"),
    config: Optional[Path] = typer.Option(None, "--config", help="wave config the waves start from"),
    results: Path = typer.Option(Path("results"), "--results", help="results root", parser=_results_path,
                                 metavar="<path>"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars"),
) -> int:
    """Bisect the strength of one storage fault (an outage's length, a latency, an error share, a lag) to find
    the strongest a runner survives; writes CAMPAIGN.md and campaign.png."""
    import yaml

    from cluster.campaign import parse_range, plan_waves, run_campaign
    from cluster.config import ConfigError, load_yaml
    from cluster.driver import HarnessError, preflight

    try:
        lo, hi = parse_range(window)
        base = {}
        if config is not None:
            if not config.is_file():
                raise ConfigError(f"--config {str(config)!r} does not exist")
            try:
                base = load_yaml(config.read_text()) or {}
            except yaml.YAMLError as err:
                raise ConfigError(f"--config {str(config)!r} is not valid YAML: {err}") from None
            if not isinstance(base, dict):
                raise ConfigError(f"--config {str(config)!r}: top level must be a mapping")
        base = {**base, "tasks": tasks, "concurrency": min(tasks, base.get("concurrency", tasks)), "seed": seed}
        runners: list = [r.strip() for r in runner.split(",") if r.strip()] if runner else []
        if runner_cmd:
            runners.append({"command": runner_cmd, **({"workdir": str(runner_workdir)} if runner_workdir else {})})
        if not runners:
            raise ConfigError("--runner / --runner-cmd: give at least one runner")
        plan_waves(fault, runners, lo, hi, base)
        check_results_root(results)
    except ConfigError as exc:
        _err(f"error: {exc}")
        return EXIT_BAD_INPUT
    from cluster.campaign import CampaignInterrupted, _config

    try:
        preflight(_config(fault, runners[0], lo, base))
        results.mkdir(parents=True, exist_ok=True)
        d = run_campaign(fault, runners, lo, hi, base, results, probes=probes, progress=not no_progress)
    except HarnessError as exc:
        _err(f"error: {exc}")
        return exc.exit_code
    except CampaignInterrupted as exc:
        _err(f"interrupted by {exc}: the finished waves are written (CAMPAIGN.md says the bracket is partial)")
        return 143 if "TERM" in str(exc) else 130
    from cluster.results import CAMPAIGN_MD  # (`results` here is the --results dir)

    print(terminal_safe((d / CAMPAIGN_MD).read_text()))
    _SafeConsole().print(f"CAMPAIGN: {d / CAMPAIGN_MD}", highlight=False, soft_wrap=True)
    return EXIT_OK


@app.command("sweep")
def sweep_cmd(
    wave: Optional[str] = typer.Option(None, "--wave", help="only this wave id"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list what would be removed, change nothing"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="HOST:PORT of a Ray cluster's GCS: sweep every "
                                          "alive node of it, each its own leftovers (token auth: RAY_AUTH_TOKEN)"),
    include_resumable: bool = typer.Option(False, "--include-resumable", help="also remove the store data and "
                                           "ledger of a dead wave that `wave resume` could continue (kept otherwise, "
                                           "for 7 days)"),
) -> int:
    """Find and remove what dead waves left behind (processes, sandboxes, cgroups, mounts, key files). Without
    --cluster, this machine only: on a cluster of other machines, run it on each, or give --cluster. A dead wave
    that `wave resume` could continue is listed as resumable and its store and ledger are kept (for 7 days) unless
    --include-resumable."""
    from cluster import sweep

    if cluster is not None:
        return _sweep_cluster(cluster, wave, dry_run)

    unseen: list = []
    found = sweep.find(wave, unseen)
    lines = sweep.summary(found, include_resumable)
    for why in unseen:  # a part of the machine the sweep could not look at: say so, and do not say "nothing"
        _err(f"warning: {why}; run `sandfleet sweep` again once it answers")
    if found.get("bad_fleet_record"):  # never removed: it is not a fleet's
        _err(f"warning: left alone: {found['bad_fleet_record']}")
    if not lines:
        out.print("nothing left behind by a dead wave" + (" that could be looked at" if unseen else ""),
                  highlight=False, soft_wrap=True)
        return EXIT_HARNESS if unseen else EXIT_OK
    for line in lines:
        out.print(("would remove: " if dry_run else "found: ") + line, highlight=False, soft_wrap=True)
    if not dry_run:
        for line in sweep.remove(found, include_resumable=include_resumable):
            out.print(f"  {line}", highlight=False, soft_wrap=True)
    return EXIT_HARNESS if unseen else EXIT_OK


def _sweep_cluster(address: str, wave: str | None, dry_run: bool) -> int:
    from cluster import sweep
    from cluster.config import WaveConfig

    try:
        WaveConfig.model_validate({"address": address})
    except Exception:  # noqa: BLE001 - the config's own check of an address names what is allowed
        _err(f"--cluster: value {address!r}: expected HOST:PORT of a Ray head's GCS, e.g. 10.0.0.5:6379")
        return EXIT_BAD_INPUT
    try:
        got = sweep.on_cluster(address, wave, dry_run)
    except Exception as exc:  # noqa: BLE001 - no cluster there, a wrong token
        _err(f"--cluster {address}: could not reach the cluster: {type(exc).__name__}: {str(exc)[:300]}")
        return EXIT_HARNESS
    bad = False
    for node, r in sorted(got.items()):
        if "error" in r:
            bad = True
            _err(f"node {node}: the sweep did not come back: {r['error']}")
            continue
        for why in r["unseen"]:
            bad = True
            _err(f"node {node}: warning: {why}")
        if not r["found"]:
            out.print(f"node {node}: nothing left behind by a dead wave", highlight=False, soft_wrap=True)
        for line in r["found"]:
            out.print(f"node {node}: " + ("would remove: " if dry_run else "found: ") + line, highlight=False,
                      soft_wrap=True)
        for line in r["done"]:
            out.print(f"node {node}:   {line}", highlight=False, soft_wrap=True)
    return EXIT_HARNESS if bad else EXIT_OK


@app.command("up")
def up_cmd() -> int:
    """Start a long-lived local fleet (a private Ray, the harness's actors, one store) that waves attach to with
    --address fleet; found through /run/sandfleet/fleet.json ($SANDFLEET_FLEET_FILE). Exit 0 once it is up (or
    was), 2 when it could not start."""
    from cluster import localfleet

    try:
        info, started = localfleet.up()
    except localfleet.FleetError as exc:
        _err(f"error: {exc}")
        return EXIT_HARNESS
    out.print(f"fleet {'up' if started else 'already up'}: pid {info['pid']}, Ray {info['ray']['address']}, store "
              f"{info['store']['url']}; run waves with --address fleet; `sandfleet down` stops it",
              highlight=False, soft_wrap=True)
    return EXIT_OK


@app.command("down")
def down_cmd() -> int:
    """Stop the fleet of `sandfleet up` (its sandboxes, actors, Ray and store). Exit 0 when it is down (or none was
    up), 2 when it had to be killed and swept, or the record file is not a fleet's (left as it is)."""
    from cluster import localfleet

    try:
        info = localfleet.down()
    except localfleet.FleetError as exc:
        _err(f"error: {exc}")
        return EXIT_HARNESS
    if info is None:
        out.print("no fleet is up", highlight=False, soft_wrap=True)
        return EXIT_OK
    if info.get("waves"):
        _err("warning: the fleet was stopped under running wave(s), which end with a harness error (exit 2): "
             + ", ".join(f"{w['wave']} (pid {w['pid']})" for w in info["waves"]))
    for line in info.get("swept", []):
        out.print(f"  {line}", highlight=False, soft_wrap=True)
    if info.get("killed"):
        _err(f"error: the fleet's daemon (pid {info['pid']}) did not stop in {localfleet.DOWN_TIMEOUT_S:.0f} s: "
             "killed, and what it left was swept")
        return EXIT_HARNESS
    if not info.get("stopped"):
        out.print(f"no fleet daemon of {localfleet.fleet_file()} was running (pid {info['pid']} is not it): removed "
                  "its record and what its fleet left", highlight=False, soft_wrap=True)
        return EXIT_OK
    out.print(f"fleet down (pid {info['pid']})", highlight=False, soft_wrap=True)
    return EXIT_OK


@app.command("status")
def status_cmd() -> int:
    """Is the fleet of `sandfleet up` up, and do its Ray and store answer? Exit 0 when up and answering, 1 when no
    fleet is up, 2 when one is up but a part of it does not answer, or the record file is not a fleet's."""
    from cluster import localfleet

    try:
        st = localfleet.status()
        gone = localfleet.stale() if st is None else None
    except localfleet.FleetError as exc:
        _err(f"error: {exc}")
        return EXIT_HARNESS
    if st is None:
        out.print("no fleet is up" + (f" (the record of a dead one is there, pid {gone.get('pid')}: "
                                       "`sandfleet sweep` removes it)" if gone else ""), highlight=False,
                  soft_wrap=True)
        return EXIT_FAIL
    for k in ("pid", "up_s", "ray", "ray_answers", "store", "store_answers", "bucket", "nodes", "state_dir", "file",
              "waves"):
        out.print(f"{k}: {st[k]}", highlight=False, soft_wrap=True)
    return EXIT_OK if st["ray_answers"] and st["store_answers"] else EXIT_HARNESS


@app.command("faults")
def faults_cmd() -> int:
    """List the fault catalog, the disk modes each fault accepts, and the disk's boundaries."""
    from faults import CATALOG
    from faults.base import DISK_BOUNDARIES, DISK_MODES

    for fid, f in sorted(CATALOG.items()):
        out.print(f"{fid}  {f.family:<11} {f.description}", highlight=False, soft_wrap=True)
        modes = getattr(f, "disk_modes", ())
        out.print(f"     {'':<11} disk: " + (", ".join(modes) if modes else "- (ends no attempt: the disk stays as "
                                                                            "it is)"), highlight=False, soft_wrap=True)
    out.print("\ndisk modes (sandbox.disk, fault_timing.<id>.disk; what an interruption that ends an attempt leaves of "
              "the task's disk, its workspace and HOME):", highlight=False, soft_wrap=True)
    for mode, what in DISK_MODES.items():
        out.print(f"  {mode:<14} {what}", highlight=False, soft_wrap=True)
    out.print("\ndisk boundaries (fault_timing.PK1, [lo, hi]; --enumerate-boundaries counts them on a kept disk):",
              highlight=False, soft_wrap=True)
    for key, what in DISK_BOUNDARIES.items():
        out.print(f"  {key:<19} {what}", highlight=False, soft_wrap=True)
    return 0


def main(argv: list[str] | None = None) -> None:
    try:
        rv = app(args=argv, standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - typer vendors click; its usage errors carry exit_code 2
        if callable(getattr(exc, "show", None)) and getattr(exc, "exit_code", None) == 2:
            if type(exc).__name__ == "NoArgsIsHelpError":
                exc.show()
                sys.exit(0)
            _err(f"error: {exc.format_message() if hasattr(exc, 'format_message') else exc}")
            if getattr(exc, "ctx", None) is not None:
                _err(exc.ctx.get_usage())
            sys.exit(EXIT_BAD_INPUT)
        raise
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
