"""What every command module of the CLI shares: the exit codes, the typer apps the commands register on, the
console that escapes what a runner wrote, and the checks of a results argument."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from cluster.results import terminal_safe

EXIT_OK, EXIT_FAIL, EXIT_HARNESS, EXIT_BAD_INPUT = 0, 1, 2, 254

HELP = """`sandfleet` command line.

Exit codes: 0 all passed, 1 a verdict failed, 2 unknown / not applied / harness
error, 254 bad arguments or config.
"""

app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP)
wave_app = typer.Typer(no_args_is_help=True, help="Run waves.")
app.add_typer(wave_app, name="wave")
campaign_app = typer.Typer(no_args_is_help=True, help="Search how strong a fault a runner survives.")
app.add_typer(campaign_app, name="campaign")


class SafeConsole(Console):
    """A console that never prints a raw control byte: every string passes `results.terminal_safe` (what a runner
    wrote reaches the user's terminal only escaped), and rich markup and emoji codes in it are not interpreted."""

    def __init__(self, **kw):
        super().__init__(markup=False, emoji=False, **kw)

    def print(self, *objects, **kw):
        return super().print(*(terminal_safe(o) if isinstance(o, str) else o for o in objects), **kw)


out = SafeConsole()


def results_path(value: str) -> Path:
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


def dir_arg(value: str, name: str, what: str = "a wave's results directory (e.g. results/latest)") -> Path | None:
    """A directory argument, checked before anything reads it: None (after naming the argument on stderr) when it
    is empty (`''` is not the current directory), does not exist, or is not a directory."""
    if not value or not value.strip() or "\0" in value:
        err(f"error: argument {name}: value {value!r}: empty; pass {what}")
        return None
    p = Path(value)
    if not p.is_dir():
        why = "is not a directory" if p.exists() or p.is_symlink() else "does not exist"
        err(f"error: argument {name}: {value!r} {why}; pass {what}")
        return None
    return p


def seal_again(results_dir: Path) -> None:
    """Seal a wave's folder again after its files were rewritten (a seal that fails is said, never fatal)."""
    from cluster.seal import SealError, seal

    try:
        seal(results_dir)
    except (SealError, OSError) as exc:
        err(f"warning: {results_dir} not sealed: {exc}")


def err(msg: str) -> None:
    """Errors go to stderr unwrapped, so a long valid-choices list stays greppable; escaped (`terminal_safe`)."""
    sys.stderr.write(terminal_safe(msg.rstrip("\n")) + "\n")

