"""`sandfleet serve [results/]`: every wave under a results root, on 127.0.0.1, through the standard library's HTTP
server (a port it picks and prints, or `--port`).

`/` lists the waves newest first (date, runner, faults, verdict, tasks passed, failure categories) and, per cell
(runner x workload x faults), the trend of its verdicts across waves; a cell is **flaky** when its verdict flips
between pass and fail across waves that ran on the same manifest (cluster/manifest.py: same runner code, sandbox,
machine, harness, workload). Failure categories are kept apart: runner failure (a task failed a check), harness
fault (the wave's own parts failed), not applied / not exercised, unknown. `/w/<wave>/...` serves the wave's own
files (its index.html, task pages, timeline.png), never a path outside the wave's directory; a task page a large
wave's report left out (cluster/htmlreport.py) is rendered from the wave's files when asked (`page_on_demand`).

Each wave's row comes from its `verdict.json` (written with SUMMARY.md), else from its `<task>.grade.json` files; a
damaged file is named on the row (file and line) and the rest still renders. Each wave's seal is checked when its top
level changes, else once a minute (quick: the signature, the folder's name, each file's kind and size, the top
level's small files hashed; `sandfleet verify` hashes every file): a wave that fails its seal is listed as `fails
its seal`, naming what changed, its tasks left out of the trends; one with no seal is noted so.

Safe to look at: only the generated pages (a wave's `index.html` and `pages/*.html`, cluster/htmlreport.py) go out as
HTML, under a CSP that runs only our own inline scripts (by hash). Everything else in a wave's directory (artifacts,
runner logs, evidence, anything a runner could have shaped) goes out as `text/plain`, or as an attachment when it is
binary, under `default-src 'none'; sandbox`; every answer says `X-Content-Type-Options: nosniff`.
Safe to host: a real listen backlog, an idle timeout per connection, a cap on connections (at the cap the oldest
connection that has not sent its request yet is dropped; with none idle the new one gets a 503), files streamed
with sendfile, never read whole.
"""
from __future__ import annotations

import hashlib
import math
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote

import orjson

from cluster import results
from cluster.htmlreport import CSS, badge, esc, page_csp, page_on_demand
from cluster.seal import state as seal_state

FLAKY = "flaky"
IDLE_S = 10.0  # a connection that sends (or takes) nothing for this long is closed
MAX_CONNECTIONS = 128  # connections served at once; more wait in the backlog or push out an idle one
BACKLOG = 1024  # the listen backlog (the standard library's default is 5)
SNIFF = 8192  # bytes looked at to tell a text file from a binary one
NO_SCRIPT_CSP = "default-src 'none'; sandbox"  # anything that is not one of our pages
INDEX_CSP = ("default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
             "frame-ancestors 'none'")  # the root listing: ours, no script at all


def _read(path: Path, problems: list[str]):
    try:
        return orjson.loads(results.regular_bytes(path))  # a FIFO there would hang the whole index
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError as exc:
        problems.append(f"{path.name}: damaged ({exc})")
    except (OSError, ValueError) as exc:
        problems.append(f"{path.name}: unreadable ({exc})")
    return None


def wave_row(d: Path) -> dict | None:
    """One wave's row, or None when `d` is not a wave's directory (no plan.json)."""
    if not (d / results.PLAN).is_file():
        return None
    problems: list[str] = []
    plan = _read(d / results.PLAN, problems)
    plan = {} if plan is None and problems else plan
    if not isinstance(plan, dict) or not isinstance(plan.get("tasks", []), list):
        problems.append(f"{results.PLAN}: damaged (not a wave's plan: {type(plan).__name__})")
        plan = {}
    v = _read(d / results.VERDICT, problems)
    if v is not None and not (isinstance(v, dict) and isinstance(v.get("tasks"), list)
                              and all(isinstance(t, dict) for t in v["tasks"])):
        problems.append(f"{results.VERDICT}: damaged (not a wave's verdict)")
        v = None
    if v is None:  # a wave from before verdict.json (or a damaged one): its grade files
        tasks = []
        for f in sorted(d.glob("*" + results.GRADE_SUFFIX)):
            if f.name.startswith("ref-"):
                continue
            g = _read(f, problems)
            if isinstance(g, dict):
                tasks.append(summary_of(g))
            elif g is not None:
                problems.append(f"{f.name}: damaged (not a task's grade)")
        v = {"verdict": None, "tasks": tasks, "harness_errors": []}
    man = plan.get("manifest")
    try:
        man_key = hashlib.sha256(orjson.dumps(man, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12] if man else None
    except (orjson.JSONEncodeError, TypeError):  # nested deeper than orjson writes
        man_key = None
        problems.append(f"{results.PLAN}: damaged (manifest nested too deep)")
    runner = plan.get("runner") if isinstance(plan.get("runner"), dict) else {}
    created = _when(plan.get("created_at"))
    if created is None and plan.get("created_at") is not None:
        problems.append(f"{results.PLAN}: damaged (created_at {str(plan.get('created_at'))[:40]!r} is not a time)")
    faults = [f.get("fault_id") for t in plan.get("tasks") or [] if isinstance(t, dict)
              for f in (t.get("faults") if isinstance(t.get("faults"), list) else []) if isinstance(f, dict)]
    v = {"verdict": v.get("verdict") if isinstance(v.get("verdict"), str) else None,
         "tasks": [{"task_id": str(t.get("task_id")), "verdict": str(t.get("verdict")), "cell": str(t.get("cell")),
                    "signature": t.get("signature"), "not_exercised": bool(t.get("not_exercised"))}
                   for t in v.get("tasks") or []],
         "harness_errors": [str(x) for x in v.get("harness_errors") or [] if x]}
    fails, seal_note = _seal_state(d) or (False, None)
    if fails:  # not the folder its seal names: its verdict is not shown as the wave's, nor its tasks trended
        problems.append(seal_note)
        v = {"verdict": "fails its seal", "tasks": [], "harness_errors": v["harness_errors"]}
    return {"wave_id": str(plan.get("wave_id", d.name)), "dir": d.name, "created": created,
            "runner": runner.get("name"), "faults": [str(f) for f in dict.fromkeys(faults)],
            "verdict": v.get("verdict"), "tasks": v.get("tasks", []), "harness_errors": v.get("harness_errors", []),
            "manifest_key": man_key, "problems": problems, "unsealed": None if fails else seal_note}


SEAL_TTL_S = 60.0  # a wave's seal state is checked again after this, or at once when its top level changes
_SEALS: dict[str, tuple[float, tuple, tuple[bool, str] | None]] = {}


def _seal_state(d: Path) -> tuple[bool, str] | None:
    """`seal.state` of a wave, remembered: the quick check walks every file (about 1 ms per 70 files), so it is
    redone only when the wave's top level changed (its records, grades and seal all sit there: any entry's size,
    mtime, inode or kind) or after SEAL_TTL_S (a change deeper down, in artifacts or logs, shows by then)."""
    try:
        top = tuple(sorted((e.name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
                           for e in os.scandir(d) for st in (e.stat(follow_symlinks=False),)))
    except OSError:
        top = None
    now = time.monotonic()
    hit = _SEALS.get(str(d))
    if top is not None and hit is not None and hit[1] == top and now - hit[0] < SEAL_TTL_S:
        return hit[2]
    got = seal_state(d)
    if top is not None:
        if len(_SEALS) > 10_000:  # bounded: a root of more waves than this re-checks the rest
            _SEALS.clear()
        _SEALS[str(d)] = (now, top, got)
    return got


def _when(x) -> float | None:
    """A wave's `created_at` when it is a time gmtime can show (a plan's `1e20` once took the whole index down)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    try:
        time.gmtime(x)
    except (OverflowError, OSError, ValueError):
        return None
    return float(x)


def summary_of(g: dict) -> dict:
    """What the index keeps of a task's grade (fields of the wrong shape count as absent)."""
    def listed(k):
        return g.get(k) if isinstance(g.get(k), list) else []

    faults = [str(f) if t == "time" else f"{f}@{t}" for f, t in zip(listed("faults"),
                                                                  listed("triggers") or ["time"] * 99)]
    checks = g.get("checks") if isinstance(g.get("checks"), dict) else {}
    return {"task_id": g.get("task_id"), "verdict": g.get("verdict"), "signature": g.get("signature"),
            "cell": f"{g.get('runner')} × {g.get('workload') or '?'} × {'+'.join(faults) or 'none'}",
            "not_exercised": any(isinstance(c, dict) and c.get("verdict") == "not_applied"
                                 and "exercis" in str(c.get("detail", "")) for c in checks.values())}


def collect(root: Path) -> list[dict]:
    rows = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        try:
            r = wave_row(d)
        except Exception as exc:  # noqa: BLE001 - one damaged wave is named on its row, the rest renders
            r = _damaged_row(d.name, exc)
        if r is not None:
            rows.append(r)
    rows.sort(key=lambda r: (r["created"] or 0, r["wave_id"]), reverse=True)
    return rows


def _damaged_row(name: str, exc: Exception) -> dict:
    return {"wave_id": name, "dir": name, "created": None, "runner": None, "faults": [], "verdict": None,
            "tasks": [], "harness_errors": [], "manifest_key": None,
            "problems": [f"damaged ({type(exc).__name__}: {str(exc)[:200]})"]}


def categories(row: dict) -> dict:
    c = {"runner failure": 0, "harness fault": len(row["harness_errors"]), "not applied / not exercised": 0,
         "unknown": 0}
    for t in row["tasks"]:
        if t["verdict"] == "fail":
            c["runner failure"] += 1
        elif t["verdict"] == "not_applied" or t.get("not_exercised"):
            c["not applied / not exercised"] += 1
        elif t["verdict"] == "unknown":
            c["unknown"] += 1
    return c


def cell_trends(rows: list[dict]) -> dict[str, dict]:
    """Per cell, oldest first: (wave, verdict of the cell in it, manifest key); `flaky` when pass and fail both
    occur for one manifest key."""
    out: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: (r["created"] or 0, r["wave_id"])):
        per: dict[str, list[str]] = {}
        for t in r["tasks"]:
            per.setdefault(t["cell"], []).append(t["verdict"])
        for cell, vs in per.items():
            v = "fail" if "fail" in vs else "unknown" if "unknown" in vs else \
                "not_applied" if "not_applied" in vs else "pass"
            out.setdefault(cell, {"history": [], FLAKY: False})["history"].append((r["wave_id"], v, r["manifest_key"]))
    for cell in out.values():
        by_man: dict = {}
        for _, v, key in cell["history"]:
            by_man.setdefault(key, set()).add(v)
        cell[FLAKY] = any(key is not None and {"pass", "fail"} <= vs for key, vs in by_man.items())
    return out


def _index_row(r: dict) -> str:
    e = esc
    c = categories(r)
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["created"])) if _when(r["created"]) is not None else "?"
    passed = sum(1 for t in r["tasks"] if t["verdict"] == "pass")
    link = f"/w/{e(quote(r['dir']))}/{results.INDEX_HTML}"
    return (f"<tr><td>{when}</td><td><a href='{link}'>{e(r['wave_id'])}</a></td><td>{e(str(r['runner']))}"
            f"</td><td>{e('+'.join(r['faults']) or 'none')}</td><td>{badge(r['verdict'] or '?')}</td>"
            f"<td>{passed}/{len(r['tasks'])}</td><td>{c['runner failure']}</td><td>{c['harness fault']}</td>"
            f"<td>{c['not applied / not exercised']}</td><td>{c['unknown']}</td>"
            f"<td>{e('; '.join(r['problems'] + r['harness_errors'] + [r.get('unsealed') or ''])[:300])}</td></tr>")


def index_html(root: Path, rows: list[dict]) -> str:
    e = esc
    body = [f"<h1>Waves under <code>{e(str(root))}</code></h1>",
            f"<p>{len(rows)} wave(s). A cell is <b>flaky</b> when its verdict flips between pass and fail across waves "
            "on the same manifest.</p>", "<h2>Waves</h2><table><tr><th>date</th><th>wave</th><th>runner</th>"
            "<th>faults</th><th>verdict</th><th>tasks passed</th><th>runner failures</th><th>harness faults</th>"
            "<th>not applied / not exercised</th><th>unknown</th><th>notes</th></tr>"]
    for r in rows:
        try:
            body.append(_index_row(r))
        except Exception as exc:  # noqa: BLE001 - a row that cannot render is named; the index still renders
            body.append(_index_row(_damaged_row(str(r.get("dir")), exc)))
    body.append("</table><h2>Cells across waves</h2><table><tr><th>cell</th><th>waves</th><th>trend (oldest "
                "first)</th><th></th></tr>")
    for cell, t in sorted(cell_trends(rows).items()):
        trend = " ".join(f"<span class='{e(v)}' title='{e(w)}'>{'●' if v == 'pass' else '✖' if v == 'fail' else '◌'}"
                         "</span>" for w, v, _ in t["history"])
        body.append(f"<tr><td>{e(cell)}</td><td>{len(t['history'])}</td><td>{trend}</td>"
                    f"<td>{'<b class=unknown>flaky</b>' if t[FLAKY] else ''}</td></tr>")
    body.append("</table>")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>sandfleet waves</title><style>{CSS}</style>"
            f"</head><body>{''.join(body)}</body></html>")


def generated_page(rel: Path) -> bool:
    """One of the pages cluster/htmlreport.py writes into a wave's directory (its index, its task pages): the only
    files served as HTML. A runner's files live under artifacts/, evidence/ and sandboxes/, never at these paths."""
    parts = rel.parts
    return (parts == (results.INDEX_HTML,)
            or (len(parts) == 2 and parts[0] == results.PAGES and parts[1].endswith(".html")))


def _is_text(head: bytes) -> bool:
    return b"\0" not in head


class _Server(ThreadingHTTPServer):
    """The standard library's threading server with bounds: a listen backlog of BACKLOG, at most
    `max_connections` connections at once (at the cap, the oldest connection still waiting for its request is
    dropped for the new one; when every one is being answered, the new one gets a 503)."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, addr, handler, max_connections: int = MAX_CONNECTIONS):
        self.max_connections = max_connections
        self._conns: dict = {}  # connection -> answering (True once its request line and headers are in)
        self._lock = threading.Lock()
        self.dropped_idle = self.refused = 0
        super().__init__(addr, handler)

    def process_request(self, request, client_address):
        with self._lock:
            if len(self._conns) >= self.max_connections:
                idle = next((c for c, answering in self._conns.items() if not answering), None)  # oldest first
                if idle is None:
                    self.refused += 1
                    self._refuse(request)
                    return
                del self._conns[idle]
                self.dropped_idle += 1
                try:
                    idle.shutdown(socket.SHUT_RDWR)  # its thread's read ends at once; that thread closes it
                except OSError:
                    pass
            self._conns[request] = False
        super().process_request(request, client_address)

    def _refuse(self, request) -> None:
        try:
            request.settimeout(0.2)
            request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                            b"X-Content-Type-Options: nosniff\r\nRetry-After: 1\r\nContent-Length: 5\r\n\r\nbusy\n")
        except OSError:
            pass
        self.shutdown_request(request)

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client that left: not an error
            super().handle_error(request, client_address)

    def answering(self, request) -> None:
        with self._lock:
            if request in self._conns:
                self._conns[request] = True

    def shutdown_request(self, request):
        with self._lock:
            self._conns.pop(request, None)
        super().shutdown_request(request)

    def open_connections(self) -> int:
        with self._lock:
            return len(self._conns)


def make_server(root: Path, port: int = 0, max_connections: int = MAX_CONNECTIONS,
                idle_s: float = IDLE_S) -> _Server:
    root = root.resolve()

    class Handler(BaseHTTPRequestHandler):
        timeout = idle_s  # StreamRequestHandler sets it on the socket: every read and write waits at most this

        def log_message(self, *a):  # quiet: the CLI prints the address, not every request
            pass

        def parse_request(self) -> bool:
            ok = super().parse_request()
            if ok:
                self.server.answering(self.connection)
            return ok

        def end_headers(self):
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            super().end_headers()

        def _send(self, status: int, body: bytes, ctype: str, csp: str = NO_SCRIPT_CSP) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", csp)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _send_file(self, f: Path, rel: Path) -> None:
            with open(f, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                head = fh.read(SNIFF)
                fh.seek(0)
                self.send_response(200)
                if generated_page(rel):
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Security-Policy", page_csp())
                else:  # anything else may hold what a runner wrote: never active
                    if len(rel.parts) == 1 and rel.suffix == ".png":  # timeline.png and the report's screenshots
                        self.send_header("Content-Type", "image/png")
                    elif _is_text(head):
                        self.send_header("Content-Type", "text/plain; charset=utf-8")
                    else:
                        self.send_header("Content-Type", "application/octet-stream")
                        self.send_header("Content-Disposition", f"attachment; filename*=UTF-8''{quote(f.name)}")
                    self.send_header("Content-Security-Policy", NO_SCRIPT_CSP)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                if self.command != "HEAD" and size:
                    self.connection.sendfile(fh, 0, size)  # streamed by the kernel, bounded by the socket timeout

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            path = unquote(self.path.split("?", 1)[0])
            if path in ("/", "/index.html"):
                return self._send(200, index_html(root, collect(root)).encode(), "text/html; charset=utf-8",
                                  INDEX_CSP)
            if path.startswith("/w/") and "\0" not in path:
                wave, _, rest = path[3:].partition("/")
                d = (root / wave).resolve()
                f = (d / (rest or results.INDEX_HTML)).resolve()
                if d.parent == root and (d / results.PLAN).is_file() and f.is_relative_to(d) and f.is_file():
                    try:
                        return self._send_file(f, f.relative_to(d))
                    except (TimeoutError, ConnectionError):  # a client that stopped reading: dropped
                        self.close_connection = True
                        return None
                if (d.parent == root and (d / results.PLAN).is_file() and f.parent == d / results.PAGES
                        and f.suffix == ".html" and not os.path.lexists(f)):
                    page = page_on_demand(d, f.stem)  # a large wave's report left this task's page out
                    if page is not None:
                        return self._send(200, page.encode(), "text/html; charset=utf-8", page_csp())
            return self._send(404, b"not found\n", "text/plain; charset=utf-8")

    return _Server(("127.0.0.1", port), Handler, max_connections)


def serve(root: Path, port: int, announce) -> None:
    srv = make_server(root, port)
    announce(f"http://127.0.0.1:{srv.server_address[1]}/")
    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        srv.server_close()

