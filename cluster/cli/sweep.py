"""`sandfleet sweep`: what dead waves left, on this machine or on every node of a cluster."""
from __future__ import annotations

from typing import Optional

import typer

from cluster.cli.common import EXIT_BAD_INPUT, EXIT_HARNESS, EXIT_OK, app, out, err


@app.command("sweep")
def sweep_cmd(
    wave: Optional[str] = typer.Option(None, "--wave", help="only this wave id"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list what would be removed, change nothing"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="HOST:PORT of a Ray cluster's GCS: sweep every "
                                          "alive node of it, each its own leftovers (token auth: RAY_AUTH_TOKEN)"),
    include_resumable: bool = typer.Option(False, "--include-resumable", help="also remove the store data and "
                                           "ledger of a dead wave that `wave resume` could continue (kept otherwise, "
                                           "for 7 days)"),
) -> int:
    """Find and remove what dead waves left behind (processes, sandboxes, cgroups, mounts, key files). Without
    --cluster, this machine only: on a cluster of other machines, run it on each, or give --cluster. A dead wave
    that `wave resume` could continue is listed as resumable and its store and ledger are kept (for 7 days) unless
    --include-resumable."""
    from cluster import sweep

    if cluster is not None:
        return _sweep_cluster(cluster, wave, dry_run)

    unseen: list = []
    found = sweep.find(wave, unseen)
    lines = sweep.summary(found, include_resumable)
    for why in unseen:  # a part of the machine the sweep could not look at: say so, and do not say "nothing"
        err(f"warning: {why}; run `sandfleet sweep` again once it answers")
    if found.get("bad_fleet_record"):  # never removed: it is not a fleet's
        err(f"warning: left alone: {found['bad_fleet_record']}")
    if not lines:
        out.print("nothing left behind by a dead wave" + (" that could be looked at" if unseen else ""),
                  highlight=False, soft_wrap=True)
        return EXIT_HARNESS if unseen else EXIT_OK
    for line in lines:
        out.print(("would remove: " if dry_run else "found: ") + line, highlight=False, soft_wrap=True)
    if not dry_run:
        for line in sweep.remove(found, include_resumable=include_resumable):
            out.print(f"  {line}", highlight=False, soft_wrap=True)
    return EXIT_HARNESS if unseen else EXIT_OK


def _sweep_cluster(address: str, wave: str | None, dry_run: bool) -> int:
    from cluster import sweep_cluster
    from cluster.config import WaveConfig

    try:
        WaveConfig.model_validate({"address": address})
    except Exception:  # noqa: BLE001 - the config's own check of an address names what is allowed
        err(f"--cluster: value {address!r}: expected HOST:PORT of a Ray head's GCS, e.g. 10.0.0.5:6379")
        return EXIT_BAD_INPUT
    try:
        got = sweep_cluster.on_cluster(address, wave, dry_run)
    except Exception as exc:  # noqa: BLE001 - no cluster there, a wrong token
        err(f"--cluster {address}: could not reach the cluster: {type(exc).__name__}: {str(exc)[:300]}")
        return EXIT_HARNESS
    bad = False
    for node, r in sorted(got.items()):
        if "error" in r:
            bad = True
            err(f"node {node}: the sweep did not come back: {r['error']}")
            continue
        for why in r["unseen"]:
            bad = True
            err(f"node {node}: warning: {why}")
        if not r["found"]:
            out.print(f"node {node}: nothing left behind by a dead wave", highlight=False, soft_wrap=True)
        for line in r["found"]:
            out.print(f"node {node}: " + ("would remove: " if dry_run else "found: ") + line, highlight=False,
                      soft_wrap=True)
        for line in r["done"]:
            out.print(f"node {node}:   {line}", highlight=False, soft_wrap=True)
    return EXIT_HARNESS if bad else EXIT_OK

