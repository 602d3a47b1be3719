"""A wave's folder sealed (cluster/seal.py): `sandfleet verify` passes an untouched folder and names a byte flipped
in one file, a file added or removed; a damaged or foreign seal is exit 2, named; the seal holds nothing secret."""
from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from cluster.seal import MANIFEST, SEAL, seal, verify

from tests.clirun import sandfleet

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "wave-before-results-py"


@pytest.fixture
def wave(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDFLEET_SEAL_KEY", str(tmp_path / "keys" / "seal.key"))
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    return d


def _verify(d, *args):
    return sandfleet("verify", d, *args)


def test_an_untouched_wave_verifies_and_a_flipped_byte_is_named(wave, tmp_path):
    s = seal(wave)
    assert (tmp_path / "keys" / "seal.key").stat().st_mode & 0o777 == 0o600
    assert "PRIVATE" not in (wave / SEAL).read_text() and len(s["public_key"]) == 64  # nothing secret in it
    r = _verify(wave)
    assert r.exit_code == 0 and s["fingerprint"] in r.output, r.output
    g = wave / "t000.grade.json"
    data = bytearray(g.read_bytes())
    data[10] ^= 1
    g.write_bytes(bytes(data))
    (wave / "extra.txt").write_text("x")
    (wave / "timeline.png").unlink()
    got = verify(wave)
    assert not got["ok"] and got["changed"] == ["t000.grade.json"] and got["added"] == ["extra.txt"]
    assert got["missing"] == ["timeline.png"]
    r = _verify(wave)
    assert r.exit_code == 1 and "changed: t000.grade.json" in r.output


def test_a_damaged_forged_or_foreign_seal_is_exit_2_named(wave):
    assert _verify(wave).exit_code == 2  # never sealed: named, not a traceback
    s = seal(wave)
    m = orjson.loads((wave / MANIFEST).read_bytes())
    m["files"]["t000.grade.json"] = "0" * 64  # a manifest edited to hide a change: the signature no longer holds
    (wave / MANIFEST).write_bytes(orjson.dumps(m))
    r = _verify(wave)
    assert r.exit_code == 2 and "does not verify" in r.output, r.output
    seal(wave)
    r = _verify(wave, "--public-key", "ab" * 32)
    assert r.exit_code == 2 and "not the key given" in r.output
    assert _verify(wave, "--public-key", s["public_key"]).exit_code == 0
    assert _verify(wave, "--public-key", "nope").exit_code == 254
    (wave / SEAL).write_text("[1, 2]")
    r = _verify(wave)
    assert r.exit_code == 2 and "not a sandfleet seal" in r.output


def test_links_fifos_and_empty_dirs_added_are_named_and_a_fifo_seal_never_hangs(wave):
    """A hostile review's finds: an added link, FIFO or empty dir verified `intact`, and a FIFO in place of the
    manifest hung `verify`."""
    import os

    seal(wave)
    os.symlink("/etc/passwd", wave / "passwd")
    os.mkfifo(wave / "pipe")
    (wave / "emptydir").mkdir()
    got = verify(wave)
    assert not got["ok"] and {"passwd", "pipe", "emptydir/"} <= set(got["added"]), got
    (wave / MANIFEST).unlink()
    os.mkfifo(wave / MANIFEST)
    r = _verify(wave)
    assert r.exit_code == 2 and "not a regular file" in r.output, r.output


def test_an_artifact_manifest_naming_a_path_outside_is_unreadable(tmp_path):
    """A hostile review's find: an artifact.json listing /etc/passwd (with its sha256) had the grader read it."""
    import hashlib

    from cluster.artifacts import read_artifact, write_artifact

    d = tmp_path / "a"
    write_artifact(d, {"x.txt": b"x"}, {})
    m = orjson.loads((d / "artifact.json").read_bytes())
    body = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else b""
    m["files"]["../../../../../../../../etc/hostname"] = {"sha256": hashlib.sha256(body).hexdigest(), "size": 1}
    (d / "artifact.json").write_bytes(orjson.dumps(m))
    with pytest.raises(ValueError, match="not a path inside"):
        read_artifact(d)


@pytest.mark.parametrize("arg, why", [("", "empty"), ("   ", "empty"), ("{missing}", "does not exist"),
                                      ("{file}", "is not a directory")])
def test_verify_of_an_empty_missing_or_file_argument_is_254_named(wave, tmp_path, monkeypatch, arg, why):
    """A hostile review's finds: `sandfleet verify ''` verified the current directory, and a path that does not
    exist was exit 2 (a harness error) instead of bad input."""
    seal(wave)
    monkeypatch.chdir(wave)  # '' must not mean this (sealed, intact) folder
    (tmp_path / "f").write_text("x")
    r = _verify(arg.format(missing=tmp_path / "nope", file=tmp_path / "f"))
    assert r.exit_code == 254 and "argument RESULTS_DIR" in r.output and why in r.output, r.output


def test_a_link_retargeted_after_the_seal_is_named_changed_never_followed(wave, tmp_path):
    """A hostile review's find: the seal listed a link as `<link>` only, so pointing it elsewhere verified intact."""
    import os

    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    os.symlink(tmp_path / "a", wave / "artifacts" / "ln")
    os.symlink(tmp_path / "a", wave / "lndir")
    seal(wave)
    assert verify(wave)["ok"]
    for name in ("artifacts/ln", "lndir"):
        os.unlink(wave / name)
        os.symlink(tmp_path / "b", wave / name)
    got = verify(wave)
    assert not got["ok"] and got["changed"] == ["artifacts/ln", "lndir"], got
    r = _verify(wave)
    assert r.exit_code == 1 and "changed: artifacts/ln" in r.output, r.output


def test_an_added_or_resized_file_is_named_without_being_read(wave, monkeypatch):
    """A hostile review's find: verify hashed every file it found, so a huge file added to a sealed folder was read
    whole before it was named. A file the seal does not list, or of another size than the sealed one, is named
    unread (tested with small files and a spy on the hashing: never a giant file in a test)."""
    from cluster import seal as seal_mod

    seal(wave)
    (wave / "added.bin").write_bytes(b"x" * 4096)
    with open(wave / "plan.json", "ab") as f:
        f.write(b" ")
    hashed = []
    real = seal_mod._hash_file
    monkeypatch.setattr(seal_mod, "_hash_file", lambda p: hashed.append(p.name) or real(p))
    got = verify(wave)
    assert got["added"] == ["added.bin"] and got["changed"] == ["plan.json"], got
    assert "added.bin" not in hashed and "plan.json" not in hashed and hashed, hashed


def test_a_renamed_wave_folder_is_named_renamed_never_intact(wave, tmp_path, monkeypatch):
    """Issue 42's last review, finding 3: a sealed folder moved to another name verified as intact. The seal binds
    the folder's name (the wave id): a renamed one is exit 1, `renamed: sealed as ...`, its files said intact; moved
    back (or to another parent, or through a link such as results/latest), it verifies again."""
    seal(wave)
    moved = tmp_path / "w-someone-else"
    wave.rename(moved)
    got = verify(moved)
    assert not got["ok"] and got["renamed_from"] == "w" and not (got["changed"] or got["added"] or got["missing"])
    r = _verify(moved)
    assert r.exit_code == 1 and "renamed: sealed as 'w'" in r.output and "w-someone-else" in r.output, r.output
    assert "intact" in r.output  # the files are, and it says so
    other = tmp_path / "elsewhere"
    other.mkdir()
    moved.rename(other / "w")
    assert _verify(other / "w").exit_code == 0
    (tmp_path / "latest").symlink_to(other / "w")
    assert _verify(tmp_path / "latest").exit_code == 0
    monkeypatch.chdir(other / "w")  # (restored after: the session's fleet workers read the suite's cwd)
    assert _verify(".").exit_code == 0


def test_a_literal_backslash_name_and_a_raw_byte_name_are_never_confused(wave):
    """Issue 42's last review, finding 3: a file named `\\xff` (four ASCII characters) and one whose name is the byte
    0xff were both listed as `\\xff`: one stood for the other (one deleted, the folder still verified). The manifest
    now writes a backslash as `\\\\`, so each name has one spelling; a flip of either is named as that one."""
    import os
    literal, raw = wave / "\\xff", os.path.join(os.fsencode(wave), b"\xff")
    literal.write_bytes(b"same\n")
    with open(raw, "wb") as f:
        f.write(b"same\n")
    seal(wave)
    listed = orjson.loads((wave / MANIFEST).read_bytes())["files"]
    assert "\\\\xff" in listed and "\\xff" in listed, sorted(listed)[:5]
    assert verify(wave)["ok"]
    os.unlink(raw)
    got = verify(wave)
    assert not got["ok"] and got["missing"] == ["\\xff"], got
    with open(raw, "wb") as f:
        f.write(b"flipped\n")
    got = verify(wave)
    assert got["changed"] == ["\\xff"] and not got["missing"], got
    with open(raw, "wb") as f:
        f.write(b"same\n")
    literal.write_bytes(b"flipped\n")
    got = verify(wave)
    assert got["changed"] == ["\\\\xff"] and not got["missing"], got
    r = _verify(wave)
    assert r.exit_code == 1 and "changed: \\\\xff" in r.output, r.output


def test_a_seal_made_before_names_were_escaped_still_verifies(wave):
    """A manifest without `names` (sealed before the escape of a backslash) is read with the names it was made
    with: an old wave's folder still verifies."""
    from cluster import seal as sealmod

    (wave / "a\\b.txt").write_text("x")
    saved = sealmod.NAMES
    try:
        sealmod.NAMES = None  # seal as before: no `names` field, names unescaped
        seal(wave)
    finally:
        sealmod.NAMES = saved
    m = orjson.loads((wave / MANIFEST).read_bytes())
    assert "names" not in m and "a\\b.txt" in m["files"]
    assert verify(wave)["ok"]
    # it took the folder's name as given (`sandfleet grade results/latest` sealed it as `latest`): it binds none
    (wave / MANIFEST).write_bytes(orjson.dumps(dict(m, wave_dir="latest")))
    sealmod_sign = sealmod._private_key()
    import hashlib

    signed = (wave / MANIFEST).read_bytes()
    (wave / SEAL).write_bytes(orjson.dumps(dict(orjson.loads((wave / SEAL).read_bytes()),
                                                signature=sealmod_sign.sign(signed).hex(),
                                                manifest_sha256=hashlib.sha256(signed).hexdigest())))
    assert verify(wave)["ok"]


_cli = sandfleet


def test_grade_never_reseals_a_tampered_renamed_copy_as_intact(wave, tmp_path, monkeypatch):
    """A hostile review's find: a wave copied to t2 with effects.jsonl's last line deleted verified exit 1, then
    `grade t2` sealed it again silently, binding the copy's name, and `verify t2` said "intact". Now the grade names
    the failed seal (exit 2) and keeps the old seal; `--reseal` keeps it as SEAL.prev.json and binds the wave's id."""
    monkeypatch.setattr("cluster.report.start_timeline_png", lambda d: None)
    seal(wave)
    t2 = tmp_path / "t2"
    shutil.copytree(wave, t2)
    fx = t2 / "effects.jsonl"
    fx.write_bytes(b"".join(fx.read_bytes().splitlines(keepends=True)[:-1]))
    assert _verify(t2).exit_code == 1
    old_seal = (t2 / SEAL).read_bytes()
    r = _cli("grade", t2)
    assert r.exit_code == 2 and "fails its seal" in r.output and "changed: effects.jsonl" in r.output, r.output
    assert (t2 / SEAL).read_bytes() == old_seal  # not sealed again
    assert "the folder failed its seal before this grade" in (t2 / "SUMMARY.md").read_text()
    r = _verify(t2)
    assert r.exit_code == 1 and "changed: effects.jsonl" in r.output and "renamed: sealed as 'w'" in r.output
    r = _cli("grade", "--reseal", t2)
    assert r.exit_code == 2 and (t2 / "SEAL.prev.json").read_bytes() == old_seal, r.output
    assert orjson.loads((t2 / MANIFEST).read_bytes())["wave_dir"] == "w"  # the wave's id, never the copy's name
    r = _verify(t2)
    assert r.exit_code == 1 and "renamed: sealed as 'w'" in r.output and "sealed again after it failed" in r.output
    moved = tmp_path / "back" / "w"
    moved.parent.mkdir()
    shutil.move(t2, moved)
    r = _verify(moved)
    assert r.exit_code == 0 and "sealed again after it failed its earlier seal" in r.output, r.output


def test_grade_of_an_intact_folder_seals_it_again(wave, monkeypatch):
    monkeypatch.setattr("cluster.report.start_timeline_png", lambda d: None)
    seal(wave)
    r = _cli("grade", wave)
    assert "fails its seal" not in r.output and not (wave / "SEAL.prev.json").exists(), r.output
    assert _verify(wave).exit_code == 0


@pytest.mark.parametrize("field, value", [("manifest_sha256", None), ("manifest_sha256", "0" * 64),
                                          ("fingerprint", None), ("fingerprint", "x")])
def test_a_seal_whose_own_digest_or_fingerprint_is_wrong_is_exit_2(wave, field, value):
    """A hostile review's find: SEAL.json with a missing or wrong manifest_sha256 or fingerprint verified "intact"."""
    seal(wave)
    s = orjson.loads((wave / SEAL).read_bytes())
    if value is None:
        del s[field]
    else:
        s[field] = value
    (wave / SEAL).write_bytes(orjson.dumps(s))
    r = _verify(wave)
    assert r.exit_code == 2 and field in r.output, r.output


def test_changed_files_in_a_renamed_folder_read_plainly(wave, tmp_path):
    """A hostile review's find: "(and; the name is the wave's id..." for a renamed folder with changed files."""
    seal(wave)
    t2 = tmp_path / "t2"
    shutil.move(wave, t2)
    (t2 / "extra.txt").write_text("x")
    r = _verify(t2)
    assert r.exit_code == 1 and "(and;" not in r.output and "its files differ too" in r.output, r.output
