"""The docs cannot go stale or grow back into a manual: the reference pages are what the code generates, every
config field and exit code is described, the README stays a front door, and no bullet of docs/architecture.md
runs past ~80 words."""
from __future__ import annotations

import re
from pathlib import Path

from cluster import docgen
from cluster.grade.checks import WAVE_CHECKS
from cluster.grade.wave import ungraded_wave

ROOT = Path(__file__).resolve().parents[2]
README_WORDS = 1200
BULLET_WORDS = 80


def test_reference_pages_are_what_the_code_generates():
    stale = docgen.stale()
    assert not stale, f"docs/reference/ {stale} differ from the code: run `.venv/bin/python -m cluster.docgen`"


def test_every_config_field_is_described():
    assert docgen.undescribed_fields() == [], "give each field a Field(description=...): the reference shows it"


def test_every_exit_code_has_a_meaning():
    assert set(docgen.exit_constants()) == set(docgen.EXIT_MEANINGS)


def test_every_wave_check_is_described():
    assert list(ungraded_wave({}, "a test")["wave_checks"]) == list(WAVE_CHECKS)


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    words = len(text.split())
    assert words <= README_WORDS, f"README.md has {words} words (at most {README_WORDS}): move reference to docs/"
    assert "make wave" in text and "make test" in text


def bullets(text: str) -> list[str]:
    """Each markdown list item with its continuation lines (indented, up to a blank line or the next item)."""
    out: list[list[str]] = []
    fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence:
            continue
        if re.match(r"^\s*(?:[-*+]|\d+\.) ", line):
            out.append([line])
        elif out and out[-1] and line.startswith(" ") and line.strip():
            out[-1].append(line)
        elif out and out[-1]:
            out.append([])
    return [" ".join(b) for b in out if b]


def test_bullets_split_after_their_items():
    assert bullets("- a b\n  c\n- d\n\ntext\n") == ["- a b   c", "- d"]


def test_architecture_bullets_are_short():
    long = [(len(b.split()), b[:60]) for b in bullets((ROOT / "docs/architecture.md").read_text())
            if len(b.split()) > BULLET_WORDS]
    assert not long, f"bullets of docs/architecture.md over {BULLET_WORDS} words (split them): {long}"


def test_architecture_keeps_its_walk_and_rooms():
    heads = re.findall(r"^## (.+)$", (ROOT / "docs/architecture.md").read_text(), re.M)
    assert "Follow one wave" in heads
    assert {"cluster/", "fleet/", "faults/", "storage/"} <= set(heads)


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    missing = [t for t in targets if t and not (ROOT / t).exists()]
    assert targets and not missing, f"README.md links to files that do not exist: {missing}"
