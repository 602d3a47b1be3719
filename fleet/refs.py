"""Ray's answers as asyncio futures, for the hosts, the sweep actor and the wave (below all of them)."""
from __future__ import annotations

import asyncio


def awaitable(ref):
    """A Ray ObjectRef as a plain asyncio future (cancelled at once by wait_for); anything else as is. An error
    that reaches it after its waiter gave up (a wave stopped; an actor that died later) is never printed as "Future
    exception was never retrieved": whoever awaits it still gets the error."""
    if not hasattr(ref, "future"):
        return ref
    fut = asyncio.wrap_future(ref.future())
    fut.add_done_callback(_retrieved)
    return fut


def _retrieved(fut) -> None:
    if not fut.cancelled():
        fut.exception()
