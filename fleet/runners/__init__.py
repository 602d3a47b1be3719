"""Built-in runners (systems under test). Each is a plain script that follows the
public runner contract and imports nothing of sandfleet; the harness runs it as a
command in a sandbox, exactly like a user's runner."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUILTIN = {"durable": "durable.py", "durable-local": "durable_local.py", "naive": "naive.py"}


def builtin_command(name: str) -> list[str]:
    return [sys.executable, os.path.join(HERE, BUILTIN[name])]
