"""Built-in runners (the systems under test). Each is a command; the harness runs it in a sandbox."""
import sys

RUNNERS = {
    "durable": "fleet.runners.durable",
    "naive": "fleet.runners.naive",
}


def runner_argv(name: str) -> list[str]:
    return [sys.executable, "-m", RUNNERS[name]]
