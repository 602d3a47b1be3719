"""Whether the sandbox user (uid 65534) can reach and run the runner's command, checked before a sandbox is made:
`command_problem` names the path and the fix."""
from __future__ import annotations

import os
import shutil

from fleet.sandbox.spec import SANDBOX_UID, SandboxSpec


def _executable(exe: str, path: str, binds) -> tuple[str, str | None]:
    """The file the sandbox would run for `exe` (a bare name is looked up on the sandbox's PATH among what it is
    shown: the first it can see and run), or why there is none."""
    if "/" in exe:
        if not os.path.isfile(exe):
            return exe, f"runner command not found: {exe}"
        if not os.access(exe, os.X_OK):
            return exe, f"runner command not executable: {exe}"
        return exe, None
    found = shutil.which(exe, path=path)
    if found is None:
        return exe, f"runner command not found: {exe} (not on the sandbox PATH {path})"
    seen = [c for c in (os.path.join(d, exe) for d in path.split(os.pathsep) if d)
            if os.path.isfile(c) and _visible(c, binds)]
    runnable = next((c for c in seen if not unreadable_by_sandbox_user([("x", c)], binds)), None)
    return runnable or (seen[0] if seen else found), None


def _host_side(p: str, mounts: dict[str, str]) -> str:
    """Where the sandbox's path `p` is on this machine: under a read-only mount (host dir -> path inside, such as
    a remote node's staged copy of the runner's workdir) it is the host dir's; else `p` itself."""
    for host, inside in sorted(mounts.items(), key=lambda m: len(m[1]), reverse=True):
        if p == inside or p.startswith(inside.rstrip("/") + "/"):
            return host + p[len(inside.rstrip("/")):]
    return p


def command_problem(argv: list[str], path: str, binds: list[str] = (), mounts: dict[str, str] | None = None) \
        -> str | None:
    """Why the runner command cannot start here, or None (checked before a sandbox is made). `binds`: what the
    sandbox sees of the host (the runner's code, its venv), which the sandbox user must be able to read; `mounts`
    (host dir -> path inside) are shown at another path, so a runner named by its path inside is checked there."""
    if not argv or not argv[0]:
        return "runner command is empty"
    if mounts:
        argv = [_host_side(a, mounts) if os.path.isabs(a) else a for a in argv]
        path = os.pathsep.join(_host_side(d, mounts) if os.path.isabs(d) else d for d in path.split(os.pathsep))
        binds = list(binds) + list(mounts)
    exe, problem = _executable(argv[0], path, binds)
    if problem:
        return problem
    for a in argv[1:]:  # a script named by a relative path would be looked up in the fresh workspace
        if not os.path.isabs(a) and a.endswith((".py", ".sh", ".js", ".mjs", ".ts", ".rb")) and not a.startswith("-"):
            return (f"runner script not found: {a} (a relative path is taken from the workspace; give an absolute "
                    "path, or --runner-workdir with the script in it)")
    want = [("x", exe)] + [("r", a) for a in argv[1:] if os.path.isabs(a) and os.path.exists(a)] + \
        [("d", b) for b in binds if os.path.isdir(b)]
    bad = unreadable_by_sandbox_user(want, binds)
    if bad:
        how, p = bad[0]
        return (f"runner code not {'executable' if how == 'x' else 'readable'} by the sandbox user (uid "
                f"{SANDBOX_UID}): {p}: every directory from what the sandbox is shown of it (the runner's workdir, its "
                "venv) down needs o+x and the file o+r (a `mktemp -d` dir is mode 0700: chmod o+rx it, or put the "
                "runner under /opt)")
    return None


SYSTEM_ROOTS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")


def _allows(st: os.stat_result, bits: int) -> bool:
    """Whether the sandbox user (uid and gid 65534, no other groups) has `bits` (4 read, 1 execute) on it."""
    if st.st_uid == SANDBOX_UID:
        m = (st.st_mode >> 6) & 7
    elif st.st_gid == SANDBOX_UID:
        m = (st.st_mode >> 3) & 7
    else:
        m = st.st_mode & 7
    return m & bits == bits


def _roots(binds) -> list[str]:
    return sorted({os.path.realpath(b) for b in binds} | set(SYSTEM_ROOTS), key=len, reverse=True)


def _visible(path: str, binds) -> bool:
    """Whether the sandbox is shown `path` at all (under a bind or a system dir)."""
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in _roots(binds))


def unreadable_by_sandbox_user(paths: list[tuple[str, str]], binds: list[str] = ()) -> list[tuple[str, str]]:
    """Which of the (how, path) pairs (`x` execute, `r` read, `d` list a directory) the sandbox user cannot use
    inside the sandbox. A path shows there through its bind (`binds`, or a system dir): the directories above the
    bind are made 0755 by the sandbox, so only the bind itself and what is below it count (a venv whose own dir is
    a mode-0700 `mktemp -d` fails; one under /root does not, since /root is not bound). By mode bits (no ACLs)."""
    roots = _roots(binds)
    bad = []
    for how, path in paths:
        real = os.path.realpath(path)
        root = next((r for r in roots if real == r or real.startswith(r.rstrip("/") + "/")), "/")
        parts = [root] + [p for p in os.path.relpath(real, root).split("/") if p not in ("", ".")]
        cur, ok = "", True
        for i, part in enumerate(parts):
            cur = part if i == 0 else os.path.join(cur, part)
            try:
                st = os.stat(cur)
            except OSError:
                ok = False
                break
            last = i == len(parts) - 1
            if not last:
                ok = _allows(st, 1)
            elif how == "d":
                ok = _allows(st, 5)
            elif how == "x":
                ok = _allows(st, 1) and (not _is_script(cur) or _allows(st, 4))
            else:
                ok = _allows(st, 4)
            if not ok:
                break
        if not ok:
            bad.append((how, path))
    return bad


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


_CHECKED: dict[tuple, str | None] = {}


def cached_command_problem(spec: SandboxSpec) -> str | None:
    """`command_problem` once per wave and runner (a host runs many attempts of one runner)."""
    key = (spec.wave_id, tuple(spec.argv), spec.env.get("PATH", ""), tuple(spec.ro_binds),
           tuple(sorted(spec.ro_mounts.items())))
    if key not in _CHECKED:
        if len(_CHECKED) > 256:
            _CHECKED.clear()
        _CHECKED[key] = command_problem(spec.argv, spec.env.get("PATH", ""), spec.ro_binds, spec.ro_mounts)
    return _CHECKED[key]
