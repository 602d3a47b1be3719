"""A wave's results, sealed: `MANIFEST.json` lists the sha256 of every file of `results/<wave>/`, and `SEAL.json`
signs that manifest with an Ed25519 key the user holds (`sandfleet verify results/<wave>` checks both). The seal
holds nothing secret (the signature and the public key): anyone can check that a folder is the one the key's holder
sealed, and the key's fingerprint is what a league page or a report names to say whose seal it is.

The private key is `$SANDFLEET_SEAL_KEY` (a file), else `~/.config/sandfleet/seal.key`, made (0600) the first time
a wave is sealed. A wave is sealed when it ends and again when `sandfleet grade` rewrites its grades.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

import orjson

from cluster import results
from cluster.results import SEAL, SEAL_MANIFEST as MANIFEST

ALGORITHM = "ed25519"


class SealError(Exception):
    """The manifest or the seal is missing, damaged or foreign (what and where is in the message)."""


def key_path() -> Path:
    return Path(os.environ.get("SANDFLEET_SEAL_KEY") or Path.home() / ".config" / "sandfleet" / "seal.key")


def _private_key(create: bool = True):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = key_path()
    if not path.exists():
        if not create:
            raise SealError(f"no seal key at {path} (set $SANDFLEET_SEAL_KEY to a key file)")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = Ed25519PrivateKey.generate()
        data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return key
    try:
        key = serialization.load_pem_private_key(_read_regular(path, "the seal key", 64 * 1024), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SealError(f"seal key {path} cannot be read as an Ed25519 PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SealError(f"seal key {path} is not an Ed25519 key")
    return key


def own_fingerprint() -> str | None:
    """This user's seal key's fingerprint, or None when there is none (never made here) or it cannot be read."""
    if not key_path().exists():
        return None
    try:
        return fingerprint(_public_hex(_private_key(create=False)))
    except SealError:
        return None


def _public_hex(key) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def fingerprint(public_hex: str) -> str:
    return hashlib.sha256(bytes.fromhex(public_hex)).hexdigest()[:16]


MAX_SEAL_BYTES = 64 * 1024 * 1024  # a manifest, a seal or a key file is never read past this


def _read_regular(path: Path, what: str, cap: int = MAX_SEAL_BYTES) -> bytes:
    """A regular file's bytes, never through a link, never a FIFO or a device, at most `cap` (SealError otherwise)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SealError(f"{path}: {what} cannot be opened as a regular file ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SealError(f"{path}: {what} is not a regular file")
        if st.st_size > cap:
            raise SealError(f"{path}: {what} is {st.st_size} bytes, more than {cap}")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(cap + 1)[:cap]
    finally:
        os.close(fd)


NAMES = "utf-8; a backslash as \\\\, a byte that is not UTF-8 as \\xNN"  # the manifest's spelling of a name


def _name(rel: str, names: str | None = NAMES) -> str:
    """A path as the manifest (JSON) spells it, one spelling per name: a backslash is `\\\\` and a byte that is
    not UTF-8 is `\\xNN`, so the four characters `\\xff` and the byte 0xff are two names. `names=None`: the
    spelling of a manifest sealed before (no `names` field: a byte as `\\xNN`, a backslash as it is)."""
    if names is None:
        try:
            rel.encode("utf-8")
            return rel
        except UnicodeEncodeError:
            return os.fsencode(rel).decode("utf-8", "backslashreplace")
    if "\\" not in rel:
        try:
            rel.encode("utf-8")
            return rel
        except UnicodeEncodeError:
            pass
    text = os.fsencode(rel).decode("utf-8", "surrogateescape")
    return "".join("\\\\" if c == "\\" else f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else c
                   for c in text)


def _hash_file(p: Path) -> str:
    h = hashlib.sha256()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SealError(f"{p}: cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _entries(d: Path, names: str | None = NAMES):
    """(name in the manifest, path, lstat) of every entry under `d` but the seal's own files, never through a link;
    an empty dir is yielded as `dir/` with its lstat. `names`: the manifest's spelling of names (`_name`)."""
    def fail(exc: OSError):
        raise SealError(f"{exc.filename}: cannot be listed ({exc.strerror or exc})")

    for root, dirs, files in os.walk(d, followlinks=False, onerror=fail):
        dirs.sort()
        for name in sorted(files) + [x for x in dirs if os.path.islink(os.path.join(root, x))]:
            p = Path(root) / name
            rel = p.relative_to(d).as_posix()
            if rel in (MANIFEST, SEAL):
                continue
            try:
                st = os.lstat(p)
            except OSError as exc:
                raise SealError(f"{p}: cannot be read ({exc.strerror or exc})") from None
            yield _name(rel, names), p, st
        if not files and not dirs and Path(root) != d:
            yield _name(Path(root).relative_to(d).as_posix() + "/", names), Path(root), None


def _digest(p: Path, st) -> str:
    """A file's sha256; a link's target (never followed) as `<link> sha256 of the target's bytes`; `<kind>` else."""
    if st is None:
        return "<empty dir>"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(p)
        except OSError as exc:
            raise SealError(f"{p}: its link cannot be read ({exc.strerror or exc})") from None
        return "<link> " + hashlib.sha256(os.fsencode(target)).hexdigest()
    if not stat.S_ISREG(st.st_mode):
        return "<not a regular file>"
    return _hash_file(p)


def digests(d: Path) -> dict[str, str]:
    """sha256 of every regular file under `d`, by its path relative to `d`, less the seal's own two files; a link is
    listed with a digest of its target (`<link> ...`: named and covered, never followed), any other entry (a FIFO, a
    device, an empty dir) as `<kind>`, so an added one is named."""
    return {name: _digest(p, st) for name, p, st in _entries(d)}


QUICK_HASHED_BYTES = 1 << 20  # a `quick` check still hashes the top level's files up to this size

PREV_MANIFEST, PREV_SEAL = "MANIFEST.prev.json", "SEAL.prev.json"  # the seal a folder failed, kept by `reseal`


def seal(d: str | Path, wave_dir: str | None = None, resealed_after: str | None = None) -> dict:
    """Write MANIFEST.json and SEAL.json for the wave in `d`; returns the seal. `wave_dir`: the name to bind (the
    wave's id; the folder's own name by default); `resealed_after`: why the folder failed its earlier seal (kept in
    the manifest, and said by `verify`)."""
    d = Path(d)
    entries = list(_entries(d, NAMES))
    files = {name: _digest(p, st) for name, p, st in entries}
    size = {name: st.st_size for name, p, st in entries if files[name] not in ("<empty dir>", "<not a regular file>")
            and not files[name].startswith("<link>")}
    doc = {"wave_dir": wave_dir if wave_dir is not None else _name(d.resolve().name, NAMES), "files": files,
           "sizes": size}
    if resealed_after is not None:
        doc["resealed_after"] = resealed_after
    if NAMES is not None:
        doc["names"] = NAMES
    manifest = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
    key = _private_key()
    out = {"algorithm": ALGORITHM, "public_key": _public_hex(key), "fingerprint": fingerprint(_public_hex(key)),
           "manifest_sha256": hashlib.sha256(manifest).hexdigest(), "signature": key.sign(manifest).hex()}
    results.write_stored(d / MANIFEST, manifest)
    results.write_stored(d / SEAL, orjson.dumps(out, option=orjson.OPT_INDENT_2))
    return out


def sealed_as(d: str | Path) -> str | None:
    """The folder name (the wave's id) the manifest in `d` binds, read without checking it (None: none)."""
    try:
        m = orjson.loads(_read_regular(Path(d) / MANIFEST, "the manifest"))
    except (FileNotFoundError, SealError, orjson.JSONDecodeError):
        return None
    return m.get("wave_dir") if isinstance(m, dict) and isinstance(m.get("wave_dir"), str) and m["wave_dir"] else None


def reseal(d: str | Path, why: str) -> dict:
    """Seal a folder that failed its seal as it is now: the old MANIFEST.json and SEAL.json are kept as
    MANIFEST.prev.json and SEAL.prev.json (covered by the new seal), the new manifest says `why`, and it binds the
    name the old seal bound (the wave's id), never a copy's: a renamed copy still verifies as renamed."""
    d = Path(d)
    name = sealed_as(d)
    for now, prev in ((MANIFEST, PREV_MANIFEST), (SEAL, PREV_SEAL)):
        if os.path.lexists(d / now):
            os.replace(d / now, d / prev)
    return seal(d, wave_dir=name, resealed_after=why)


def verify(d: str | Path, public_key: str | None = None, quick: bool = False) -> dict:
    """Check the seal, the folder's name and every file: {"ok", "fingerprint", "changed", "added", "missing",
    "renamed_from" (the name the folder was sealed as, when it is now another: None else), "now_as"}. SealError
    when the manifest or the seal is missing, damaged or foreign (or not signed by `public_key`, when given).
    `quick`: a file below the top level, or a big one, of its sealed size is taken as sealed unread (the signature,
    the names, each entry's kind and size are still checked; the top level's small files, the verdict, plan and
    grades a listing shows, are hashed): what `serve` asks of every wave."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    d = Path(d)
    try:
        manifest = _read_regular(d / MANIFEST, "the manifest")
        raw = _read_regular(d / SEAL, "the seal")
    except FileNotFoundError as exc:
        raise SealError(f"{exc.filename}: missing; the wave was not sealed") from None
    try:
        s = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SealError(f"{d / SEAL}: unreadable: {exc}") from None
    if not isinstance(s, dict) or s.get("algorithm") != ALGORITHM or not all(
            isinstance(s.get(k), str) for k in ("public_key", "signature")):
        raise SealError(f"{d / SEAL}: not a sandfleet seal (algorithm {ALGORITHM}, public_key, signature)")
    if not re.fullmatch(r"[0-9a-fA-F]{64}", s["public_key"]) or not re.fullmatch(r"[0-9a-fA-F]{128}", s["signature"]):
        raise SealError(f"{d / SEAL}: its public_key or signature is not hex of an Ed25519 key and signature")
    if public_key is not None and s["public_key"].lower() != public_key.lower():
        raise SealError(f"{d / SEAL}: sealed by key {fingerprint(s['public_key'])}, not the key given "
                        f"({fingerprint(public_key)})")
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(s["public_key"])).verify(bytes.fromhex(s["signature"]),
                                                                                   manifest)
    except (InvalidSignature, ValueError):
        raise SealError(f"{d / MANIFEST}: its signature in {SEAL} does not verify (the manifest or the seal was "
                        "changed)") from None
    # what the seal says of itself for people (every seal has said both) must be true too: a damaged seal is exit 2
    if s.get("manifest_sha256") != hashlib.sha256(manifest).hexdigest():
        raise SealError(f"{d / SEAL}: its manifest_sha256 is {str(s.get('manifest_sha256'))[:70]!r}, not the "
                        f"sha256 of {MANIFEST} (the seal was changed)")
    if s.get("fingerprint") != fingerprint(s["public_key"]):
        raise SealError(f"{d / SEAL}: its fingerprint is {str(s.get('fingerprint'))[:40]!r}, not its public key's "
                        f"({fingerprint(s['public_key'])}; the seal was changed)")
    try:
        m = orjson.loads(manifest)
        listed, listed_sizes = m["files"], m.get("sizes") or {}
        if not isinstance(listed, dict) or not isinstance(listed_sizes, dict):
            raise TypeError("files or sizes is not a mapping")
        names = m.get("names")
        if names is not None and names != NAMES:
            raise TypeError(f"names spelled {str(names)[:80]!r}, which this sandfleet does not read")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise SealError(f"{d / MANIFEST}: not a manifest ({exc})") from None
    # the folder's name is sealed too (it is the wave's id): a folder moved to another name is not the one sealed,
    # whatever its files. A seal from before `names` binds none: it took the name as given (`latest`, `.`)
    sealed_as = m.get("wave_dir") if isinstance(m.get("wave_dir"), str) and m.get("wave_dir") and names else None
    now_as = _name(d.resolve().name, names)
    renamed_from = sealed_as if sealed_as is not None and sealed_as != now_as else None
    # an entry the seal does not list is named unread (a huge file added is never hashed); a listed file whose size
    # differs from the sealed one is changed unread; only a listed file of its sealed size is hashed
    now, changed = set(), []
    for name, p, st in _entries(d, names):
        now.add(name)
        if name not in listed:
            continue
        want = listed_sizes.get(name)
        regular = not str(listed[name]).startswith("<")
        if isinstance(want, int) and st is not None and st.st_size != want and regular:
            changed.append(name)
        elif (quick and regular and st is not None and stat.S_ISREG(st.st_mode) and st.st_size == want
              and ("/" in name or want > QUICK_HASHED_BYTES)):
            continue
        elif _digest(p, st) != listed[name]:
            changed.append(name)
    changed.sort()
    added, missing = sorted(now - set(listed)), sorted(set(listed) - now)
    return {"ok": not (changed or added or missing or renamed_from), "fingerprint": fingerprint(s["public_key"]),
            "changed": changed, "added": added, "missing": missing, "renamed_from": renamed_from, "now_as": now_as,
            "resealed_after": m.get("resealed_after") if isinstance(m.get("resealed_after"), str) else None}


def said(got: dict, limit: int = 5) -> str:
    """What `verify` found wrong, in one line: "changed: a, b; added: c; renamed: sealed as 'x', now 'y'" (at most
    `limit` names of each kind)."""
    parts = [f"{what}: {', '.join(results.one_line(n) for n in got[what][:limit])}"
             + (" ..." if len(got[what]) > limit else "")
             for what in ("changed", "added", "missing") if got.get(what)]
    if got.get("renamed_from"):
        parts.append(f"renamed: sealed as {got['renamed_from']!r}, now {got['now_as']!r}")
    return "; ".join(parts)


def state(d: str | Path) -> tuple[bool, str] | None:
    """None when the folder `d` is the one its seal names, checked `quick`ly; else (fails, why): `fails` when it
    carries a seal it does not match, or a damaged one; not when it carries none (a wave still running, one from
    before seals, or one whose seal was removed: the three look the same)."""
    d = Path(d)
    if not any(os.path.lexists(d / n) for n in (SEAL, MANIFEST)):
        return False, "not sealed (a wave still running, one from before seals, or one whose seal was removed)"
    try:
        got = verify(d, quick=True)
    except SealError as exc:
        return True, f"its seal is damaged: {exc}"
    return None if got["ok"] else (True, f"fails its seal ({said(got)})")
