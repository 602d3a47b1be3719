"""The fleet a wave runs on: its Ray (`cluster/raysession.py`), the lease ledger, one sandbox host per node and the
sweep actor, lent across waves or a wave's own; node loss and return for PK3."""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
from pathlib import Path

from cluster import fleetrecord, results
from cluster.fleetnodes import NodeChanges, drop_harness_dir
from cluster.raysession import HEALTH_CHECKS, RaySession, node_name, node_resource  # noqa: F401


def discover_sandbox_nodes() -> dict[str, str]:
    """Node name -> Ray node id of every alive node that offers a `sandfleet` resource: named by its
    `sandfleet-node:<name>` resource when it has one (isolated nodes, a cluster config that names them), else by its
    address; raylets that share an address (several on one machine: Ray's fake multinode provider) also by the tail of
    their node id."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive") and "sandfleet" in (n.get("Resources") or {})]
    names = [node_name(n) for n in alive]
    return {(f"{name}-{n['NodeID'][-6:]}" if names.count(name) > 1 else name): n["NodeID"]
            for name, n in zip(names, alive)}


class FleetSession(NodeChanges):
    """Ray plus the long-lived actors a wave uses: one lease ledger and one sandbox host per node.

    A CLI wave makes its own and stops it at the end; a test session, a campaign and a league make one and
    lend it to every wave (ledger keys carry the wave id, hosts are wave-agnostic).

    `store=True`: the fleet also runs one embedded S3 store (weed mini) with one bucket, lent to every wave that
    has no store of its own configured: each wave writes under its own `<wave id>/` prefix with its own
    per-attempt keys (owned as `<wave id>/<sandbox>`), so a wave starts no store and creates no bucket (a new
    bucket is a new SeaweedFS collection: 0.25 s of volume growth each, and about 40 of them fill weed mini's
    auto-sized volume limit).
    """

    def __init__(self, address: str = "local", state_dir: str | None = None, ray_tmpdir: str | None = None,
                 nodes: int = 1, store: bool = False, isolation: str = "none", names: str | None = None,
                 namespace: str | None = None, min_sandbox_nodes: int | None = None):
        self.ray_session = RaySession(address, tmpdir=ray_tmpdir, nodes=nodes, isolation=isolation,
                                      namespace=namespace)
        self.min_sandbox_nodes = min_sandbox_nodes  # an existing cluster: fewer alive sandbox nodes is an error
        self.warnings: list[str] = []  # what a user who meant other machines must hear (the sandboxes' placement)
        self.names = names  # a prefix: the actors are named (`<prefix>ledger`, ...) for drivers that attach
        self.attached = False  # a fleet of `sandfleet up` this driver attached to (cluster/localfleet.py)
        self.nodes = nodes
        from fleet.hollow import hollow_nodes

        self.hollow = hollow_nodes()  # the scale bench's hollow nodes (fleet/hollow.py; bench only, never a product)
        # the sandbox nodes are other machines (isolated nodes): nothing a host has is a path or pid here, and the
        # sandboxes reach the head's services through its gate (fleet/gateway.py) at `cluster_ip`
        self.remote = isolation == "namespaces"
        self.cluster_ip = "127.0.0.1"
        self.node_placement: dict[str, str] = {}  # sandbox node name -> Ray node id (discovered)
        self.on_restore = None  # (name, host) -> None: called when a lost node is back, before it runs anything
        self.down: set[str] = set()  # sandbox nodes lost (PK3) and not back yet
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="sandfleet-fleet-", dir="/tmp")
        self._own_state_dir = state_dir is None
        self.ledger = None
        self.sweeper = None  # the sweep actor (fleet/sweeper.py), reused by every wave
        self.hosts: list = []
        self.node_ids: list[str] = []
        self.want_store = store
        self.store = None  # storage.store.EmbeddedStore lent to the waves (store=True)
        self.keys = None  # storage.keys.ScopedKeys of that store
        self.bucket: str | None = None

    def start(self) -> "FleetSession":
        from fleet.ledger import start_ledger_actor
        from fleet.sweeper import start_sweep_actor

        os.chmod(self.state_dir, 0o700)
        if self._own_state_dir:  # a later `sandfleet sweep` ends what this fleet left once its owner is gone
            from cluster.sweep import record_driver

            record_driver(Path(self.state_dir))
        if self.want_store:  # it comes up while Ray does
            self._launch_store()
        ray = self.ray_session.start()
        if self._own_state_dir and self.ray_session.tmpdir:  # the sweep ends a dead owner's Ray by it
            import orjson

            with open(os.path.join(self.state_dir, results.RAY_RECORD), "wb") as f:
                f.write(orjson.dumps({"tmpdir": self.ray_session.tmpdir}))
        self.ledger = start_ledger_actor(os.path.join(self.state_dir, results.LEDGER_DB), resources=self._pin("node-0"),
                                         strategy=self._affinity(), name=self._name("ledger"))
        # One node: its host runs the sandboxes. A simulated cluster: node-0 is the head (driver, ledger, store,
        # proxy, model, effects) and runs no sandboxes, like an on-demand head over spot workers. Isolated nodes are
        # found as a real cluster's are: the alive nodes that offer a `sandfleet` resource, each host pinned by id.
        if self.remote:
            from cluster.isolated import HEAD_IP

            self.cluster_ip = HEAD_IP
            self.node_placement = discover_sandbox_nodes()
            if not self.node_placement:
                raise RuntimeError("no sandbox node: no alive Ray node offers a `sandfleet` resource")
            self.node_ids = sorted(self.node_placement)
        elif self.ray_session.address != "local" and self._discover_cluster_nodes():
            pass  # an existing cluster's sandbox nodes: as isolated nodes are (remote: shipped code, the gate)
        elif self.ray_session.address not in ("local", "fleet"):
            self._too_few_nodes({})
            import ray

            self.node_ids = ["node-0"]
            self.warnings.append(
                f"every sandbox ran on the driver's own machine ({ray.util.get_node_ip_address()}): the cluster at "
                f"{self.ray_session.address} has no other alive node (did the workers join? `ray status` on the "
                "head lists them); pass --min-sandbox-nodes N to make this an error")
        elif self.hollow:
            self.node_ids = [f"hollow-{i}" for i in range(self.hollow)]
        else:
            self.node_ids = ["node-0"] if self.nodes == 1 else [f"node-{i}" for i in range(1, self.nodes)]
        self.hosts = [self._start_host(n) for n in self.node_ids]
        self.sweeper = start_sweep_actor(self.ledger, resources=self._pin("node-0"), strategy=self._affinity(),
                                         name=self._name("sweeper"))
        ray.get([h.ping.remote() for h in self.hosts] + [self.ledger.active.remote(), self.sweeper.ping.remote()],
                timeout=120)
        self._tell_sweeper()
        self.host_info = ray.get([h.join_harness.remote() for h in self.hosts], timeout=60)
        if self.want_store:
            self._store_ready()
        return self

    @classmethod
    def lent_for(cls, cfg) -> "FleetSession | None":
        """The fleet a league, campaign or shrink lends its waves: one of its own, started now; None for address
        'fleet' (each wave attaches to `sandfleet up`'s itself)."""
        return None if cfg.address == "fleet" else cls(cfg.address, store=not cfg.store.url).start()

    @classmethod
    def attach(cls, info: dict, wave_id: str | None = None) -> "FleetSession":
        """The fleet of `sandfleet up` (its record, cluster/fleetrecord.py): this driver connects to its Ray and
        finds its actors by name, and gets its store's endpoint and a key book of its own (per-attempt keys of
        this driver only, beside those of other waves attached at the same time). Nothing is started; `stop`
        only disconnects."""
        from storage.credentials import Credentials
        from storage.keys import ScopedKeys
        from storage.store import EmbeddedStore, StoreEndpoint

        # (Ray reads these when it is first imported: a process that imported it before cannot attach)
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = info["ray"]["token"]
        import ray
        from cluster.wave.errors import HarnessError

        self = cls(info["ray"]["address"], state_dir=info["state_dir"], namespace=info["namespace"])
        self.attached = True
        self.ray_session.start()
        names = info["actors"]

        def actor(name: str):
            try:
                return ray.get_actor(name, namespace=info["namespace"])
            except ValueError:  # (Ray's word for a name no live actor holds)
                raise HarnessError(f"the fleet of `sandfleet up` has lost its actor {name!r}: `sandfleet down`, then "
                                   "`sandfleet up`") from None

        self.ledger, self.sweeper = actor(names["ledger"]), actor(names["sweeper"])
        self.hosts = [actor(n) for n in names["hosts"]]
        self.node_ids, self.host_info = list(info["node_ids"]), list(info["host_info"])
        st = info["store"]
        endpoint = StoreEndpoint(url=st["url"], creds=Credentials(*st["admin"]), region=st["region"])
        self.store = EmbeddedStore.attached(Path(st["workdir"]), st["pid"], st["start"], endpoint, st["ports"])
        self.keys = ScopedKeys(self.store, endpoint.creds)
        self.bucket = info["bucket"]
        if wave_id is not None:  # `sandfleet status` and `down` name the waves on the fleet
            self.joined = fleetrecord.join(info, wave_id)
        return self

    def _discover_cluster_nodes(self) -> bool:
        """`--address`: the sandbox nodes are the alive nodes that offer a `sandfleet` resource, or, when none
        does, every alive node but the driver's own. Found: they are treated as other machines (their hosts pinned
        by node id, the runner's code shipped, services through the gate on the driver's node address). None (a
        one-node cluster): False, and the driver's node runs the sandboxes, as the only machine there is."""
        import ray

        found = discover_sandbox_nodes()
        if not found:
            mine = ray.get_runtime_context().get_node_id()
            found = {node_name(n): n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] != mine}
        if not found:
            return False
        self._too_few_nodes(found)
        self.remote = True
        self.cluster_ip = ray.util.get_node_ip_address()
        self.node_placement = found
        self.node_ids = sorted(found)
        return True

    def _too_few_nodes(self, found: dict[str, str]) -> None:
        """--min-sandbox-nodes: fewer alive sandbox nodes than asked is an error before any task, naming them."""
        import ray

        if self.min_sandbox_nodes is None or len(found) >= self.min_sandbox_nodes:
            return
        alive = sorted(f"{node_name(n)} ({n['NodeManagerAddress']})" for n in ray.nodes() if n.get("Alive"))
        raise RuntimeError(f"--min-sandbox-nodes {self.min_sandbox_nodes}: the cluster at {self.ray_session.address} "
                           f"has {len(found)} alive sandbox node(s) other than the driver's own "
                           f"({', '.join(sorted(found)) or 'none'}); its alive nodes: {', '.join(alive)}")

    def _tell_sweeper(self) -> None:
        """Sandbox nodes that are other machines are scanned by their own hosts: the sweep actor is told which
        nodes there are and which are lost (again whenever that changes). A shared machine's is scanned in place."""
        import ray

        if (self.remote or self.hollow) and self.sweeper is not None:
            ray.get(self.sweeper.set_nodes.remote(dict(zip(self.node_ids, self.hosts)),
                                                  {n: "lost (PK3)" for n in self.down}), timeout=60)

    def _launch_store(self) -> None:
        from storage.store import EmbeddedStore

        self.store = EmbeddedStore(os.path.join(self.state_dir, f"store-{secrets.token_hex(3)}"))
        self.store.launch()

    def _store_ready(self) -> None:
        from storage.keys import ScopedKeys
        from storage.store import ensure_bucket

        self.store.wait_ready()
        self.bucket = "sf-fleet-" + secrets.token_hex(6)
        ensure_bucket(self.store.endpoint, self.bucket)
        self.keys = ScopedKeys(self.store, self.store.endpoint.creds)

    def _start_host(self, name: str):
        from fleet.host import start_host_actor

        if self.remote:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            return start_host_actor(name, self.ledger, None,
                                    NodeAffinitySchedulingStrategy(self.node_placement[name], soft=False))
        if self.hollow:  # every hollow node's host on the one machine (its actor process is its node)
            return start_host_actor(name, self.ledger, None, self._affinity(), hollow=True)
        return start_host_actor(name, self.ledger, self._pin(name), self._affinity(), name=self._name(f"host-{name}"))

    def _name(self, what: str) -> str | None:
        return f"{self.names}{what}" if self.names else None

    def _pin(self, name: str) -> dict | None:
        return {node_resource(name): 0.001} if self.nodes > 1 else None

    def _affinity(self):
        """On an existing cluster (`--address`), the harness's actors and the one sandbox host run on the
        driver's own node: its services listen on this machine's 127.0.0.1 only, so sandboxes must be here."""
        if self.ray_session.address == "local":
            return None
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)

    def heal(self, timeout_s: float = 15.0) -> list[str]:
        """Replace a ledger or host actor that died (a lent fleet outlives the wave that lost it). The ledger
        reopens its SQLite file, so leases and fences carry on. Returns what was replaced."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        from fleet.ledger import start_ledger_actor

        if self.attached:
            self._check_attached(timeout_s)
            return []
        replaced = []
        try:
            ray.get(self.ledger.ping.remote(), timeout=timeout_s)
        except (RayActorError, GetTimeoutError):
            ray.kill(self.ledger)
            self.ledger = start_ledger_actor(os.path.join(self.state_dir, results.LEDGER_DB),
                                             resources=self._pin("node-0"), strategy=self._affinity())
            ray.get(self.ledger.ping.remote(), timeout=120)
            replaced.append("ledger")
        try:
            sweeper_ok = "ledger" not in replaced and ray.get(self.sweeper.ping.remote(), timeout=timeout_s) >= 0
        except (RayActorError, GetTimeoutError):
            sweeper_ok = False
        if not sweeper_ok:  # dead, or bound to a replaced ledger
            from fleet.sweeper import start_sweep_actor

            ray.kill(self.sweeper)
            self.sweeper = start_sweep_actor(self.ledger, resources=self._pin("node-0"), strategy=self._affinity())
            ray.get(self.sweeper.ping.remote(), timeout=120)
            replaced.append("sweep actor")
        for i, (n, h) in enumerate(zip(self.node_ids, list(self.hosts))):
            if n in self.down:
                continue
            try:
                ray.get(h.ping.remote(), timeout=timeout_s)
                if "ledger" not in replaced:
                    continue
            except (RayActorError, GetTimeoutError):
                pass
            ray.kill(h)  # a host bound to a replaced ledger is replaced too
            if not self.remote:
                drop_harness_dir(self.host_info[i])
            self.hosts[i] = self._start_host(n)
            self.host_info[i] = ray.get(self.hosts[i].join_harness.remote(), timeout=120)
            replaced.append(f"host {n}")
        if replaced:
            self._tell_sweeper()
        if self.store is not None and self.store.proc is not None and self.store.proc.poll() is not None:
            self.store.stop(grace_s=0.0)  # a wave lost it: a new one (new data dir, admin key and bucket)
            self._launch_store()
            self._store_ready()
            replaced.append("store")
        return replaced

    def _check_attached(self, timeout_s: float) -> None:
        """An attached fleet is not this driver's to mend (an actor it started would die with this wave): a lost
        part is a harness error that says to start the fleet again."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        from cluster.wave.errors import HarnessError

        parts = [("lease ledger", self.ledger), ("sweep actor", self.sweeper)]
        parts += [(f"sandbox host {n}", h) for n, h in zip(self.node_ids, self.hosts)]
        for part, actor in parts:
            try:
                ray.get(actor.ping.remote(), timeout=timeout_s)
            except (RayActorError, GetTimeoutError) as exc:
                raise HarnessError(f"the fleet's {part} does not answer ({type(exc).__name__}): "
                                   "`sandfleet down`, then `sandfleet up`") from None
        if not self.store.alive():
            raise HarnessError(f"the fleet's store (pid {self.store.pid}) is gone: `sandfleet down`, then "
                               "`sandfleet up`")

    def stop(self) -> None:
        import ray

        if self.attached:  # the fleet is the daemon's: this driver only lets go of it
            if getattr(self, "joined", None) is not None:
                self.joined.unlink(missing_ok=True)
            if ray.is_initialized():
                ray.shutdown()
            self.hosts, self.ledger, self.sweeper, self.store, self.keys = [], None, None, None, None
            return

        store = None
        if self.store is not None:  # its data goes with the state dir: no grace (as a wave's own store); it stops
            store = threading.Thread(target=self.store.stop, kwargs={"grace_s": 0.0}, daemon=True)  # beside Ray
            store.start()
        if ray.is_initialized():
            live = [h for n, h in zip(self.node_ids, self.hosts) if n not in self.down]
            asked = []
            for h in live:  # every host ends its sandboxes at once, not one host after the other
                try:
                    asked.append(h.shutdown.remote(1.0))
                except Exception:  # noqa: BLE001
                    pass
            try:
                ray.wait(asked, num_returns=len(asked), timeout=30)
            except Exception:  # noqa: BLE001
                pass
            for h in live:
                ray.kill(h)
            if self.sweeper is not None:
                ray.kill(self.sweeper)
            if self.ledger is not None:
                ray.kill(self.ledger)
        self.hosts, self.ledger, self.sweeper = [], None, None
        try:
            self.ray_session.stop()
        finally:
            # a host that died could not leave its harness cgroup itself; after the session's stop, which ends a
            # host that outlived its GCS (ray.kill cannot reach it) and so its relay child, whose cgroup it shares
            for info in getattr(self, "host_info", []) if not self.remote else []:
                drop_harness_dir(info)
        if store is not None:
            store.join()
            self.store, self.keys = None, None
        if self._own_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
