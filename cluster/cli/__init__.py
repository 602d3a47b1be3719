"""`sandfleet` command line.

Exit codes: 0 all passed, 1 a verdict failed, 2 unknown / not applied / harness
error, 254 bad arguments or config.

The rooms, one per command group (each registers its commands on `common.app`; imported here in the order
`sandfleet --help` lists them):

- `common`: the exit codes, the typer apps, the escaping console, the checks of a results argument.
- `wave`: `wave run`, `wave resume`, and `run_wave` (preflight, run, grade, exit as the grade says).
- `grading`: `grade`, `verify`, `report`.
- `study`: `league`, `campaign storage`.
- `serve`: `serve`.
- `replay`: `wave replay`, `shrink`.
- `sweep`: `sweep`.
- `fleet`: `up`, `down`, `status`.
- `catalog`: `faults`.
"""
from __future__ import annotations

import sys

import typer

# in the order `--help` lists them: a command is listed where its module registered it
from cluster.cli import wave, grading, study, serve, replay, sweep, fleet, catalog  # noqa: F401,E402
from cluster.cli.common import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_HARNESS, EXIT_OK, app, err  # noqa: F401,E402


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
            err(f"error: {exc.format_message() if hasattr(exc, 'format_message') else exc}")
            if getattr(exc, "ctx", None) is not None:
                err(exc.ctx.get_usage())
            sys.exit(EXIT_BAD_INPUT)
        raise
    sys.exit(rv if isinstance(rv, int) else 0)


