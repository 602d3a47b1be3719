"""Artifacts and references as the harness stores them, never as a runner reports them.

`artifacts/<task>/` holds the files of the task's workspace `repo/` as captured by
the harness when the runner exited 0, and `artifact.json` (per-file sha256 and
size, the tree digest, the attempt, files that were not regular and were
skipped). Each capture is written to a fresh directory and moved into place, so
two captures are never merged. The reference of a task is the artifact of an
uninterrupted run of the same runner on the same seed (`artifacts/ref-<task>/`; a task with no fault planned
that ran once untouched is its own, `cluster/grade/selfref.py`), cached across waves under
`<results root>/.reference-cache/<key>/`, keyed by the runner's content (its code, interpreter, env and workdir's
files; never their paths), the workload, its steps and the seed.
"""
from __future__ import annotations

import hashlib
import os
import re
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


def regular_bytes(path: Path) -> bytes:
    """A regular file's bytes: never through a link, never a FIFO or a device (ValueError naming it)."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path}: not a regular file")
        return f.read()


_regular_bytes = regular_bytes  # (its old name, still imported by cluster/grade/inputs.py)


def read_artifact(adir: Path) -> tuple[dict[str, bytes], dict] | None:
    """(files, manifest), or None when there is no captured artifact. Files are checked against the manifest."""
    adir = Path(adir)
    mpath = adir / MANIFEST
    if not os.path.lexists(mpath):
        return None
    _no_link(adir.parent if adir.parent.name == "artifacts" else None, adir)
    manifest = orjson.loads(regular_bytes(mpath))
    files = {}
    for rel, info in manifest["files"].items():
        if not isinstance(rel, str) or rel.startswith("/") or ".." in Path(rel).parts or "\0" in rel:
            raise ValueError(f"{mpath}: {rel!r} is not a path inside the artifact")
        _no_link(*(adir.joinpath(FILES, *Path(rel).parts[:i]) for i in range(len(Path(rel).parts))))
        body = regular_bytes(adir / FILES / rel)
        if hashlib.sha256(body).hexdigest() != info["sha256"]:
            raise ValueError(f"{adir / FILES / rel}: content does not match its recorded sha256")
        files[rel] = body
    return files, manifest


def _no_link(*dirs: Path | None) -> None:
    """ValueError naming the first of `dirs` (a results folder's artifacts/, a task's artifact, a directory inside
    it) that is a link: an artifact is never read from outside the folder (O_NOFOLLOW guards the last name only)."""
    for d in dirs:
        if d is not None and d.is_symlink():
            raise ValueError(f"{d}: a link, not followed")


_DIGESTS: dict[tuple, str] = {}  # (real path, size, mtime_ns) -> sha256: a wave keys every task from a few files
CONTENT_LIMIT = 4 * 1024 * 1024  # a file bigger than this is keyed by its size and mtime, not read


_read: list[str] | None = None  # while runner_digest runs: every path its digest depends on


def _stamp(paths: list[str]) -> tuple:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


def file_digest(path: str) -> str | None:
    """sha256 of a regular file's bytes (remembered while its size and mtime stay), None when it is not one. A file
    over CONTENT_LIMIT is keyed by name, size and mtime instead."""
    if _read is not None:
        _read.append(path)
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    if not os.path.isfile(real):
        return None
    sig = (real, st.st_size, st.st_mtime_ns)
    if sig not in _DIGESTS:
        if st.st_size > CONTENT_LIMIT:
            _DIGESTS[sig] = f"big:{st.st_size}:{st.st_mtime_ns}"
        else:
            try:
                _DIGESTS[sig] = hashlib.sha256(Path(real).read_bytes()).hexdigest()
            except OSError:
                return None
    return _DIGESTS[sig]


def dir_digest(path: str | None) -> str:
    """Digest of a runner's code directory by content: relative names and each file's bytes (virtualenvs and caches
    skipped), so a copy elsewhere keys the same."""
    h = hashlib.sha256()
    if not path:
        return h.hexdigest()
    for dirpath, dirnames, filenames in os.walk(path):
        if _read is not None:
            _read.append(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in (".venv", "__pycache__", ".git", "node_modules"))
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            h.update(f"{os.path.relpath(full, path)}\0{file_digest(full)}\n".encode())
    return h.hexdigest()


def _interpreter(word: str) -> str:
    """The command's first word by what it is, not where: a file's content digest (a venv's python: the real
    interpreter's, with the names and versions of the packages the venv holds); a bare name stays a name."""
    if os.sep not in word:
        return word
    digest = file_digest(word)
    if digest is None:
        return word
    venv = Path(word).parent.parent
    if (venv / "pyvenv.cfg").is_file():
        digest += ":" + ",".join(_packages(str(d)) for d in sorted(venv.glob("lib/python*/site-packages")))
    return f"{os.path.basename(word)}@{digest}"


def _packages(site: str) -> str:
    """Digest of the names (with versions) of the packages a site-packages dir holds; remembered while the dir's
    mtime stays (installing or removing one changes it)."""
    if _read is not None:
        _read.append(site)
    try:
        sig = ("site", site, os.stat(site).st_mtime_ns)
    except OSError:
        return "none"
    if sig not in _DIGESTS:
        names = sorted(n for n in os.listdir(site) if n.endswith(".dist-info"))
        _DIGESTS[sig] = hashlib.sha256("\n".join(names).encode()).hexdigest()
    return _DIGESTS[sig]


_RUNNERS: dict[bytes, tuple[list[str], tuple, str]] = {}  # runner spec -> (paths read, their stamp, digest)


def runner_digest(runner: dict) -> str:
    """What the runner is, by content and never by path: its command with every file it names replaced by the
    file's digest (the name kept), the interpreter by its own, the built-in runners' code, the workloads' code, its
    env and its workdir's files. The same runner copied or checked out elsewhere has the same digest. Remembered
    while none of the paths it read changed (a plan keys every task: one stat per path, not a read)."""
    global _read
    spec = orjson.dumps(runner, option=orjson.OPT_SORT_KEYS, default=str)
    got = _RUNNERS.get(spec)
    if got is not None and _stamp(got[0]) == got[1]:
        return got[2]
    _read = []
    try:
        digest = _runner_digest(runner)
        paths = list(dict.fromkeys(_read))
    finally:
        _read = None
    _RUNNERS[spec] = (paths, _stamp(paths), digest)
    return digest


def _runner_digest(runner: dict) -> str:
    words = list(runner["command"])
    command = [_interpreter(words[0])] if words else []
    for a in words[1:]:  # scripts named on the command line
        d = file_digest(a) if os.path.isabs(a) or os.path.isfile(a) else None
        command.append(f"{os.path.basename(a)}@{d}" if d else a)
    code = []
    if runner.get("builtin"):
        here = Path(runner["command"][-1]).parent
        _read.append(str(here))
        code += [f"{p.name}@{file_digest(str(p))}" for p in sorted(here.glob("*.py"))]
    wl = Path(__file__).resolve().parents[1] / "fleet" / "workloads"  # the test's world is part of the key
    _read.append(str(wl))
    code += [f"{p.name}@{file_digest(str(p))}" for p in sorted(wl.glob("*.py"))]
    blob = orjson.dumps({"command": command, "env": runner.get("env", {}), "code": code,
                         "builtin": runner.get("builtin"), "workdir": dir_digest(runner.get("workdir"))},
                        option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()


def reference_key(runner: dict, workload: str, steps: int, seed: int) -> str:
    """The cache key of a seed's reference: the runner's content digest (`runner_digest`), the workload, its steps
    and the seed."""
    blob = orjson.dumps({"runner": runner_digest(runner), "workload": workload, "steps": steps, "seed": seed},
                        option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:32]


CACHE_KEY = re.compile(r"[0-9a-f]{32}(-b)?")  # reference_key's, or a second run's (wave/confirm.SECOND)


def is_cache_key(key) -> bool:
    """A reference cache key as the wave makes one: it names a directory under the cache, so nothing else."""
    return isinstance(key, str) and CACHE_KEY.fullmatch(key) is not None


class ReferenceCache:
    def __init__(self, root: Path):
        self.root = Path(root) / ".reference-cache"

    def get(self, key: str) -> tuple[dict[str, bytes], dict] | None:
        if not is_cache_key(key):  # a key names a directory under the cache: only what reference_key makes
            return None
        try:
            return read_artifact(self.root / key)
        except (OSError, ValueError, KeyError, orjson.JSONDecodeError):
            return None

    def put(self, key: str, files: dict[str, bytes], meta: dict) -> None:
        if not is_cache_key(key):
            return
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / key).exists():
            write_artifact(self.root / key, files, meta)


def seed_cached_references(cache: ReferenceCache, plan: dict, out) -> None:
    """Each cached reference the plan reuses, written as its task's artifact in `out` (a ResultsDir)."""
    for t in plan["tasks"]:
        ref = t["reference"]
        if ref["cached"]:
            files, manifest = cache.get(ref["key"])
            meta = {"task_id": ref["task_id"], "attempt": manifest.get("attempt"),
                    "skipped": [str(x) for x in manifest.get("skipped") or []], "from_cache": ref["key"]}
            if manifest.get("capped"):  # what the capture left out is still named (a name that is not UTF-8)
                meta["capped"] = [str(x) for x in manifest["capped"]]
            write_artifact(out.artifact(ref["task_id"]), files, meta)


def cache_passed_references(cache: ReferenceCache, wave_id: str, out, result: dict) -> None:
    """Every reference that passed whole goes into the cache, for later waves of the same runner, workload and seed.
    One that completed only after the harness ended it (a hang, a second attempt) is no uninterrupted run: caching it
    would hide that from every later wave, so it is run again there."""
    from cluster.grade.verdicts import PASS  # lazily: the grader reads artifacts through this module

    # a task that was its own reference (no fault planned, one attempt nothing touched: cluster/grade/selfref.py)
    # is the seed's uninterrupted run: it fills the cache under the key its reference would have
    own = [g for g in result.get("tasks", [])
           if ((g.get("checks") or {}).get("resume_equivalent") or {}).get("reference") == "self"]
    for g in result.get("references", []) + own:
        if g.get("verdict") != PASS or (g["checks"].get("completed") or {}).get("verdict") != PASS:
            continue
        got = read_artifact(out.artifact(g["task_id"]))
        if got is not None:
            meta = {"task_id": g["task_id"], "wave_id": wave_id, "attempt": got[1].get("attempt"),
                    "skipped": got[1].get("skipped") or []}
            if got[1].get("capped"):
                meta["capped"] = got[1]["capped"]
            cache.put(g["reference_key"], got[0], meta)
