"""What a wave whose sandbox nodes are other machines (isolated nodes) needs before any task runs.

The head's gate (fleet/gateway.py) on its cluster address, with the wave's relay token, in front of the proxy,
the model endpoint and the effects service; the runner's workdir shipped to every node as a content-addressed
snapshot whose digest each node checks (fleet/codeship.py); and every other path the runner needs (its
interpreter, its venv) checked on every node. A node that lacks one is a harness error naming the node and the
path (exit 2), before anything runs: never a sandbox that silently goes without it.
"""
from __future__ import annotations

import secrets

from cluster.wave.access import PORT_EFFECTS, PORT_MODEL, PORT_S3
from cluster.wave.errors import HarnessError


def remote_launch(parts, runner: dict, binds: list[str], never=(), gate_port: int = 0) -> dict:
    """The relays, token and shipped code every remote sandbox of the wave gets (`launch` entries); the gate on
    `gate_port` of the cluster address (0: a free one)."""
    import ray

    from fleet.codeship import ShipError, environments, snapshot
    from fleet.gateway import Gateway

    fleet = parts.fleet
    token = secrets.token_hex(32)
    p = parts
    try:
        parts.gateway = Gateway(fleet.cluster_ip, token, {
            "s3": ("127.0.0.1", p.proxy.port), "model": ("127.0.0.1", p.model.server.server_address[1]),
            "effects": ("127.0.0.1", p.effects.server.server_address[1])}, port=gate_port).start()
    except OSError as exc:
        raise HarnessError(f"gateway.port {gate_port}: the gate cannot listen on {fleet.cluster_ip}:{gate_port}: "
                           f"{exc.strerror or exc} (choose a free port, or 0 for any)") from None
    gw = parts.gateway
    out = {"relays": {PORT_S3: gw.target("s3"), PORT_MODEL: gw.target("model"), PORT_EFFECTS: gw.target("effects")},
           "relay_token": token, "remote": True, "code": None}
    workdir = runner.get("workdir")
    if workdir:
        try:
            digest, data = snapshot(workdir, never)
        except (ShipError, OSError) as exc:
            raise HarnessError(f"runner workdir {workdir}: cannot be shipped to the nodes: {exc}") from exc
        envs = environments(workdir, never)  # (a venv, node_modules: each node's own, at the same path)
        out["code"] = {"digest": digest, "path": workdir, "envs": envs}
        out["shipped"] = {"bytes": len(data), "digest": digest, "node_envs": envs}
        stage(fleet.node_ids, fleet.hosts, digest, data)
        fleet.on_restore = lambda name, host: stage([name], [host], digest, data)
    need = [b for b in binds if b != workdir] + list((out["code"] or {}).get("envs", []))
    for name, missing in zip(fleet.node_ids, ray.get([h.missing_paths.remote(need) for h in fleet.hosts],
                                                     timeout=60)):
        if missing:
            raise HarnessError(f"node {name}: {missing[0]} is not there; the runner's interpreter and its installed "
                               "environments (a venv, node_modules: never shipped) must be at the same path on every "
                               "node: build them there (`make examples` on each node, or the cluster's "
                               "setup_commands), or put them on a filesystem every node mounts at that path (one "
                               "the runner does not use: name it in the workdir's .sandfleetignore)")
    return out


def stage(names: list[str], hosts: list, digest: str, data: bytes) -> None:
    """The runner's snapshot unpacked and checked on each node (again on a node that came back)."""
    import ray

    got = ray.get([h.stage_code.remote(digest, data) for h in hosts], timeout=120)
    for name, r in zip(names, got):
        if not r.get("ok"):
            raise HarnessError(f"node {name}: the runner's code could not be staged: {r.get('why')}")


def nodes_record(fleet) -> list[dict]:
    """results/<wave>/nodes.json: each Ray node of the wave's fleet, by name."""
    import ray

    from cluster.raysession import node_name

    iso = fleet.ray_session.isolated
    alive = [n for n in ray.nodes() if n.get("Alive")]
    if iso is not None:
        from cluster.isolated import HEAD_IP

        head = next((n for n in alive if n["NodeManagerAddress"] == HEAD_IP), None)
        iso.head["ray_node_id"] = head["NodeID"] if head else None
        return iso.describe()
    if fleet.ray_session.address == "local":  # a simulated cluster: node-0 is the head, the others sandbox nodes
        out = [{"name": node_name(n), "ray_node_id": n["NodeID"], "address": n["NodeManagerAddress"],
                "head": node_name(n) == "node-0" or fleet.nodes == 1,
                "sandboxes": node_name(n) in fleet.node_ids} for n in alive]
        return sorted(out, key=lambda r: r["name"])
    # an existing cluster: the head is the driver's node; the sandbox nodes are named as the timeline names them
    mine = ray.get_runtime_context().get_node_id()
    by_id = {nid: name for name, nid in fleet.node_placement.items()}
    out = [{"name": by_id.get(n["NodeID"]) or ("node-0" if n["NodeID"] == mine and not by_id else node_name(n)),
            "ray_node_id": n["NodeID"], "address": n["NodeManagerAddress"], "head": n["NodeID"] == mine,
            "sandboxes": n["NodeID"] in by_id or (not by_id and n["NodeID"] == mine)} for n in alive]
    return sorted(out, key=lambda r: r["name"])
