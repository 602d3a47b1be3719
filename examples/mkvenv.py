"""Make (or refresh) `<example>/.venv` for each example directory given: `make examples` runs this.

`--requirements NAME` installs `<example>/NAME` instead of `requirements.txt`: an opt-in example keeps its pins in
`requirements-optin.txt`, which `make examples` (and so `make test`) never installs; its own make target does.

Standard library only, so it runs on a bare `python3`. For each directory:
- skip it when `.venv/.requirements.sha256` matches its requirements file (and the interpreter);
- else create the venv with `python3 -m venv`. On Debian without the python3-venv package
  (no ensurepip) the venv is made without pip and pip is bootstrapped from its wheel on the
  package index (PIP_INDEX_URL, default PyPI): nothing but the index is needed;
- `pip install -r <requirements file>` with its output kept back unless it fails.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import venv

STAMP = ".requirements.sha256"


def digest(req: str) -> str:
    h = hashlib.sha256(open(req, "rb").read())
    h.update(f"\0{sys.version}\0{os.path.realpath(sys.executable)}".encode())
    return h.hexdigest()


def works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pip_wheel_url() -> tuple[str, str]:
    """The newest pip wheel on the index (PEP 691 JSON simple API)."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    req = urllib.request.Request(f"{index}/pip/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        files = json.loads(resp.read())["files"]
    best = None
    for f in files:
        m = re.fullmatch(r"pip-(\d+(?:\.\d+)*)-py3-none-any\.whl", f["filename"])
        if m and not f.get("yanked"):
            key = tuple(int(x) for x in m.group(1).split("."))
            if best is None or key > best[0]:
                best = (key, urllib.request.urljoin(f"{index}/pip/", f["url"]), f["filename"])
    if best is None:
        raise RuntimeError(f"no pip wheel found on {index}")
    return best[1], best[2]


def create(env_dir: str) -> None:
    shutil.rmtree(env_dir, ignore_errors=True)
    out = subprocess.run([sys.executable, "-m", "venv", env_dir], capture_output=True, text=True)
    if out.returncode == 0:
        return
    if "ensurepip" not in out.stdout + out.stderr:
        raise RuntimeError(f"python3 -m venv {env_dir} failed:\n{out.stdout}{out.stderr}")
    # Debian's python3 without python3-venv: no ensurepip. Make the venv bare, bring pip from the index.
    shutil.rmtree(env_dir, ignore_errors=True)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    url, name = pip_wheel_url()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = os.path.join(tmp, name)
        with urllib.request.urlopen(url, timeout=120) as resp, open(wheel, "wb") as f:
            shutil.copyfileobj(resp, f)
        py = os.path.join(env_dir, "bin", "python")
        subprocess.run([py, os.path.join(wheel, "pip"), "install", "-q", "--no-index", wheel], check=True)


def ensure(example: str, requirements: str = "requirements.txt") -> None:
    req = os.path.join(example, requirements)
    env_dir = os.path.join(example, ".venv")
    py = os.path.join(env_dir, "bin", "python")
    stamp = os.path.join(env_dir, STAMP)
    want = digest(req)
    if os.path.isfile(stamp) and open(stamp).read().strip() == want and works([py, "-c", "pass"]):
        print(f"{example}: up to date")
        return
    if not works([py, "-m", "pip", "--version"]):
        create(env_dir)
    elif os.path.exists(stamp):
        os.remove(stamp)
    out = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input",
                          "-r", req], capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stdout + out.stderr)
        raise SystemExit(f"{example}: pip install failed")
    with open(stamp, "w") as f:
        f.write(want + "\n")
    print(f"{example}: installed")


def main(argv: list[str]) -> None:
    requirements = "requirements.txt"
    if argv[:1] == ["--requirements"] and len(argv) >= 2:
        requirements, argv = argv[1], argv[2:]
    if not argv:
        raise SystemExit("usage: python3 examples/mkvenv.py [--requirements NAME] examples/<name> ...")
    for example in argv:
        ensure(example.rstrip("/"), requirements)


if __name__ == "__main__":
    main(sys.argv[1:])
