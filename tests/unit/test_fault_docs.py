"""The disk modes each fault accepts are the catalog's (`disk_modes`): `sandfleet faults`, the disk table of docs/waves.md
(moved there from the README) and the runner contract's table say the same, so adding a fault (or a mode to one) cannot leave the docs behind."""
from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from cluster.cli import app
from cluster.config_fields import DISK_BOUNDARIES as CONFIG_BOUNDARIES
from cluster.config_fields import SandboxConfig
from faults import CATALOG
from faults.base import DISK_BOUNDARIES, DISK_MODES, disk_mode_rows

ROOT = Path(__file__).resolve().parents[2]


def _table(text: str) -> list[str]:
    """The rows of the `| fault | disk modes |` table in a markdown file."""
    lines = text.splitlines()
    start = lines.index("| fault | disk modes |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_guide_and_the_contract_list_each_faults_disk_modes_as_the_catalog_does():
    want = disk_mode_rows()
    assert any("keep" in r for r in want) and "| PK6 | wipe |" in want
    for doc in ("docs/waves.md", "docs/runner-contract.md"):
        assert _table((ROOT / doc).read_text()) == want, doc


def test_sandfleet_faults_names_each_faults_disk_modes_the_modes_and_the_disk_boundaries():
    r = CliRunner().invoke(app, ["faults"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    text = r.output
    for fid, f in CATALOG.items():
        block = re.search(rf"^{fid}  .*\n +disk: (.*)$", text, re.M)
        assert block, fid
        modes = getattr(f, "disk_modes", ())
        assert block.group(1) == ", ".join(modes) if modes else block.group(1).startswith("- "), (fid, block.group(1))
    for mode in DISK_MODES:
        assert re.search(rf"^  {re.escape(mode)} +\S", text, re.M), mode
    for key in DISK_BOUNDARIES:
        assert re.search(rf"^  {key} +kill", text, re.M), key


def test_every_mode_a_fault_or_a_config_names_is_described():
    named = {m for f in CATALOG.values() for m in getattr(f, "disk_modes", ())}
    named |= set(SandboxConfig.model_fields["disk"].annotation.__args__)
    assert named <= set(DISK_MODES), named - set(DISK_MODES)
    assert tuple(DISK_BOUNDARIES) == CONFIG_BOUNDARIES
