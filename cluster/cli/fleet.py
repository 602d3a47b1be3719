"""`sandfleet up`, `down` and `status`: the long-lived local fleet waves attach to with `--address fleet`."""
from __future__ import annotations

from cluster.cli.common import EXIT_FAIL, EXIT_HARNESS, EXIT_OK, app, out, err


@app.command("up")
def up_cmd() -> int:
    """Start a long-lived local fleet (a private Ray, the harness's actors, one store) that waves attach to with
    --address fleet; found through /run/sandfleet/fleet.json ($SANDFLEET_FLEET_FILE). Exit 0 once it is up (or
    was), 2 when it could not start."""
    from cluster import localfleet

    try:
        info, started = localfleet.up()
    except localfleet.FleetError as exc:
        err(f"error: {exc}")
        return EXIT_HARNESS
    out.print(f"fleet {'up' if started else 'already up'}: pid {info['pid']}, Ray {info['ray']['address']}, store "
              f"{info['store']['url']}; run waves with --address fleet; `sandfleet down` stops it",
              highlight=False, soft_wrap=True)
    return EXIT_OK


@app.command("down")
def down_cmd() -> int:
    """Stop the fleet of `sandfleet up` (its sandboxes, actors, Ray and store). Exit 0 when it is down (or none was
    up), 2 when it had to be killed and swept, or the record file is not a fleet's (left as it is)."""
    from cluster import localfleet

    try:
        info = localfleet.down()
    except localfleet.FleetError as exc:
        err(f"error: {exc}")
        return EXIT_HARNESS
    if info is None:
        out.print("no fleet is up", highlight=False, soft_wrap=True)
        return EXIT_OK
    if info.get("waves"):
        err("warning: the fleet was stopped under running wave(s), which end with a harness error (exit 2): "
             + ", ".join(f"{w['wave']} (pid {w['pid']})" for w in info["waves"]))
    for line in info.get("swept", []):
        out.print(f"  {line}", highlight=False, soft_wrap=True)
    if info.get("killed"):
        err(f"error: the fleet's daemon (pid {info['pid']}) did not stop in {localfleet.DOWN_TIMEOUT_S:.0f} s: "
             "killed, and what it left was swept")
        return EXIT_HARNESS
    if not info.get("stopped"):
        out.print(f"no fleet daemon of {localfleet.fleet_file()} was running (pid {info['pid']} is not it): removed "
                  "its record and what its fleet left", highlight=False, soft_wrap=True)
        return EXIT_OK
    out.print(f"fleet down (pid {info['pid']})", highlight=False, soft_wrap=True)
    return EXIT_OK


@app.command("status")
def status_cmd() -> int:
    """Is the fleet of `sandfleet up` up, and do its Ray and store answer? Exit 0 when up and answering, 1 when no
    fleet is up, 2 when one is up but a part of it does not answer, or the record file is not a fleet's."""
    from cluster import localfleet

    try:
        st = localfleet.status()
        gone = localfleet.stale() if st is None else None
    except localfleet.FleetError as exc:
        err(f"error: {exc}")
        return EXIT_HARNESS
    if st is None:
        out.print("no fleet is up" + (f" (the record of a dead one is there, pid {gone.get('pid')}: "
                                       "`sandfleet sweep` removes it)" if gone else ""), highlight=False,
                  soft_wrap=True)
        return EXIT_FAIL
    for k in ("pid", "up_s", "ray", "ray_answers", "store", "store_answers", "bucket", "nodes", "state_dir", "file",
              "waves"):
        out.print(f"{k}: {st[k]}", highlight=False, soft_wrap=True)
    return EXIT_OK if st["ray_answers"] and st["store_answers"] else EXIT_HARNESS

