"""`sandfleet serve`: every wave under a results root as a web page on 127.0.0.1."""
from __future__ import annotations

import typer

from cluster.cli.common import EXIT_BAD_INPUT, EXIT_HARNESS, EXIT_OK, app, dir_arg, out, err


@app.command("serve")
def serve_cmd(
    results_root: str = typer.Argument("results", help="a results root (every wave under it)"),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="the port on 127.0.0.1 (0: one it picks)"),
) -> int:
    """Every wave under a results root as a web page on 127.0.0.1: by date, runner, faults and verdict, each
    cell's trend across waves, flaky cells marked."""
    from cluster.serve import serve

    results_root = dir_arg(results_root, "RESULTS_ROOT", "a results root (e.g. results)")
    if results_root is None:
        return EXIT_BAD_INPUT
    try:
        serve(results_root, port, lambda url: out.print(f"serving {results_root.resolve()} at {url} (Ctrl-C stops)",
                                                        highlight=False, soft_wrap=True))
    except OSError as exc:
        err(f"error: cannot listen on 127.0.0.1:{port}: {exc}")
        return EXIT_HARNESS
    except KeyboardInterrupt:
        pass
    return EXIT_OK

