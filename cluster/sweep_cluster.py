"""`sandfleet sweep --cluster`: the one-machine sweep (`cluster.sweep.here`) run on every alive node of a Ray cluster,
each node ending only its own leftovers; the waves whose driver runs on any node are live everywhere."""
from __future__ import annotations

from cluster.sweep import here, live_waves


def on_cluster(address: str, wave: str | None, dry_run: bool, timeout_s: float = 120.0) -> dict:
    """`here` on every alive node of the Ray cluster at `address` (a task pinned to each by node id), by node
    address; a node whose task did not come back is named with why."""
    from cluster.raysession import auth_hint, token_auth_for_cluster

    token_auth_for_cluster()
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except Exception as exc:
        hint = auth_hint(address, exc)
        if hint is not None:
            raise RuntimeError(hint) from None
        raise
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]

        def on_each(fn, *args):
            task = ray.remote(num_cpus=0, max_retries=0)(fn)
            return {n["NodeManagerAddress"] + f" ({n['NodeID'][:8]})": task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(*args)
                for n in nodes}
        # first every node's live waves (a driver runs on one node; its sandboxes on others are not a dead wave's)
        live: set[str] = set()
        for ref in on_each(live_waves).values():
            try:
                live.update(ray.get(ref, timeout=timeout_s))
            except Exception:  # noqa: BLE001 - that node's own sweep below says what is wrong with it
                pass
        refs = on_each(here, wave, dry_run, sorted(live))
        out = {}
        for name, ref in refs.items():
            try:
                out[name] = ray.get(ref, timeout=timeout_s)
            except Exception as exc:  # noqa: BLE001 - one node's failure is that node's line
                out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        return out
    finally:
        ray.shutdown()
