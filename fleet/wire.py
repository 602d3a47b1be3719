"""What a sandbox's relay (fleet/netns.py) and the head's gate (fleet/gateway.py) share, below both: the gate's
opening line, `SFGW1 <relay token> <service>\\n`, and the loop that copies one direction of a relayed connection
(half close passed on). Neither imports the other."""
from __future__ import annotations

import asyncio

MAGIC = b"SFGW1"
CHUNK = 256 * 1024


def preface(token: str, service: str) -> bytes:
    """The line a relayed connection opens with on its way to the head's gate."""
    return b"%s %s %s\n" % (MAGIC, token.encode(), service.encode())


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Copy until the reader's EOF, passed on as a half close (True); False on an error of either end."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError, RuntimeError):
        return False
    return True
