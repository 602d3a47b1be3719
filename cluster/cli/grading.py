"""`sandfleet grade`, `report` and `verify`: a stored wave graded, rendered and checked again, running nothing."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from cluster import results
from cluster.cli.common import (EXIT_BAD_INPUT, EXIT_FAIL, EXIT_HARNESS, EXIT_OK, app, dir_arg, out, err,
                                seal_again)


@app.command("grade")
def grade_cmd(results_dir: str = typer.Argument(..., help="a wave's results directory"),
              reseal: bool = typer.Option(False, "--reseal",
                                          help="seal a folder that fails its seal as it is now (the old seal kept "
                                               "as SEAL.prev.json and MANIFEST.prev.json, its wave id kept)")) -> int:
    """Re-grade a finished wave from its stored files (runs nothing). Exit as a wave does (0, 1, 2); 2 also when a
    stored file it needs is damaged (named), 254 when RESULTS_DIR is empty, missing or not a wave's directory.
    A folder that fails its seal (`sandfleet verify`: a file changed, added or missing, renamed, or a damaged seal)
    is graded as it is now, named as a harness error (exit 2), and not sealed again: `verify` still says what
    changed. `--reseal` seals it anyway, keeping the old seal beside it and the wave id the old seal bound. A folder
    with no seal at all, or sealed by another key than yours, is graded and not sealed (`--reseal` seals it)."""
    from cluster.grade import exit_code, grade_wave
    from cluster.report import write_summary

    results_dir = dir_arg(results_dir, "RESULTS_DIR") if isinstance(results_dir, str) else results_dir
    if results_dir is None:
        return EXIT_BAD_INPUT
    plan = results_dir / results.PLAN
    if plan.is_symlink() or (plan.exists() and not plan.is_file()):  # a FIFO would hang the reader: named, never read
        err(f"error: cannot grade {results_dir}: {results.PLAN}: not a regular file (the file is damaged; nothing "
            "was graded)")
        return EXIT_HARNESS
    if not plan.is_file():
        err(f"error: {results_dir} has no plan.json; pass a wave's results directory (e.g. results/latest)")
        return EXIT_BAD_INPUT
    from cluster.grade import Unreadable

    damaged = _damaged_plan(results_dir)  # the plan is the grade's spine: one of another shape is named, not guessed
    if damaged:
        err(f"error: cannot grade {results_dir}: {damaged} (the file is damaged; nothing was graded, SUMMARY.md and "
             "the grade files there are from before)")
        return EXIT_HARNESS
    broken, sealer = _fails_its_seal(results_dir)  # asked before the grade rewrites the files the seal covers
    sealed = any(os.path.lexists(results_dir / n) for n in (results.SEAL, results.SEAL_MANIFEST))
    foreign = _foreign_seal(sealer) if not broken else None
    try:
        result = grade_wave(results_dir)
    except Unreadable as exc:
        err(f"error: cannot grade {results_dir}: {exc} (the file is damaged; nothing was graded, "
             "SUMMARY.md and the grade files there are from before)")
        return EXIT_HARNESS
    except Exception as exc:  # noqa: BLE001 - a damaged wave dir is a harness problem, never a verdict
        err(f"error: cannot grade {results_dir}: {_damaged_plan(results_dir) or f'{type(exc).__name__}: {exc}'} "
             "(a results file has unexpected content; nothing was graded)")
        return EXIT_HARNESS
    if broken:
        result["harness_errors"] = list(result.get("harness_errors") or []) + [
            f"the folder failed its seal before this grade ({broken}): graded as it is now" + (
                "; sealed again with --reseal, the old seal kept as SEAL.prev.json" if reseal else
                "; not sealed again (`sandfleet verify` names what changed; `grade --reseal` seals it as it is)")]
    try:
        write_summary(results_dir, result)
    except (ValueError, OSError) as exc:  # e.g. a directory where SUMMARY.md goes: named, nothing removed, unsealed
        err(f"error: {results_dir}: graded {result['verdict']}, but its files could not all be written: {exc} "
            "(nothing recorded was removed; the folder is not sealed again)")
        return EXIT_HARNESS
    if not broken and foreign and not reseal:  # our key never vouches for a folder another key sealed, unasked
        err(f"warning: {results_dir} was sealed by key {sealer}, {foreign}: graded, not sealed again (pass --reseal "
            "to seal it with your key as it is, keeping that seal as SEAL.prev.json)")
    elif not broken and foreign:
        from cluster.seal import SealError
        from cluster.seal import reseal as reseal_folder

        try:
            reseal_folder(results_dir, f"sealed by key {sealer}, {foreign}")
        except (SealError, OSError) as exc:
            err(f"warning: {results_dir} not sealed: {exc}")
    elif not broken and (sealed or reseal):
        seal_again(results_dir)
    elif not broken:  # a seal removed from a forged copy cannot be told from none ever made: never vouched for here
        err(f"warning: {results_dir} carries no seal: graded, not sealed (a wave is sealed when it ends; this is one "
            "from before seals, or one whose seal was removed; pass --reseal to seal it as it is)")
    elif reseal:
        from cluster.seal import SealError
        from cluster.seal import reseal as reseal_folder

        try:
            reseal_folder(results_dir, broken)
        except (SealError, OSError) as exc:
            err(f"warning: {results_dir} not sealed: {exc}")
    else:
        err(f"warning: {results_dir} fails its seal ({broken}): graded as it is now, not sealed again "
            "(pass --reseal to seal it as it is, keeping the old seal as SEAL.prev.json)")
    out.print(f"wave {result['wave_id']}: {result['verdict']}", highlight=False, soft_wrap=True)
    out.print(f"SUMMARY: {results_dir / results.SUMMARY}", highlight=False, soft_wrap=True)
    return exit_code(result)


def _fails_its_seal(results_dir: Path) -> tuple[str | None, str | None]:
    """(why a sealed folder is not the one its seal names: a file changed, added or missing, the folder renamed, the
    seal damaged; None: intact, or never sealed), (the sealing key's fingerprint, when the seal verifies)."""
    from cluster.seal import SealError, said, verify

    if not any(os.path.lexists(results_dir / n) for n in (results.SEAL, results.SEAL_MANIFEST)):
        return None, None
    try:
        got = verify(results_dir)
    except SealError as exc:
        return f"its seal is damaged: {exc}", None
    if got["ok"]:
        return None, got["fingerprint"]
    # a file grade and report write themselves (SUMMARY, verdict, the page and picture, a task's grade, page or
    # evidence) changed or gone is rewritten here anyway; one added, or any other name, is the folder's own change
    derived = {results.SUMMARY, results.VERDICT, results.INDEX_HTML, results.TIMELINE_PNG}

    def theirs(name: str) -> bool:
        parts = name.split("/")
        return (name in derived or (len(parts) == 1 and name.endswith(results.GRADE_SUFFIX))
                or (len(parts) == 2 and parts[0] == results.PAGES and name.endswith(".html"))
                or (len(parts) == 3 and parts[0] == results.EVIDENCE))

    got = dict(got, **{what: [n for n in got[what] if what == "added" or not theirs(n)]
                       for what in ("changed", "added", "missing")})
    return said(got) or None, got["fingerprint"]


def _foreign_seal(sealer: str | None) -> str | None:
    """Why a seal that verifies is not this user's to renew (None: it is, or there is none): made by another key,
    or no key of this user's can be read."""
    from cluster.seal import own_fingerprint

    if sealer is None:
        return None
    mine = own_fingerprint()
    if mine == sealer:
        return None
    return f"not your key ({mine})" if mine else "and you have no seal key"


def _damaged_plan(results_dir: Path) -> str | None:
    """What is wrong with a wave's plan.json (file and field, cluster/planfile.py), or None when it has the shape the
    planner writes: said when the grader could not read a wave, rather than the error it stumbled on."""

    from cluster import planfile

    try:
        planfile.read(results_dir / results.PLAN)
    except planfile.PlanError as exc:
        return str(exc)
    except OSError as exc:
        return f"{results_dir / results.PLAN}: {exc.strerror or exc}"
    return None


@app.command("verify")
def verify_cmd(results_dir: str = typer.Argument(..., help="a wave's results directory"),
               public_key: Optional[str] = typer.Option(None, "--public-key",
                                                       help="the sealer's Ed25519 public key (hex): refuse a seal "
                                                            "made with any other")) -> int:
    """Check that a wave's folder is the one its seal names: the seal's signature, the folder's name (the wave id)
    and every file's sha256 (exit 0 intact, 1 a file changed, added or missing, or the folder renamed, each named;
    2 no seal, or a damaged or foreign one; 254 RESULTS_DIR empty, missing or not a directory). A link is named
    with its target's digest, never followed; a file the seal does not list is named without being read."""
    from cluster.seal import SealError, verify

    results_dir = dir_arg(results_dir, "RESULTS_DIR")
    if results_dir is None:
        return EXIT_BAD_INPUT

    if public_key is not None and not (len(public_key) == 64 and all(c in "0123456789abcdefABCDEF"
                                                                     for c in public_key)):
        err(f"error: option --public-key: value {public_key!r}: expected 64 hex digits (an Ed25519 public key)")
        return EXIT_BAD_INPUT
    try:
        got = verify(results_dir, public_key)
    except SealError as exc:
        err(f"error: cannot verify {results_dir}: {exc}")
        return EXIT_HARNESS
    if got["ok"]:
        again = (f" (sealed again after it failed its earlier seal: {got['resealed_after']}; that seal is kept as "
                 "SEAL.prev.json)") if got.get("resealed_after") else ""
        out.print(f"{results_dir}: intact, sealed by key {got['fingerprint']}{again}", highlight=False,
                  soft_wrap=True)
        return EXIT_OK
    for what in ("changed", "added", "missing"):
        for name in got[what]:
            err(f"{what}: {results.one_line(name)}")  # a runner's file name may hold a newline: one line each
    if got.get("renamed_from"):  # the seal binds the folder's name (the wave id) as well as its files
        intact = not (got["changed"] or got["added"] or got["missing"])
        files = "its files are intact; " if intact else "its files differ too, named above; "
        err(f"renamed: sealed as {got['renamed_from']!r}, this folder is {got['now_as']!r} ({files}the name is "
            f"the wave's id: move it back to {got['renamed_from']!r} to verify it)")
    if got.get("resealed_after"):
        err(f"note: sealed again after it failed its earlier seal ({got['resealed_after']}; that seal is kept as "
            "SEAL.prev.json)")
    err(f"{results_dir}: NOT the folder key {got['fingerprint']} sealed: {len(got['changed'])} changed, "
         f"{len(got['added'])} added, {len(got['missing'])} missing"
        + (f", renamed from {got['renamed_from']!r}" if got.get("renamed_from") else ""))
    return EXIT_FAIL


@app.command("report")
def report_cmd(results_dir: str = typer.Argument(..., help="a wave's results directory")) -> int:
    """Render a finished wave's SUMMARY.md and index.html again from its stored files (graded again from them, as
    `sandfleet grade` does, with its exit codes; runs nothing)."""
    results_dir = dir_arg(results_dir, "RESULTS_DIR")
    if results_dir is None:
        return EXIT_BAD_INPUT
    page = results_dir / results.INDEX_HTML
    before = _file_id(page)
    code = grade_cmd(results_dir, reseal=False)
    if code in (0, 1, 2) and page.is_file() and _file_id(page) != before:  # only a page this run wrote is named
        out.print(f"REPORT: {results_dir / results.INDEX_HTML}", highlight=False, soft_wrap=True)
    return code


def _file_id(p: Path) -> tuple | None:
    """What tells a file written again (a new inode: files are written whole and renamed over) from the old one."""
    try:
        st = os.lstat(p)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns
