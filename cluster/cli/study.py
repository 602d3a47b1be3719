"""`sandfleet league` and `sandfleet campaign storage`: many seeded waves over runners, fault sets or strengths."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cluster.cli.common import (EXIT_BAD_INPUT, EXIT_OK, SafeConsole, app, campaign_app, check_results_root,
                                err, results_path)
from cluster.results import terminal_safe


@app.command("league")
def league_cmd(
    config: Path = typer.Argument(..., help="league config (YAML): runners, fault_sets, wave"),
    results: Path = typer.Option(Path("results"), "--results", help="results root", parser=results_path,
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
        err(f"error: {exc}")
        return EXIT_BAD_INPUT
    try:
        preflight(league.waves()[0][2])
        results.mkdir(parents=True, exist_ok=True)
        out = run_league(league, results, progress=not no_progress)
    except HarnessError as exc:
        err(f"error: {exc}")
        return exc.exit_code
    import orjson

    from cluster.league import manifest_warnings
    from cluster.results import LEAGUE_JSON, LEAGUE_MD  # (`results` here is the --results dir)

    rows = orjson.loads((out / LEAGUE_JSON).read_bytes())["rows"]
    for line in manifest_warnings(rows)[3:]:
        err(f"warning: {line[2:]}")
    print(terminal_safe((out / LEAGUE_MD).read_text()))
    out_console = SafeConsole()
    out_console.print(f"LEAGUE: {out / LEAGUE_MD}", highlight=False, soft_wrap=True)
    return EXIT_OK


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
    results: Path = typer.Option(Path("results"), "--results", help="results root", parser=results_path,
                                 metavar="<path>"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bars"),
) -> int:
    """Bisect the strength of one storage fault (an outage's length, a latency, an error share, a lag) to find
    the strongest a runner survives; writes CAMPAIGN.md and campaign.png."""
    import yaml

    from cluster.campaign import parse_range, plan_waves, run_campaign
    from cluster.config import ConfigError, load_yaml
    from cluster.config_yaml import yaml_problem
    from cluster.driver import HarnessError, preflight

    try:
        lo, hi = parse_range(window)
        base = {}
        if config is not None:
            if not config.is_file():
                raise ConfigError(f"--config {str(config)!r} does not exist")
            try:
                base = load_yaml(config.read_text()) or {}
            except yaml.YAMLError as bad:
                raise ConfigError(f"--config {str(config)!r} is not valid YAML: {yaml_problem(bad)}") from None
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
        err(f"error: {exc}")
        return EXIT_BAD_INPUT
    from cluster.campaign import CampaignInterrupted, probe_config

    try:
        preflight(probe_config(fault, runners[0], lo, base))
        results.mkdir(parents=True, exist_ok=True)
        d = run_campaign(fault, runners, lo, hi, base, results, probes=probes, progress=not no_progress)
    except HarnessError as exc:
        err(f"error: {exc}")
        return exc.exit_code
    except CampaignInterrupted as exc:
        err(f"interrupted by {exc}: the finished waves are written (CAMPAIGN.md says the bracket is partial)")
        return 143 if "TERM" in str(exc) else 130
    from cluster.results import CAMPAIGN_MD  # (`results` here is the --results dir)

    print(terminal_safe((d / CAMPAIGN_MD).read_text()))
    SafeConsole().print(f"CAMPAIGN: {d / CAMPAIGN_MD}", highlight=False, soft_wrap=True)
    return EXIT_OK

