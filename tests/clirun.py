"""`sandfleet ARGV` run in this process, as the CLI runs it: its exit code and what it printed (stdout and stderr
together). For unit tests of commands that start no part."""
from __future__ import annotations

import contextlib
import io


class Ran:
    def __init__(self, code: int, output: str):
        self.exit_code, self.output = code, output


def sandfleet(*argv) -> Ran:
    from cluster.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            main([str(a) for a in argv])
            code = 0
        except SystemExit as exc:
            code = exc.code
    return Ran(code, buf.getvalue())
