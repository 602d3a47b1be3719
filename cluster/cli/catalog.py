"""`sandfleet faults`: the fault catalog, its disk modes and disk boundaries."""
from __future__ import annotations

from cluster.cli.common import app, out


@app.command("faults")
def faults_cmd() -> int:
    """List the fault catalog, the disk modes each fault accepts, and the disk's boundaries."""
    from faults import CATALOG
    from faults.base import DISK_BOUNDARIES, DISK_MODES

    for fid, f in sorted(CATALOG.items()):
        out.print(f"{fid}  {f.family:<11} {f.description}", highlight=False, soft_wrap=True)
        modes = getattr(f, "disk_modes", ())
        out.print(f"     {'':<11} disk: " + (", ".join(modes) if modes else "- (ends no attempt: the disk stays as "
                                                                            "it is)"), highlight=False, soft_wrap=True)
    out.print("\ndisk modes (sandbox.disk, fault_timing.<id>.disk; what an interruption that ends an attempt leaves of "
              "the task's disk, its workspace and HOME):", highlight=False, soft_wrap=True)
    for mode, what in DISK_MODES.items():
        out.print(f"  {mode:<14} {what}", highlight=False, soft_wrap=True)
    out.print("\ndisk boundaries (fault_timing.PK1, [lo, hi]; --enumerate-boundaries counts them on a kept disk):",
              highlight=False, soft_wrap=True)
    for key, what in DISK_BOUNDARIES.items():
        out.print(f"  {key:<19} {what}", highlight=False, soft_wrap=True)
    return 0

