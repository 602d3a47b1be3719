"""The docker engine as the harness reaches it: which engine, a client with a timeout, the wave's containers.

Small and free of the sandbox backend, so the backend (fleet/docker_backend.py), the base image's builder
(fleet/dockerimage.py), the sweeps and the reaper import it without importing each other.
"""
from __future__ import annotations

import os

# what a sweep says when it could not list containers (the grader turns a leak check unknown on it)
LISTING_ERROR = "docker engine:"
LABEL = "sandfleet.wave"


def engine_url() -> str:
    """The engine the docker backend talks to: `$DOCKER_HOST` (as for the docker CLI), else the local socket."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def engine_env() -> dict:
    """What a harness actor (a Ray worker, which does not inherit the driver's environment) needs to reach the
    same engine as the driver."""
    return {"DOCKER_HOST": os.environ["DOCKER_HOST"]} if os.environ.get("DOCKER_HOST") else {}


_CLIENTS: dict[tuple, object] = {}


def docker_client(timeout: float):
    """A client of the engine with this timeout, made once per engine, timeout, process and thread and then reused:
    a new client asks the engine its version first, so one per call (the sweep lists containers every second) cost
    the engine 1.6 ms of CPU per listing against 0.1 ms reused, and the caller 1.1 ms more. Its connections are
    opened again as needed, so a lost and restarted engine is seen as before; one per thread, as a client's session
    is not made to be shared between threads."""
    import threading

    import docker

    key = (engine_url(), timeout, os.getpid(), threading.get_ident())
    client = _CLIENTS.get(key)
    if client is None:
        if len(_CLIENTS) >= 64:  # (threads come and go: a bound, not a leak)
            _CLIENTS.clear()
        client = _CLIENTS[key] = docker.DockerClient(base_url=engine_url(), timeout=timeout)
    return client


def engine_answered(exc: BaseException) -> bool:
    """Did the engine answer (an API error: the container is gone, a conflict) rather than not answer at all?"""
    import docker

    return isinstance(exc, docker.errors.APIError)


def list_containers(wave_id: str | None = None, errors: list | None = None) -> list[dict] | None:
    """Containers carrying a wave's label: [{id, name, wave, sandbox, running}]; None when no engine answers
    (a machine without docker has no docker sandboxes). When an engine's socket is there but the engine does not
    answer, `errors` gets a line saying containers were not listed."""
    url = engine_url()
    if url.startswith("unix://") and not os.path.exists(url[len("unix://"):]):
        return None
    try:
        flt = {"label": f"{LABEL}={wave_id}" if wave_id else LABEL}
        # one listing call (the high-level list inspects each container after it, and a container removed between
        # the two made the whole listing fail)
        rows = docker_client(5).api.containers(all=True, filters=flt)
        return [{"id": x["Id"], "name": (x.get("Names") or ["/"])[0].lstrip("/"),
                 "wave": (x.get("Labels") or {}).get(LABEL),
                 "sandbox": (x.get("Labels") or {}).get("sandfleet.sandbox"),
                 "running": x.get("State") in ("running", "paused")} for x in rows]
    except Exception as exc:  # noqa: BLE001
        if errors is not None:
            errors.append(f"{LISTING_ERROR} containers at {url} were not listed ({type(exc).__name__}: "
                          f"{str(exc)[:120]})")
        return None


def remove_container(cid: str) -> bool:
    try:
        docker_client(30).containers.get(cid).remove(force=True)
        return True
    except Exception:  # noqa: BLE001
        return False
