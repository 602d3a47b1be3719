"""The wave report as HTML, rendered only from the stored files and the wave's result: `index.html` (the verdict,
the wave's checks, an interactive timeline with one lane per task grouped by node, the fault x outcome matrix, the
tasks table filterable by verdict, fault and check) and one page per task under `pages/` (its attempts and why each
ended, its faults' receipts, every check with its reason, the redacted log tails, the replay command).

A wave of more than `FULL_REPORT_TASKS` tasks (issue 45: 10,000 of them) keeps its report small: only the tasks that
did not pass get a lane (at most `LANES_MAX`) and a page (at most `PAGE_BYTES_MAX` of them), the worst first; the
index counts every task and verdict, says how many have no lane or page and where their files are, and its tasks
table still has a row per task.

Self-contained: inline CSS, SVG and a few lines of JS; no network. Everything a runner could have written (its
log, a check's detail quoting it) is escaped, and each page carries a CSP that runs only our own scripts (by hash).
"""
from __future__ import annotations

import base64
import hashlib
import html
import os
import re
from collections import Counter, defaultdict
from pathlib import Path


from cluster import results
from cluster.receipts import checked_receipts, read_receipts
from cluster.grade.verdicts import FAIL, NOT_APPLIED, PASS, UNKNOWN

VERDICTS = (PASS, FAIL, UNKNOWN, NOT_APPLIED)
COLOR = {PASS: "#2e7d32", FAIL: "#c62828", UNKNOWN: "#ef6c00", NOT_APPLIED: "#757575"}
CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}
.v{font-weight:bold}.pass{color:#2e7d32}.fail{color:#c62828}.unknown{color:#ef6c00}.not_applied{color:#757575}
pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:320px}code{background:#f3f3f3;padding:1px 4px}
svg text{font:11px system-ui,sans-serif}"""
LANE, LEFT, WIDTH = 18, 150, 900
FULL_REPORT_TASKS = 1000  # up to this many tasks, every task has its lane and its page
LANES_MAX = 1000  # above FULL_REPORT_TASKS: at most this many lanes (~0.5 KiB each), of tasks that did not pass
PAGE_BYTES_MAX = 6 * 2**20  # above FULL_REPORT_TASKS: the pages of tasks that did not pass, worst first, up to this
TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a task id `page_on_demand` looks up, nothing else
RANK = {FAIL: 0, UNKNOWN: 1, NOT_APPLIED: 2}  # the order lanes are kept in past the cap (no grade: as unknown)


def esc(x) -> str:
    """HTML-escaped, and every control or format character (ESC, BEL, a bidi override: a results folder's name, a
    runner's text) shown as `\\x1b`, never raw (`results.terminal_safe`)."""
    from cluster.results import terminal_safe

    return html.escape(terminal_safe(str(x)), quote=True)


def script_hashes() -> list[str]:
    """The CSP sources of every inline script a generated page may carry (`'sha256-...'`): a script that is not
    one of ours (one a runner's text smuggled into a page) matches none of them and never runs."""
    return [f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in SCRIPTS]


def page_csp(meta: bool = False) -> str:
    """The Content-Security-Policy of a generated page: its own CSS and pictures, only our inline scripts, nothing
    fetched, framed or posted. `meta`: the subset a `<meta>` tag may carry (no frame-ancestors)."""
    csp = (f"default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
           f"script-src {' '.join(script_hashes())}; base-uri 'none'; form-action 'none'")
    return csp if meta else csp + "; frame-ancestors 'none'"


def _page(title: str, body: str, script: str = "") -> str:
    assert not script or script in SCRIPTS, "an inline script must be listed in SCRIPTS (its hash is in the CSP)"
    return (f"<!doctype html><html><head><meta charset=utf-8><meta http-equiv=Content-Security-Policy "
            f"content=\"{page_csp(meta=True)}\"><title>{esc(title)}</title><style>{CSS}</style></head>"
            f"<body>{body}{f'<script>{script}</script>' if script else ''}</body></html>")


def badge(v: str) -> str:
    """A verdict as the pages show it: its word, coloured by its class (the CSS above)."""
    return f"<span class='v {esc(v)}'>{esc(v)}</span>"


def timeline_svg(events: list[dict], only: set[str] | None = None) -> str:
    """One lane per task, grouped by the node its first attempt ran on: attempts as bars (green: exit 0, red:
    killed or failed), applied faults as triangles, fault windows as lines, node losses and harness faults as
    vertical lines; hovering any of them shows what it was (its <title>). `only`: the tasks that get a lane (the
    others' marks are left out too); None: every task."""
    starts = {(e["task"], e["attempt"]): e for e in events if e["event"] == "attempt_start"}
    node_of: dict[str, str] = {}
    for (tid, _), e in sorted(starts.items(), key=lambda kv: kv[1]["t"]):
        node_of.setdefault(tid, e.get("node") or "node-0")
    tasks = sorted({e["task"] for e in events if e.get("task") and (only is None or e["task"] in only)},
                   key=lambda t: (node_of.get(t, "~"), t))
    t_end = max([e["t"] for e in events] + [1.0])
    x = lambda t: LEFT + (t / t_end) * WIDTH  # noqa: E731
    row = {t: i for i, t in enumerate(tasks)}
    y = lambda tid: 24 + row[tid] * LANE  # noqa: E731
    parts = []
    for tid in tasks:
        parts.append(f"<text x=4 y={y(tid) + 12} data-lane='{esc(tid)}'>{esc(node_of.get(tid, '-'))} "
                     f"{esc(tid)}</text>")
    clears = {e.get("instance"): e["t"] for e in events if e["event"] == "fault_clear"}
    for e in events:
        if e["event"] == "attempt_end" and e.get("task") in row:
            st = starts.get((e["task"], e.get("attempt")), e)
            ok = e.get("exit_code") == 0
            what = (f"{e['task']} attempt {e.get('attempt')} on {st.get('node') or '-'}: "
                    f"{e.get('cause') or ('exit 0' if ok else 'exit ' + str(e.get('exit_code')))}")
            parts.append(f"<rect class=attempt data-task='{esc(e['task'])}' x={x(st['t']):.1f} y={y(e['task']) + 2} "
                         f"width={max(1.0, x(e['t']) - x(st['t'])):.1f} height={LANE - 6} "
                         f"fill='{'#66bb6a' if ok else '#ef5350'}'><title>{esc(what)}</title></rect>")
        elif e["event"] == "fault_inject" and e.get("task") in row:
            applied = bool(e.get("applied"))
            what = (f"{e.get('instance')} ({e.get('fault')}): {'applied' if applied else 'not applied'} "
                    f"{e.get('why') or ''}")
            px, py = x(e["t"]), y(e["task"])
            parts.append(f"<polygon class=fault data-task='{esc(e['task'])}' points='{px - 5:.1f},{py:.1f} "
                         f"{px + 5:.1f},{py:.1f} {px:.1f},{py + 8:.1f}' fill='{'#000' if applied else '#bbb'}'>"
                         f"<title>{esc(what)}</title></polygon>")
            end = clears.get(e.get("instance"))
            if applied and end is not None and end - e["t"] > 0.05:
                parts.append(f"<line class=window x1={px:.1f} x2={x(end):.1f} y1={py + LANE - 3} y2={py + LANE - 3} "
                             f"stroke='#000' stroke-width=3><title>{esc(e.get('instance'))} window "
                             f"{end - e['t']:.1f} s</title></line>")
        elif e["event"] in ("node_lost", "node_back", "harness_fault"):
            what = (f"harness fault: {e.get('part')}: {e.get('why')}" if e["event"] == "harness_fault"
                    else f"{e['event'].replace('_', ' ')}: {e.get('node')} ({e.get('fault') or ''})")
            color = "#c62828" if e["event"] == "harness_fault" else "#1565c0"
            parts.append(f"<line class='{esc(e['event'])}' x1={x(e['t']):.1f} x2={x(e['t']):.1f} y1=16 "
                         f"y2={24 + len(tasks) * LANE} stroke='{color}' stroke-dasharray='4 3'>"
                         f"<title>{esc(what)}</title></line>")
    height = 40 + len(tasks) * LANE
    axis = (f"<text x={LEFT} y=12>0 s</text><text x={LEFT + WIDTH - 40} y=12>{t_end:.1f} s</text>")
    return (f"<svg id=timeline xmlns='http://www.w3.org/2000/svg' width={LEFT + WIDTH + 10} height={height}>"
            f"{axis}{''.join(parts)}</svg>")


def _matrix(grades: list[dict]) -> str:
    cells: dict[str, Counter] = defaultdict(Counter)
    for g in grades:
        cells["+".join(g["faults"]) or "none"][g["verdict"]] += 1
    head = "".join(f"<th>{esc(v)}</th>" for v in VERDICTS)
    rows = "".join(f"<tr><td>{esc(f)}</td>" + "".join(f"<td>{c[v] or ''}</td>" for v in VERDICTS) + "</tr>"
                   for f, c in sorted(cells.items()))
    return f"<table id=matrix><tr><th>fault</th>{head}</tr>{rows}</table>"


def _tasks_table(grades: list[dict], paged: set[str] | None = None) -> str:
    """Every task, a row each, filterable, its id linked to its page; `paged`: the tasks that have a page file (None:
    every task); the others' rows say so and where their files are (`sandfleet serve` renders their pages)."""
    rows = []
    for g in grades:
        tid = g["task_id"]
        name = f"<a href='{results.PAGES}/{esc(tid)}.html'>{esc(tid)}</a>"
        if paged is not None and tid not in paged:  # (`sandfleet serve` renders its page when asked)
            name += (f" <i>no page file: {esc(tid)}{results.GRADE_SUFFIX}</i>" if g["verdict"] == PASS
                     else f" <i>no page file: {results.EVIDENCE}/{esc(tid)}/</i>")
        bad = [k for k, c in g["checks"].items() if c["verdict"] != PASS]
        faults = "+".join(g["faults"]) or "none"
        bad_txt = ", ".join(f"{k}={g['checks'][k]['verdict']}" for k in bad) or "-"
        rows.append(f"<tr data-verdict='{esc(g['verdict'])}' data-fault='{esc(faults)}' "
                    f"data-checks='{esc(' '.join(bad))}'>"
                    f"<td>{name}</td>"
                    f"<td>{esc(faults)}</td><td>{g['attempts']}</td><td>{badge(g['verdict'])}</td>"
                    f"<td>{esc(bad_txt)}</td></tr>")
    verdicts = "".join(f"<option>{esc(v)}</option>" for v in VERDICTS)
    faults = "".join(f"<option>{esc(f)}</option>" for f in sorted({'+'.join(g['faults']) or 'none' for g in grades}))
    return (f"<p>verdict <select id=fv><option value=''>any</option>{verdicts}</select> fault <select id=ff>"
            f"<option value=''>any</option>{faults}</select> check <input id=fc placeholder='e.g. no_double_apply'>"
            f"</p><table id=tasks><tr><th>task</th><th>fault</th><th>attempts</th><th>verdict</th>"
            f"<th>checks not passed</th></tr>{''.join(rows)}</table>")


FILTER_JS = """function f(){var v=document.getElementById('fv').value,g=document.getElementById('ff').value,
c=document.getElementById('fc').value.trim();document.querySelectorAll('#tasks tr[data-verdict]').forEach(function(r){
var ok=(!v||r.dataset.verdict==v)&&(!g||r.dataset.fault==g)&&(!c||r.dataset.checks.indexOf(c)>=0);
r.style.display=ok?'':'none';});}['fv','ff','fc'].forEach(function(i){document.getElementById(i).oninput=f;});"""
SCRIPTS = (FILTER_JS,)  # every inline script of a generated page: the CSP allows these by hash, nothing else


def _log_tails(d: Path, tid: str) -> str:
    """The task's evidence log tails when it has evidence (a task that did not pass), else the last lines of each
    attempt's runner.log (redacted by value at the wave's end), as the grader reads them."""
    ev = d / results.EVIDENCE / tid / results.EVIDENCE_RUNNER_LOGS
    try:  # never through a link (a linked evidence file once put the seal key in a page), never a FIFO
        return results.tail_bytes(ev, 65536).decode(errors="replace")
    except (OSError, ValueError):
        pass
    tails = results.ResultsDir(d).runner_log_tails(tid, lines=20)
    return "\n".join(f"==> attempt {n}\n{text}" for n, text in sorted(tails.items())) or "(no runner log)"


def task_page(d: Path, g: dict, events: list[dict], receipts: list[dict]) -> str:
    tid = g["task_id"]
    ends = [e for e in events if e["event"] == "attempt_end" and e.get("task") == tid]
    starts = {e.get("attempt"): e for e in events if e["event"] == "attempt_start" and e.get("task") == tid}
    attempts = "".join(f"<tr><td>{esc(e.get('attempt'))}</td>"
                       f"<td>{esc((starts.get(e.get('attempt')) or {}).get('node'))}</td>"
                       f"<td>{esc(e.get('exit_code'))}</td><td>{esc(e.get('cause') or '')}</td></tr>" for e in ends)
    faults = "".join(f"<tr><td>{esc(r['instance'])}</td><td>{badge(r['status'])}</td><td>{esc(r.get('detail'))}</td>"
                     f"</tr>" for r in receipts if r.get("task_id") == tid)
    checks = "".join(f"<tr><td>{esc(k)}</td><td>{badge(c['verdict'])}</td><td>{esc(c.get('detail'))}</td></tr>"
                     for k, c in g["checks"].items())
    replay = f"sandfleet wave replay {d}/{tid}"
    body = (f"<p><a href='../{results.INDEX_HTML}'>&larr; the wave</a></p><h1>{esc(tid)}: {badge(g['verdict'])}</h1>"
            f"<p>faults {esc('+'.join(g['faults']) or 'none')}, seed {esc(g['seed'])}, runner {esc(g['runner'])}</p>"
            f"<h2>Attempts</h2><table id=attempts><tr><th>attempt</th><th>node</th><th>exit</th><th>why it ended</th>"
            f"</tr>{attempts}</table><h2>Faults</h2><table id=receipts><tr><th>fault</th><th>receipt</th>"
            f"<th>detail</th></tr>{faults}</table><h2>Checks</h2><table id=checks><tr><th>check</th>"
            f"<th>verdict</th><th>why</th></tr>"
            f"{checks}</table><h2>Runner log tails (redacted)</h2><pre>{esc(_log_tails(d, tid))}</pre>"
            f"<h2>Replay</h2><p><code>{esc(replay)}</code></p>")
    return _page(f"{tid} of {d.name}", body)


def _or_note(what: str, fn, *args) -> str:
    """A part of a page, or one escaped line saying why it is not drawn: a record of a shape no one foresaw costs
    that part, never the page (the index is always written)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the rest of the page stands
        return f"<p class=note>({esc(what)} not drawn: {esc(type(exc).__name__)}: {esc(str(exc)[:200])})</p>"


def _worst_first(tids, verdict_of: dict) -> list[str]:
    """Tasks that did not pass in the order a large wave keeps their lanes and pages: fail, unknown (or no grade),
    not_applied, then by id."""
    return sorted(tids, key=lambda t: (RANK.get(verdict_of.get(t, UNKNOWN), 1), t))


def _left_out_note(verdict_of: dict, lanes: set, lanes_wanted: list, paged: set, wanted: list, evidence: str) -> str:
    """The index's paragraph of a large wave: every task and verdict counted, then what has no lane or page, how
    many, and where its files are."""
    counts = Counter(verdict_of.values())
    said = ", ".join(f"{counts[v]:,} {esc(v)}" for v in VERDICTS) + "".join(
        f", {n:,} {esc(v)}" for v, n in sorted(counts.items()) if v not in VERDICTS)
    passed = len(verdict_of) - len(wanted)
    ungraded = len(set(lanes_wanted) - set(verdict_of))
    if ungraded:
        said += f"; {ungraded:,} more in the timeline have no grade (drawn as unknown)"

    def by_verdict(tids) -> str:
        return ", ".join(f"{n:,} {esc(v)}" for v, n in sorted(Counter(verdict_of.get(t, "not graded")
                                                                      for t in tids).items()))

    no_lane = [t for t in lanes_wanted if t not in lanes]
    no_page = [t for t in wanted if t not in paged]
    capped = (f" Of the tasks that did not pass, {len(no_lane):,} have no lane (at most {LANES_MAX:,} lanes, "
              f"the worst first: {by_verdict(no_lane)})." if no_lane else "")
    capped += (f" Of the tasks that did not pass, {len(no_page):,} have no page (at most "
               f"{PAGE_BYTES_MAX / 2**20:.0f} MiB of pages, the worst first: {by_verdict(no_page)}); their rows "
               f"below say so, and each one's evidence (its grade, attempts, runner log tails) is in "
               f"<code>{esc(evidence)}/&lt;task&gt;/</code>." if no_page else "")
    return (f"<p id=left-out>{len(verdict_of):,} tasks: {said}. A wave of more than {FULL_REPORT_TASKS:,} tasks: "
            f"only the tasks that did not pass have a lane in the timeline ({len(lanes):,} lanes) and a page "
            f"({len(paged):,} pages); the {passed:,} tasks that passed have neither.{capped} Every task is in "
            f"the tables below and every event in <code>{results.TIMELINE}</code>; a passing task's grade (every "
            f"check and its reason) is in <code>&lt;task&gt;{results.GRADE_SUFFIX}</code>, its runner logs in "
            f"<code>{results.SANDBOXES}/&lt;task&gt;-a&lt;attempt&gt;/{results.RUNNER_LOG}</code>. Through "
            f"<code>sandfleet serve</code> every task's link opens its page, rendered from those files when asked; "
            f"opened as a file, a link with no page file leads nowhere.</p>")


def write_html(d: Path, result: dict) -> Path:
    """`index.html` and `pages/<task>.html` of the wave in `d`; returns the index's path. A wave of more than
    `FULL_REPORT_TASKS` tasks: lanes and pages only for the tasks that did not pass, worst first, at most
    `LANES_MAX` lanes and `PAGE_BYTES_MAX` of pages, every one left out counted in the index."""
    d = Path(d)
    events = results.read_jsonl(d / results.TIMELINE)
    # as the grader reads them: one that cannot be true is shown unknown, why in its detail (a damaged file, and the
    # receipts left out, are named in SUMMARY.md and the grades)
    receipts = read_receipts(d / results.FAULTS)[0]
    if isinstance(result.get("plan"), dict):
        receipts = checked_receipts(receipts, result["plan"], events)[0]
    grades = result["tasks"] + result.get("references", [])
    verdict_of = {g["task_id"]: g["verdict"] for g in grades}
    in_timeline = {e["task"] for e in events if e.get("task")}
    large = len(set(verdict_of) | in_timeline) > FULL_REPORT_TASKS
    by_task: dict[str, list[dict]] = defaultdict(list)  # (each page reads its own task's records, not the wave's)
    for e in events:
        if e.get("task"):
            by_task[e["task"]].append(e)
    receipts_of: dict[str, list[dict]] = defaultdict(list)
    for r in receipts:
        receipts_of[r.get("task_id")].append(r)
    grade_of = {g["task_id"]: g for g in grades}
    wanted = _worst_first([t for t, v in verdict_of.items() if v != PASS], verdict_of) if large else list(grade_of)
    pages = results.own_dir(d, results.PAGES)  # (a link left in its place is never written through)
    paged: set[str] = set()
    spent = 0
    for tid in wanted:
        page = _or_note("this task's page", task_page, d, grade_of[tid], by_task.get(tid, []), receipts_of.get(tid, []))
        spent += len(page.encode())
        if large and spent > PAGE_BYTES_MAX:
            break
        results.write_stored(pages / f"{tid}.html", page)
        paged.add(tid)
    if large:  # a page an earlier render wrote that this one did not (a verdict changed, an older grader paged
        # every task) would be served as if current: it goes, and `serve` renders that page afresh on demand
        for tid in set(grade_of) - paged:
            stale = pages / f"{tid}.html"
            if os.path.isfile(stale) and not os.path.islink(stale):
                os.unlink(stale)
    note, lanes = "", None
    if large:
        lanes_wanted = _worst_first([t for t in in_timeline if verdict_of.get(t) != PASS], verdict_of)
        lanes = set(lanes_wanted[:LANES_MAX])
        note = _left_out_note(verdict_of, lanes, lanes_wanted, paged, wanted, results.EVIDENCE)
    checks = "".join(f"<tr><td>{esc(k)}</td><td>{badge(v)}</td></tr>" for k, v in result["wave_checks"].items())
    errors = "".join(f"<li>{esc(x)}</li>" for x in (result.get("harness_errors") or []) + (result.get("runner_failures")
                                                                                          or []))
    body = (f"<h1>Wave {esc(result['wave_id'])}: {badge(result['verdict'])}</h1>"
            + (f"<ul id=errors>{errors}</ul>" if errors else "")
            + f"<h2>Wave checks</h2><table id=wave-checks>{checks}</table><h2>Timeline</h2>"
            f"{note}<p>hover an attempt, a fault or a line to see what it was</p>"
            f"{_or_note('timeline', timeline_svg, events, lanes)}"
            f"<h2>Fault &times; outcome</h2>{_matrix(result['tasks'])}<h2>Tasks</h2>"
            f"{_tasks_table(grades, paged if large else None)}"
            f"<p>Replay one task: <code>sandfleet wave replay {esc(d)}/&lt;task&gt;</code>; the summary: "
            f"<a href='{results.SUMMARY}'>{results.SUMMARY}</a></p>")
    out = d / results.INDEX_HTML
    results.write_stored(out, _page(f"wave {result['wave_id']}", body, FILTER_JS))
    return out


def page_on_demand(d: Path, tid: str) -> str | None:
    """The page of task `tid` of the wave in `d` as `write_html` would write it, rendered from the wave's files:
    for `sandfleet serve`, when a large wave's report left it out. None when `tid` is not a task id or the wave has
    no `<tid>.grade.json` (a regular file, never through a link) of that task."""
    import orjson

    if not TASK_ID.fullmatch(tid):
        return None
    try:
        g = orjson.loads(results.regular_bytes(d / f"{tid}{results.GRADE_SUFFIX}"))
    except (OSError, ValueError):
        return None
    if not isinstance(g, dict) or g.get("task_id") != tid:
        return None
    events_of, receipts_of = _wave_view(d)
    return _or_note("this task's page", task_page, d, g, events_of.get(tid, []), receipts_of.get(tid, []))


_VIEWS: dict[str, tuple] = {}  # wave folder -> (its files' stats, events by task, receipts by task), for serve
_VIEWS_MAX = 4  # waves remembered (a 10,000-task wave's view was 0.33 CPU-s to build, for every page asked)


def _wave_view(d: Path) -> tuple[dict, dict]:
    """The wave's events and checked receipts, each grouped by task: built once, and again only when timeline.jsonl,
    faults.json or plan.json changed (by inode, size and mtime)."""
    import orjson

    stats = []
    for name in (results.TIMELINE, results.FAULTS, results.PLAN):
        try:
            st = os.lstat(d / name)
            stats.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append(None)
    got = _VIEWS.get(str(d))
    if got is not None and got[0] == stats:
        return got[1], got[2]
    try:  # (what the stored report would have read, never through a link: serve is a long-lived daemon)
        events = [] if (d / results.TIMELINE).is_symlink() else results.read_jsonl(d / results.TIMELINE)
    except (OSError, ValueError):
        events = []
    receipts = [] if (d / results.FAULTS).is_symlink() else read_receipts(d / results.FAULTS)[0]
    try:
        plan = orjson.loads(results.regular_bytes(d / results.PLAN))
    except (OSError, ValueError):
        plan = None
    if isinstance(plan, dict):
        try:
            receipts = checked_receipts(receipts, plan, events)[0]
        except Exception:  # noqa: BLE001 - a plan of a shape no one foresaw costs the check, never the page
            pass
    events_of: dict[str, list] = defaultdict(list)
    for e in events:
        if isinstance(e.get("task"), str):
            events_of[e["task"]].append(e)
    receipts_of: dict[str, list] = defaultdict(list)
    for r in receipts:
        if isinstance(r.get("task_id"), str):
            receipts_of[r["task_id"]].append(r)
    while len(_VIEWS) >= _VIEWS_MAX:
        _VIEWS.pop(next(iter(_VIEWS)), None)
    _VIEWS[str(d)] = (stats, events_of, receipts_of)
    return events_of, receipts_of


def _inline(text: str, link) -> str:
    """Escaped text with `code` spans (a wave id among them linked through `link`) and **bold**."""
    out = []
    for i, part in enumerate(text.split("`")):
        if i % 2:
            href = link(part)
            out.append(f"<a href='{esc(href)}'><code>{esc(part)}</code></a>" if href else f"<code>{esc(part)}</code>")
        else:
            out.append(re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", esc(part)))
    return "".join(out)


def markdown_page(md: str, title: str, link=lambda _: None) -> str:
    """A LEAGUE.md or CAMPAIGN.md as a page in the report's style: headings, tables, lists, pictures, paragraphs
    (the subset those files use); `link(code_span)` gives a wave id its page."""
    body, table, items = [], [], []

    def flush():
        if table:
            head, *rows = table
            body.append("<table><tr>" + "".join(f"<th>{_inline(c, link)}</th>" for c in head) + "</tr>"
                        + "".join("<tr>" + "".join(f"<td>{_inline(c, link)}</td>" for c in r) + "</tr>" for r in rows)
                        + "</table>")
            table.clear()
        if items:
            body.append("<ul>" + "".join(f"<li>{_inline(x, link)}</li>" for x in items) + "</ul>")
            items.clear()

    for line in md.splitlines():
        st = line.strip()
        if st.startswith("|"):
            cells = [c.strip() for c in st.strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                table.append(cells)
            continue
        flush()
        if st.startswith("#"):
            level = min(6, len(st) - len(st.lstrip("#")))
            body.append(f"<h{level}>{_inline(st.lstrip('#').strip(), link)}</h{level}>")
        elif st.startswith("- "):
            items.append(st[2:])
        elif st.startswith("![") and "](" in st and st.endswith(")"):
            src = st.split("](", 1)[1][:-1]
            body.append(f"<p><img src='{esc(src)}' alt='{esc(st[2:st.index(']')])}' style='max-width:100%'></p>")
        elif st:
            body.append(f"<p>{_inline(st, link)}</p>")
    flush()
    return _page(title, "".join(body))


def write_markdown_page(out: Path, md_name: str, title: str) -> Path:
    """`index.html` beside a league's or campaign's markdown, each wave id linked to its own report."""
    def link(span: str):
        return f"waves/{span}/{results.INDEX_HTML}" if (out / "waves" / span / results.INDEX_HTML).is_file() else None

    page = out / results.INDEX_HTML
    page.write_text(markdown_page((out / md_name).read_text(), title, link))
    return page
