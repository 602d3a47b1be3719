"""The proxy's unit tests' socket harness: a real FaultProxy (storage/proxy) on 127.0.0.1 in front of a tiny
upstream that records every byte it gets and answers each read with an empty 200, all in this process."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import orjson

from storage import proxy as px


async def to_eof(r: asyncio.StreamReader) -> bytes:
    """The whole answer: the proxy closes a refused connection."""
    return await asyncio.wait_for(r.read(), 10)


async def head_then_eof_if_closed(r: asyncio.StreamReader) -> bytes:
    """The answer's head, and the rest to EOF when it says `Connection: close` (a refusal)."""
    answer = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
    if b"Connection: close" in answer:  # to EOF: the proxy closes a refused connection
        answer += await asyncio.wait_for(r.read(), 10)
    return answer


async def through_proxy(tmp_path, sends: list[bytes], quota=None,
                        prepare: Callable[[px.FaultProxy], None] | None = None,
                        read: Callable[[asyncio.StreamReader], Awaitable[bytes]] = to_eof,
                        ) -> tuple[list[bytes], list[bytes], list[dict]]:
    """Each of `sends` on its own connection to a real FaultProxy (with `quota`, a storage.quota.Quota, and made
    ready by `prepare`); each answer as `read` reads it. (answers, bytes the upstream got, log)."""
    got: list[bytes] = []

    async def upstream(r, w):
        while True:
            data = await r.read(65536)
            if not data:
                break
            got.append(data)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await w.drain()
        w.close()

    up = await asyncio.start_server(upstream, "127.0.0.1", 0)
    proxy = px.FaultProxy("127.0.0.1", up.sockets[0].getsockname()[1], str(tmp_path / "log.jsonl"), quota)
    if prepare is not None:
        prepare(proxy)
    front = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    answers = []
    for data in sends:
        r, w = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
        w.write(data)
        await w.drain()
        answers.append(await read(r))
        w.close()
    front.close()
    up.close()
    proxy.flush_log()
    log = [orjson.loads(x) for x in (tmp_path / "log.jsonl").read_bytes().splitlines()]
    return answers, got, log
