"""`sandfleet serve [results/]`: every wave under a results root, on 127.0.0.1, through the standard library's HTTP
server (a port it picks and prints, or `--port`).

`/` lists the waves newest first (date, runner, faults, verdict, tasks passed, failure categories) and, per cell
(runner x workload x faults), the trend of its verdicts across waves; a cell is **flaky** when its verdict flips
between pass and fail across waves that ran on the same manifest (cluster/manifest.py: same runner code, sandbox,
machine, harness, workload). Failure categories are kept apart: runner failure (a task failed a check), harness
fault (the wave's own parts failed), not applied / not exercised, unknown. `/w/<wave>/...` serves the wave's own
files (its index.html, task pages, timeline.png), never a path outside the wave's directory.

Each wave's row comes from its `verdict.json` (written with SUMMARY.md), else from its `<task>.grade.json` files; a
damaged file is named on the row (file and line) and the rest still renders.
"""
from __future__ import annotations

import hashlib
import html
import mimetypes
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import orjson

from cluster import results
from cluster.htmlreport import CSS, _verdict

FLAKY = "flaky"


def _read(path: Path, problems: list[str]):
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError as exc:
        problems.append(f"{path.name}: damaged ({exc})")
    except OSError as exc:
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
    runner = plan.get("runner") if isinstance(plan.get("runner"), dict) else {}
    created = plan.get("created_at") if isinstance(plan.get("created_at"), (int, float)) else None
    faults = [f.get("fault_id") for t in plan.get("tasks") or [] if isinstance(t, dict)
              for f in (t.get("faults") if isinstance(t.get("faults"), list) else []) if isinstance(f, dict)]
    v = {"verdict": v.get("verdict") if isinstance(v.get("verdict"), str) else None,
         "tasks": [{"task_id": str(t.get("task_id")), "verdict": str(t.get("verdict")), "cell": str(t.get("cell")),
                    "signature": t.get("signature"), "not_exercised": bool(t.get("not_exercised"))}
                   for t in v.get("tasks") or []],
         "harness_errors": [str(x) for x in v.get("harness_errors") or [] if x]}
    return {"wave_id": str(plan.get("wave_id", d.name)), "dir": d.name, "created": created,
            "runner": runner.get("name"), "faults": [str(f) for f in dict.fromkeys(faults)],
            "verdict": v.get("verdict"), "tasks": v.get("tasks", []), "harness_errors": v.get("harness_errors", []),
            "manifest_key": hashlib.sha256(orjson.dumps(man, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]
            if man else None, "problems": problems}


def summary_of(g: dict) -> dict:
    """What the index keeps of a task's grade."""
    faults = [f if t == "time" else f"{f}@{t}" for f, t in zip(g.get("faults") or [],
                                                             g.get("triggers") or ["time"] * 99)]
    return {"task_id": g.get("task_id"), "verdict": g.get("verdict"), "signature": g.get("signature"),
            "cell": f"{g.get('runner')} × {g.get('workload') or '?'} × {'+'.join(faults) or 'none'}",
            "not_exercised": any(c.get("verdict") == "not_applied" and "exercis" in str(c.get("detail", ""))
                                 for c in (g.get("checks") or {}).values())}


def collect(root: Path) -> list[dict]:
    rows = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        try:
            r = wave_row(d)
        except Exception as exc:  # noqa: BLE001 - one damaged wave is named on its row, the rest renders
            r = {"wave_id": d.name, "dir": d.name, "created": None, "runner": None, "faults": [], "verdict": None,
                 "tasks": [], "harness_errors": [], "manifest_key": None,
                 "problems": [f"damaged ({type(exc).__name__}: {str(exc)[:200]})"]}
        if r is not None:
            rows.append(r)
    rows.sort(key=lambda r: (r["created"] or 0, r["wave_id"]), reverse=True)
    return rows


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


def index_html(root: Path, rows: list[dict]) -> str:
    e = html.escape
    body = [f"<h1>Waves under <code>{e(str(root))}</code></h1>",
            f"<p>{len(rows)} wave(s). A cell is <b>flaky</b> when its verdict flips between pass and fail across waves "
            "on the same manifest.</p>", "<h2>Waves</h2><table><tr><th>date</th><th>wave</th><th>runner</th>"
            "<th>faults</th><th>verdict</th><th>tasks passed</th><th>runner failures</th><th>harness faults</th>"
            "<th>not applied / not exercised</th><th>unknown</th><th>notes</th></tr>"]
    for r in rows:
        c = categories(r)
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["created"])) if r["created"] else "?"
        passed = sum(1 for t in r["tasks"] if t["verdict"] == "pass")
        link = f"/w/{e(r['dir'])}/{results.INDEX_HTML}"
        body.append(f"<tr><td>{when}</td><td><a href='{link}'>{e(r['wave_id'])}</a></td><td>{e(str(r['runner']))}"
                    f"</td><td>{e('+'.join(r['faults']) or 'none')}</td><td>{_verdict(r['verdict'] or '?')}</td>"
                    f"<td>{passed}/{len(r['tasks'])}</td><td>{c['runner failure']}</td><td>{c['harness fault']}</td>"
                    f"<td>{c['not applied / not exercised']}</td><td>{c['unknown']}</td>"
                    f"<td>{e('; '.join(r['problems'] + r['harness_errors'])[:300])}</td></tr>")
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


def make_server(root: Path, port: int = 0) -> ThreadingHTTPServer:
    root = root.resolve()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet: the CLI prints the address, not every request
            pass

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            path = unquote(self.path.split("?", 1)[0])
            if path in ("/", "/index.html"):
                return self._send(200, index_html(root, collect(root)).encode(), "text/html; charset=utf-8")
            if path.startswith("/w/") and "\0" not in path:
                wave, _, rest = path[3:].partition("/")
                d = (root / wave).resolve()
                f = (d / (rest or results.INDEX_HTML)).resolve()
                if d.parent == root and (d / results.PLAN).is_file() and f.is_relative_to(d) and f.is_file():
                    ctype = mimetypes.guess_type(f.name)[0] or "application/octet-stream"
                    return self._send(200, f.read_bytes(), ctype + ("; charset=utf-8" if ctype.startswith("text")
                                                                   else ""))
            return self._send(404, b"not found\n", "text/plain")

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def serve(root: Path, port: int, announce) -> None:
    srv = make_server(root, port)
    announce(f"http://127.0.0.1:{srv.server_address[1]}/")
    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        srv.server_close()

