"""Artifacts and references as the harness stores them, never as a runner reports them.

`artifacts/<task>/` holds the files of the task's workspace `repo/` as captured by
the harness when the runner exited 0, and `artifact.json` (per-file sha256 and
size, the tree digest, the attempt, files that were not regular and were
skipped). Each capture is written to a fresh directory and moved into place, so
two captures are never merged. The reference of a task is the artifact of an
uninterrupted run of the same runner on the same seed (`artifacts/ref-<task>/`),
cached across waves under `<results root>/.reference-cache/<key>/`.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import secrets
from pathlib import Path

import orjson

from cluster import results
from fleet.workloads.base import tree_digest

MANIFEST = results.ARTIFACT_MANIFEST
FILES = results.ARTIFACT_FILES


def write_artifact(adir: Path, files: dict[str, bytes], meta: dict) -> dict:
    adir = Path(adir)
    tmp = adir.parent / f".{adir.name}.{secrets.token_hex(4)}"
    (tmp / FILES).mkdir(parents=True)
    for rel, body in files.items():
        dest = (tmp / FILES / rel)
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(body)
    manifest = {**meta, "digest": tree_digest(files),
                "files": {rel: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)}
                          for rel, b in sorted(files.items())}}
    (tmp / MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    if adir.exists():
        shutil.rmtree(adir)
    os.replace(tmp, adir)
    return manifest


def _regular_bytes(path: Path) -> bytes:
    """A regular file's bytes: never through a link, never a FIFO or a device (ValueError naming it)."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path}: not a regular file")
        return f.read()


def read_artifact(adir: Path) -> tuple[dict[str, bytes], dict] | None:
    """(files, manifest), or None when there is no captured artifact. Files are checked against the manifest."""
    adir = Path(adir)
    mpath = adir / MANIFEST
    if not mpath.exists():
        return None
    manifest = orjson.loads(_regular_bytes(mpath))
    files = {}
    for rel, info in manifest["files"].items():
        if not isinstance(rel, str) or rel.startswith("/") or ".." in Path(rel).parts or "\0" in rel:
            raise ValueError(f"{mpath}: {rel!r} is not a path inside the artifact")
        body = _regular_bytes(adir / FILES / rel)
        if hashlib.sha256(body).hexdigest() != info["sha256"]:
            raise ValueError(f"{adir / FILES / rel}: content does not match its recorded sha256")
        files[rel] = body
    return files, manifest


def dir_digest(path: str | None) -> str:
    """Digest of a runner's code directory (names, sizes, mtimes; virtualenvs and caches skipped)."""
    h = hashlib.sha256()
    if not path:
        return h.hexdigest()
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d not in (".venv", "__pycache__", ".git", "node_modules"))
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            h.update(f"{os.path.relpath(full, path)}\0{st.st_size}\0{int(st.st_mtime)}\n".encode())
    return h.hexdigest()


def reference_key(runner: dict, workload: str, steps: int, seed: int) -> str:
    code = []
    for a in runner["command"][1:]:  # scripts named on the command line (not the interpreter itself)
        if os.path.isfile(a) and os.path.getsize(a) < 4 * 1024 * 1024:
            code.append(hashlib.sha256(Path(a).read_bytes()).hexdigest())
    if runner.get("builtin"):
        here = Path(runner["command"][-1]).parent
        code += [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(here.glob("*.py"))]
    wl = Path(__file__).resolve().parents[1] / "fleet" / "workloads"  # the test's world is part of the key
    code += [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(wl.glob("*.py"))]
    blob = orjson.dumps({"command": runner["command"], "env": runner.get("env", {}), "code": code,
                         "workdir": dir_digest(runner.get("workdir")), "workload": workload, "steps": steps,
                         "seed": seed}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:32]


class ReferenceCache:
    def __init__(self, root: Path):
        self.root = Path(root) / ".reference-cache"

    def get(self, key: str) -> tuple[dict[str, bytes], dict] | None:
        try:
            return read_artifact(self.root / key)
        except (OSError, ValueError, KeyError, orjson.JSONDecodeError):
            return None

    def put(self, key: str, files: dict[str, bytes], meta: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / key).exists():
            write_artifact(self.root / key, files, meta)


def seed_cached_references(cache: ReferenceCache, plan: dict, out) -> None:
    """Each cached reference the plan reuses, written as its task's artifact in `out` (a ResultsDir)."""
    for t in plan["tasks"]:
        ref = t["reference"]
        if ref["cached"]:
            files, manifest = cache.get(ref["key"])
            write_artifact(out.artifact(ref["task_id"]), files,
                           {"task_id": ref["task_id"], "attempt": manifest.get("attempt"), "skipped": [],
                            "from_cache": ref["key"]})


def cache_passed_references(cache: ReferenceCache, wave_id: str, out, result: dict) -> None:
    """Every reference that passed whole goes into the cache, for later waves of the same runner, workload and seed.
    One that completed only after the harness ended it (a hang, a second attempt) is no uninterrupted run: caching it
    would hide that from every later wave, so it is run again there."""
    from cluster.grade.verdicts import PASS  # lazily: the grader reads artifacts through this module

    for g in result.get("references", []):
        if g.get("verdict") != PASS or (g["checks"].get("completed") or {}).get("verdict") != PASS:
            continue
        got = read_artifact(out.artifact(g["task_id"]))
        if got is not None:
            cache.put(g["reference_key"], got[0], {"task_id": g["task_id"], "wave_id": wave_id,
                                                   "attempt": got[1].get("attempt")})
