"""The artifact as the harness captures it: the workspace's files read back after the runner exits, never following
a link, capped in depth, files and bytes (what a runner wrote is untrusted)."""
from __future__ import annotations

import os
import stat

from fleet.sandbox.spec import MAX_ARTIFACT_BYTES, MAX_ARTIFACT_DEPTH, MAX_ARTIFACT_FILES


def _utf8(name: str) -> bool:
    """Is this file name (decoded with surrogateescape, as os gives it) valid UTF-8 as it was on the disk?"""
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def read_tree(root: str) -> dict:
    """Regular files under `root`, never following a link (a runner may plant links to host files). Iterative (a
    runner may leave a tree thousands of directories deep), and capped in depth, files and bytes: what a cap left
    out is named in `capped` ("artifact capture skipped: depth > 64") besides the paths in `skipped`."""
    files: dict[str, bytes] = {}
    skipped: list[str] = []
    capped: list[str] = []
    total = 0
    if not os.path.isdir(root) or os.path.islink(root):
        return {"files": None, "skipped": [], "why": f"{os.path.basename(root)}/ is missing from the workspace"}
    stack = [(root, 0)]
    while stack:
        dirpath, depth = stack.pop()
        try:
            entries = sorted(os.scandir(dirpath), key=lambda e: e.name)
        except OSError:
            skipped.append(os.path.relpath(dirpath, root))
            continue
        for entry in entries:
            full = entry.path
            rel = os.path.relpath(full, root)
            if not _utf8(rel):  # a name no JSON record, report or artifact can hold as it is: named, escaped, left
                skipped.append(rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))
                reason = "artifact capture skipped: a file name that is not UTF-8 (shown escaped)"
                if reason not in capped:
                    capped.append(reason)
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth + 1 > MAX_ARTIFACT_DEPTH:
                    skipped.append(rel)
                    reason = f"artifact capture skipped: depth > {MAX_ARTIFACT_DEPTH}"
                    if reason not in capped:
                        capped.append(reason)
                    continue
                stack.append((full, depth + 1))
                continue
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                skipped.append(rel)
                continue
            try:
                st = os.fstat(fd)
                over = ("bytes", MAX_ARTIFACT_BYTES) if total + st.st_size > MAX_ARTIFACT_BYTES else \
                    ("files", MAX_ARTIFACT_FILES) if len(files) >= MAX_ARTIFACT_FILES else None
                if not stat.S_ISREG(st.st_mode) or over:
                    skipped.append(rel)
                    reason = over and f"artifact capture skipped: {over[0]} > {over[1]}"
                    if reason and stat.S_ISREG(st.st_mode) and reason not in capped:
                        capped.append(reason)
                    continue
                with os.fdopen(os.dup(fd), "rb") as f:
                    body = f.read(st.st_size + 1)
                total += len(body)
                files[rel] = body
            finally:
                os.close(fd)
    out = {"files": files, "skipped": sorted(skipped)}
    if capped:
        out["capped"] = capped
    return out
