"""The local base image for docker sandboxes, built from Debian packages without a registry.

No registry is reachable from the fleet's hosts, so the image is never pulled: it is
assembled here from this machine's apt lists. The closure of a few root packages
(Depends + Pre-Depends, recursively, first alternative, no Recommends) is resolved with
`apt-cache`, each package is fetched with `apt-get download` and unpacked with
`dpkg -x` into a rootfs (no maintainer scripts run), a few files a sandbox needs are
added (users root and nobody, /tmp, /workspace, /run/sandfleet, /bin/sh), the tree is
usrmerged like a bookworm system, and the tarball is imported with the docker API.

The image only carries a shell, coreutils and the shared libraries a CPython 3.11 and
its stdlib extension modules link against: runners run the host's interpreter and venv
bind-mounted read-only. The tag is a hash of the recipe version and the exact
name=version closure, so an apt upgrade or a recipe change yields a new tag, and an
existing tag is reused as is.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

BASE_REPO = "sandfleet-base"
RECIPE_VERSION = "1"  # bump when the rootfs fixups below change: it is part of the tag
PACKAGES = (
    "dash",                  # /bin/sh
    "coreutils",             # sleep, cat, ...
    "python3.11-minimal",
    "libpython3.11-stdlib",  # brings libssl3, libffi8, libbz2, liblzma, libsqlite3, libuuid, ncurses, readline, ...
    "libgdbm6",              # _gdbm of a host interpreter built with it (not in the stdlib package's Depends)
    "libstdc++6",            # C++ extension modules in the runners' venv (numpy, PIL, ...)
)
CHANGES = ["LABEL sandfleet.image=base", "ENV PATH=/usr/local/bin:/usr/bin:/bin"]
USRMERGE = ("bin", "lib", "lib64", "sbin")
PASSWD = ("root:x:0:0:root:/root:/bin/sh\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
GROUP = "root:x:0:\nnogroup:x:65534:\n"
TRIM = ("usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian")
LOCK = Path(tempfile.gettempdir()) / "sandfleet-base.lock"
_APT_ENV = {**os.environ, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}


class BaseImageError(RuntimeError):
    pass


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])[-2000:]


def _run(cmd: list[str], what: str, cwd: str | Path | None = None, timeout: float = 600) -> str:
    try:
        p = subprocess.run(cmd, cwd=cwd, env=_APT_ENV, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BaseImageError(f"{what}: {' '.join(cmd[:4])} ... could not run: {e}") from e
    if p.returncode != 0:
        raise BaseImageError(f"{what} failed (exit {p.returncode}): {' '.join(cmd[:6])}"
                             f"{' ...' if len(cmd) > 6 else ''}\n{_tail(p.stdout + p.stderr)}")
    return p.stdout


def _depends(names: list[str], recurse: bool = False) -> dict[str, list[str]]:
    """Each package's Depends + Pre-Depends, one name per or-group: the first real
    alternative, else the first provider of a virtual one (what apt would install)."""
    out = _run(["apt-cache", "depends", "--important", *(["--recurse"] if recurse else []), *names],
               "apt-cache depends")
    groups: dict[str, list[list[tuple[str, list[str]]]]] = {}
    pkg: list[list[tuple[str, list[str]]]] = []
    open_group = False
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):  # a package header
            pkg = groups.setdefault(line.strip(), [])
            open_group = False
        elif line.startswith("    "):  # a provider of the virtual dependency above
            if pkg:
                pkg[-1][-1][1].append(line.strip())
        else:  # "  Depends: x" or " |Depends: x" (x or the next one)
            body = line.strip()
            name = body.lstrip("|").partition(":")[2].strip()
            if open_group:
                pkg[-1].append((name, []))
            else:
                pkg.append([(name, [])])
            open_group = body.startswith("|")
    # an unsatisfiable group is kept as "(none: a | b)": an error only if the closure reaches it
    return {header: [_choose(g) or f"(none: {' | '.join(n for n, _ in g)})" for g in gs]
            for header, gs in groups.items()}


def _choose(group: list[tuple[str, list[str]]]) -> str:
    for name, _ in group:
        if not name.startswith("<"):
            return name.split(":")[0]
    for _, providers in group:
        if providers:
            return providers[0].split(":")[0]
    return ""


def _candidates(names: list[str]) -> dict[str, str]:
    out = _run(["apt-cache", "policy", *names], "apt-cache policy")
    versions: dict[str, str] = {}
    pkg = None
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            pkg = line[:-1]
        elif line.strip().startswith("Candidate:") and pkg:
            versions[pkg] = line.split(":", 1)[1].strip()
    bad = [n for n in names if versions.get(n, "(none)") == "(none)"]
    if bad:
        raise BaseImageError(f"no installable version of {', '.join(bad)} in this machine's apt lists "
                             "(apt-get update? a missing component?)")
    return versions


def package_closure(roots: Iterable[str] = PACKAGES) -> list[tuple[str, str]]:
    """(name, version) of every package the roots depend on (Depends + Pre-Depends,
    recursively, no Recommends), resolved with apt-cache against this machine's apt
    lists; sorted. The version is apt's candidate: what `apt-get download` fetches.
    One `apt-cache depends --recurse` (it walks every alternative; the walk below takes
    only the chosen ones) and one `apt-cache policy`: each call costs a cache load."""
    roots = sorted(set(roots))
    known = _depends(roots, recurse=True)
    seen: set[str] = set()
    todo = roots
    while todo:
        seen.update(todo)
        if missing := [n for n in todo if n not in known]:
            known.update(_depends(missing))
            if missing := [n for n in todo if n not in known]:
                raise BaseImageError(f"apt-cache knows no package {', '.join(missing)}")
        if bad := [f"{n} -> {d}" for n in todo for d in known[n] if d.startswith("(none")]:
            raise BaseImageError(f"unsatisfiable dependency: {'; '.join(bad)}")
        todo = sorted({d for n in todo for d in known[n]} - seen)
    versions = _candidates(sorted(seen))
    return sorted((n, versions[n]) for n in seen)


def base_tag(closure: Iterable[tuple[str, str]]) -> str:
    """'sandfleet-base:<first 16 hex of sha256 of the recipe version + the sorted name=version list>'"""
    pins = sorted(f"{n}={v}" for n, v in closure)
    digest = hashlib.sha256("\n".join([RECIPE_VERSION, *pins]).encode()).hexdigest()
    return f"{BASE_REPO}:{digest[:16]}"


# ------------------------------------------------------------------ build
def _download(closure: list[tuple[str, str]], dest: Path) -> dict[str, Path]:
    """One `apt-get download` for the whole closure; the .deb of each package, by name."""
    dest.mkdir(parents=True, exist_ok=True)
    err: BaseImageError | None = None
    try:
        _run(["apt-get", "-q", "-o", "APT::Sandbox::User=root", "download",
              *(f"{n}={v}" for n, v in closure)], "apt-get download", cwd=dest)
    except BaseImageError as e:
        err = e
    debs = {p.name.split("_", 1)[0]: p for p in dest.glob("*.deb")}
    missing = [n for n, _ in closure if n not in debs]
    if err is not None or missing:
        raise BaseImageError(f"could not download {', '.join(missing) or 'the packages'}"
                             + (f"\n{err}" if err else ""))
    return debs


def _merge_into(rootfs: Path, rel_src: str, rel_dst: str, log: Callable[[str], Any]) -> None:
    """Move the tree rootfs/rel_src into rootfs/rel_dst entry by entry, re-pointing relative
    symlinks so they still reach what they reached from their old place."""
    src, dst = rootfs / rel_src, rootfs / rel_dst
    dst.mkdir(parents=True, exist_ok=True)
    for name in sorted(os.listdir(src)):
        s, d = src / name, dst / name
        rs, rd = f"{rel_src}/{name}", f"{rel_dst}/{name}"
        if s.is_dir() and not s.is_symlink():
            if d.is_symlink() or (d.exists() and not d.is_dir()):
                raise BaseImageError(f"usrmerge: /{rs} is a directory but /{rd} is not")
            _merge_into(rootfs, rs, rd, log)
            s.rmdir()
            continue
        if os.path.lexists(d):
            log(f"usrmerge: /{rs} and /{rd} both exist; keeping /{rd}")
            s.unlink()
            continue
        if s.is_symlink() and not os.path.isabs(target := os.readlink(s)):
            aim = os.path.normpath(os.path.join(os.path.dirname(rs), target))
            if not aim.startswith(".."):
                top, _, rest = aim.partition("/")
                if top in USRMERGE:
                    aim = f"usr/{top}/{rest}" if rest else f"usr/{top}"
                s.unlink()
                d.symlink_to(os.path.relpath(aim, os.path.dirname(rd)))
                continue
        os.rename(s, d)


def _fix_rootfs(rootfs: Path, log: Callable[[str], Any]) -> None:
    rootfs.chmod(0o755)
    for top in USRMERGE:
        p = rootfs / top
        if p.is_symlink():
            continue
        if p.is_dir():
            _merge_into(rootfs, top, f"usr/{top}", log)
            p.rmdir()
        (rootfs / "usr" / top).mkdir(parents=True, exist_ok=True)
        p.symlink_to(f"usr/{top}")
    for rel, mode in (("tmp", 0o1777), ("workspace", 0o755), ("run", 0o755), ("run/sandfleet", 0o755),
                      ("etc", 0o755)):
        (rootfs / rel).mkdir(exist_ok=True)
        (rootfs / rel).chmod(mode)
    for rel, text in (("etc/passwd", PASSWD), ("etc/group", GROUP)):
        (rootfs / rel).write_text(text)
        (rootfs / rel).chmod(0o644)
    for rel in TRIM:  # like Debian's slim images: no manuals, translations, docs but copyrights
        shutil.rmtree(rootfs / rel, ignore_errors=True)
    for doc in (rootfs / "usr/share/doc").glob("*/*"):
        if doc.name == "copyright":
            continue
        if doc.is_dir() and not doc.is_symlink():
            shutil.rmtree(doc)
        else:
            doc.unlink()
    usr_bin = rootfs / "usr/bin"
    for link, target in (("python3", "python3.11"), ("sh", "dash")):
        if not (usr_bin / target).exists():
            raise BaseImageError(f"rootfs has no /usr/bin/{target} (did its package unpack?)")
        if not os.path.lexists(usr_bin / link):
            (usr_bin / link).symlink_to(target)


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _tree_size(root: Path) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(root) for f in fs)


def _image_exists(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _build(client: Any, closure: list[tuple[str, str]], tag: str, work: Path, debs: dict[str, Path],
           log: Callable[[str], Any]) -> None:
    rootfs = work / "rootfs"
    rootfs.mkdir()
    for name, _ in closure:
        _run(["dpkg", "-x", str(debs[name]), str(rootfs)], f"dpkg -x of package {name}")
    _fix_rootfs(rootfs, log)
    log(f"rootfs: {len(closure)} packages, {_tree_size(rootfs) / 2**20:.1f} MiB; importing as {tag}")
    tar = work / "rootfs.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as tf:
        tf.add(rootfs, arcname=".", filter=_root_owned)
    shutil.rmtree(rootfs)
    repo, _, version = tag.partition(":")
    import docker.errors

    try:
        out = client.api.import_image_from_file(str(tar), repository=repo, tag=version, changes=CHANGES)
    except docker.errors.APIError as e:
        raise BaseImageError(f"docker import of {tag} failed: {e}") from e
    if not _image_exists(client, tag):
        raise BaseImageError(f"docker import of {tag} left no image: {_tail(str(out))}")


def ensure_base_image(client: Any = None, log: Callable[[str], Any] = lambda msg: None) -> str:
    """Return the tag of the local base image, building it when no image with that tag
    exists locally (see the module docstring). Never pulls. Raises BaseImageError (a
    RuntimeError) naming what failed."""
    if client is None:
        from fleet.dockerapi import docker_client

        client = docker_client(60)
    def update_and_resolve(why: BaseImageError) -> list:
        log(f"{str(why).splitlines()[0]}; apt-get update, then resolve again")
        _run(["apt-get", "-q", "update"], "apt-get update")
        return package_closure()

    try:
        closure = package_closure()
    except BaseImageError as e:  # missing lists: update once, then it must resolve
        closure = update_and_resolve(e)
    tag = base_tag(closure)
    if _image_exists(client, tag):
        return tag
    LOCK.touch(exist_ok=True)
    with open(LOCK) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per machine; a waiter finds the tag
        if _image_exists(client, tag):
            return tag
        t0 = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix="sandfleet-base-"))
        try:
            log(f"building {tag}: downloading {len(closure)} packages")
            try:
                debs = _download(closure, work / "debs")
            except BaseImageError as e:  # stale lists (a 404 for an old version): update once, resolve again
                closure = update_and_resolve(e)
                tag = base_tag(closure)
                if _image_exists(client, tag):
                    return tag
                shutil.rmtree(work / "debs")
                debs = _download(closure, work / "debs")
            _build(client, closure, tag, work, debs, log)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log(f"built {tag} in {time.monotonic() - t0:.1f}s")
        return tag
