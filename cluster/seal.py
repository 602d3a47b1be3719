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
from pathlib import Path

import orjson

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
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SealError(f"seal key {path} cannot be read as an Ed25519 PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SealError(f"seal key {path} is not an Ed25519 key")
    return key


def _public_hex(key) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def fingerprint(public_hex: str) -> str:
    return hashlib.sha256(bytes.fromhex(public_hex)).hexdigest()[:16]


def digests(d: Path) -> dict[str, str]:
    """sha256 of every regular file under `d` (links not followed), by its path relative to `d`, less the seal's own
    two files."""
    out = {}
    for root, dirs, files in os.walk(d, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            p = Path(root) / name
            rel = p.relative_to(d).as_posix()
            if rel in (MANIFEST, SEAL) or p.is_symlink() or not p.is_file():
                continue
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out[rel] = h.hexdigest()
    return out


def seal(d: str | Path) -> dict:
    """Write MANIFEST.json and SEAL.json for the wave in `d`; returns the seal."""
    d = Path(d)
    manifest = orjson.dumps({"wave_dir": d.name, "files": digests(d)},
                            option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
    key = _private_key()
    out = {"algorithm": ALGORITHM, "public_key": _public_hex(key), "fingerprint": fingerprint(_public_hex(key)),
           "manifest_sha256": hashlib.sha256(manifest).hexdigest(), "signature": key.sign(manifest).hex()}
    (d / MANIFEST).write_bytes(manifest)
    (d / SEAL).write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    return out


def verify(d: str | Path, public_key: str | None = None) -> dict:
    """Check the seal and every file: {"ok", "fingerprint", "changed", "added", "missing"}. SealError when the
    manifest or the seal is missing, damaged or foreign (or not signed by `public_key`, when given)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    d = Path(d)
    try:
        manifest = (d / MANIFEST).read_bytes()
        s = orjson.loads((d / SEAL).read_bytes())
    except FileNotFoundError as exc:
        raise SealError(f"{exc.filename}: missing; the wave was not sealed") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise SealError(f"{d / SEAL}: unreadable: {exc}") from None
    if not isinstance(s, dict) or s.get("algorithm") != ALGORITHM or not all(
            isinstance(s.get(k), str) for k in ("public_key", "signature")):
        raise SealError(f"{d / SEAL}: not a sandfleet seal (algorithm {ALGORITHM}, public_key, signature)")
    if public_key is not None and s["public_key"] != public_key.lower():
        raise SealError(f"{d / SEAL}: sealed by key {fingerprint(s['public_key'])}, not the key given "
                        f"({fingerprint(public_key)})")
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(s["public_key"])).verify(bytes.fromhex(s["signature"]),
                                                                                   manifest)
    except (InvalidSignature, ValueError):
        raise SealError(f"{d / MANIFEST}: its signature in {SEAL} does not verify (the manifest or the seal was "
                        "changed)") from None
    try:
        listed = orjson.loads(manifest)["files"]
        if not isinstance(listed, dict):
            raise TypeError("files is not a mapping")
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise SealError(f"{d / MANIFEST}: not a manifest ({exc})") from None
    now = digests(d)
    changed = sorted(k for k in listed if k in now and now[k] != listed[k])
    added, missing = sorted(set(now) - set(listed)), sorted(set(listed) - set(now))
    return {"ok": not (changed or added or missing), "fingerprint": fingerprint(s["public_key"]),
            "changed": changed, "added": added, "missing": missing}
