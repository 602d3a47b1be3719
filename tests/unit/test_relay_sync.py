"""The proxy's side of its relay's control socket (storage/relay.py), with the test as the relay."""
from __future__ import annotations

import asyncio
import socket
import threading

from storage.relay import Relay


def test_a_sync_that_waited_sends_the_route_of_when_it_sends_not_of_when_it_was_asked():
    """A control call (`/stats`) that queued behind a rule's opening must not tell the relay the route from
    before the rule: the relay would relay the rule's requests directly (a review saw such a request escape)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sent: list[bytes] = []

    def relay():  # answers each mode packet as the relay does
        while (msg := theirs.recv(1 << 16)):
            sent.append(msg)
            theirs.send(b"A%d" % len(sent))

    th = threading.Thread(target=relay, daemon=True)
    th.start()
    rules = {"route": b"0"}

    async def main():
        r = Relay("unused", ("127.0.0.1", 1), None)
        r.sock = ours
        ours.setblocking(False)
        r.attach(lambda fd, data: None)
        first = asyncio.ensure_future(r.sync(lambda: rules["route"]))
        queued = asyncio.ensure_future(r.sync(lambda: rules["route"]))  # waits for the socket behind `first`
        await asyncio.sleep(0)
        rules["route"] = b"Sb/w1/t1"  # a rule went in meanwhile
        assert await first == 1 and await queued == 2
        assert r.route == b"Sb/w1/t1" and r.relayed == 2
        asyncio.get_running_loop().remove_reader(ours.fileno())

    try:
        asyncio.run(main())
    finally:
        ours.close()
        th.join(5)
        theirs.close()
    assert sent == [b"M0", b"MSb/w1/t1"]
