"""`sandfleet` command line.

Exit codes: 0 all passed, 1 a verdict failed, 2 unknown / not applied / harness
error, 254 bad arguments or config.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click
import typer
from rich.console import Console

EXIT_OK, EXIT_FAIL, EXIT_HARNESS, EXIT_BAD_INPUT = 0, 1, 2, 254

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
wave_app = typer.Typer(no_args_is_help=True, help="Run waves.")
app.add_typer(wave_app, name="wave")
err = Console(stderr=True)
out = Console()


@wave_app.command("run")
def wave_run(
    config: Optional[Path] = typer.Argument(None, help="wave config (YAML); defaults if omitted"),
    tasks: Optional[int] = typer.Option(None, "--tasks", help="number of tasks"),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="tasks in flight"),
    seed: Optional[int] = typer.Option(None, "--seed", help="wave seed (plans every random choice)"),
    faults: Optional[str] = typer.Option(None, "--faults", help="comma-separated fault ids, e.g. PK1,ST1; "
                                                                 "'none' for no faults"),
    runner: Optional[str] = typer.Option(None, "--runner", help="durable | naive"),
    results: Path = typer.Option(Path("results"), "--results", help="results root"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray address ('local' = private Ray)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
) -> int:
    """Run a wave and grade it; prints where SUMMARY.md is."""
    from cluster.config import ConfigError, load_config

    overrides = {"tasks": tasks, "concurrency": concurrency, "seed": seed, "runner": runner, "address": address}
    if faults is not None:
        overrides["faults"] = [] if faults.strip().lower() in ("", "none") else faults
    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False, markup=True)
        return EXIT_BAD_INPUT
    from cluster.driver import HarnessError, WaveRun
    from cluster.grade import exit_code

    results.mkdir(parents=True, exist_ok=True)
    wave = WaveRun(cfg, results, progress=not no_progress)
    try:
        result = wave.run()
    except HarnessError as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        return EXIT_HARNESS
    summary = wave.dir / "SUMMARY.md"
    for e in result.get("harness_errors", []):
        err.print(f"harness error: {e}", highlight=False, markup=False)
    counts = {}
    for g in result["tasks"]:
        counts[g["verdict"]] = counts.get(g["verdict"], 0) + 1
    out.print(f"wave {result['wave_id']}: {result['verdict']} "
              f"({', '.join(f'{v} {n}' for v, n in sorted(counts.items()))})", highlight=False)
    out.print(f"SUMMARY: {summary}", highlight=False)
    return exit_code(result)


@app.command("grade")
def grade_cmd(results_dir: Path = typer.Argument(..., help="a wave's results directory")) -> int:
    """Re-grade a finished wave from its stored files (runs nothing)."""
    from cluster.grade import exit_code, grade_wave
    from cluster.report import write_summary

    if not (results_dir / "plan.json").is_file():
        err.print(f"error: {results_dir} has no plan.json; pass a wave's results directory "
                  f"(e.g. results/latest)", highlight=False, markup=False)
        return EXIT_BAD_INPUT
    result = grade_wave(results_dir)
    write_summary(results_dir, result)
    out.print(f"wave {result['wave_id']}: {result['verdict']}", highlight=False)
    out.print(f"SUMMARY: {results_dir / 'SUMMARY.md'}", highlight=False)
    return exit_code(result)


@app.command("faults")
def faults_cmd() -> int:
    """List the fault catalog."""
    from faults import CATALOG

    for fid, f in sorted(CATALOG.items()):
        out.print(f"{fid}  {f.family:<11} {f.description}", highlight=False)
    return 0


def main(argv: list[str] | None = None) -> None:
    try:
        rv = app(args=argv, standalone_mode=False)
    except click.exceptions.UsageError as exc:
        exc.show()
        sys.exit(EXIT_BAD_INPUT)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
