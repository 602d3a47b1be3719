"""Errors shared by the storage room."""


class StoreError(RuntimeError):
    """The object store could not be started, reached or used; the message says what to do."""


def stop_process(proc, grace_s: float = 5.0) -> None:
    """SIGTERM a child we started, wait `grace_s`, then SIGKILL; always reaps it."""
    import subprocess

    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
