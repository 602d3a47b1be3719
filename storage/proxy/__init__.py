"""S3 fault proxy: a head-only HTTP/1.1 relay on 127.0.0.1 in front of the store.

Request and response bodies are streamed in bounded chunks in both directions
(never buffered whole), the request head is forwarded byte for byte (Host
unchanged, so SigV4 signatures stay valid), and the upstream's 1xx answers are
relayed (botocore sends `Expect: 100-continue` on PUT). Every request is
recorded as one JSON line. Fault windows are *rules* opened and closed through a
small JSON control API on a second port; a rule matches requests by method,
bucket, key prefix and part number, and applies its action: one `Action` class each
(`error`, `cut_body`, `reset`, `hold`, `delay`, `lag`, `boundary`), registered in `ACTIONS`;
a new one is a class, not a branch of the relay.

Run as `python -m storage.proxy --upstream 127.0.0.1:PORT --log FILE`; it prints
one line `READY <port> <control_port>` when both listeners are up. Where the
compiled relay is installed (`relay/`, storage/relay.py) the relay owns the port:
it relays plain requests itself while no rule is open, logging them as this
proxy would, and hands every other connection's socket here.

Rooms:
- `http`: a request head, its framing checks (no request smuggling), bodies (and their `TokenBucket` cap), the
  signing key id.
- `rules`: `S3Request`, `Rule`, `RuleSet`, the `Action` classes (`ACTIONS`) and their S3 error bodies.
- `relay`: `Relaying`, one request to the store and back (`_relay`), and the actions on the store's connection.
- `handler`: `FaultProxy`, the connection handler, request log, control API and the compiled front's hand-overs.
- `process`: `main` (`python -m storage.proxy`, `__main__`), `ProxyProcess`, `ProxyControl`.
"""
from storage.proxy.handler import FaultProxy
from storage.proxy.http import BadFraming, Head, TokenBucket, access_key_id, copy_body, framing_problem, read_head
from storage.proxy.process import ProxyControl, ProxyProcess, main
from storage.proxy.rules import (ACTIONS, CLOSE, HEALTH_PATH, NEXT, Action, Hit, Rule, RuleSet, S3Request, Shaping,
                                 bad_request, error_response)

__all__ = ["ACTIONS", "CLOSE", "HEALTH_PATH", "NEXT", "Action", "BadFraming", "FaultProxy", "Head", "Hit",
           "ProxyControl", "ProxyProcess", "Rule", "RuleSet", "S3Request", "Shaping", "TokenBucket", "access_key_id",
           "bad_request", "copy_body", "error_response", "framing_problem", "main", "read_head"]
