"""Reports rendered only from a wave's stored files: SUMMARY.md, a timeline picture and the web page
(`cluster/htmlreport.py`)."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import orjson

from cluster import results
from cluster.receipts import checked_receipts, read_receipts
from cluster.grade import FAIL, NOT_APPLIED, PASS, UNKNOWN


def _cell(g: dict) -> str:
    faults = [f if t == "time" else f"{f}@{t}" for f, t in zip(g["faults"], g.get("triggers") or ["time"] * 9)]
    return f"{g['runner']} × {g.get('workload') or '?'} × {'+'.join(faults) or 'none'}"


class _Shown(dict):
    """A stored mapping read for a report: a field that is not there reads `?` (a hand-edited plan is named by
    `sandfleet grade`; the report still says what it can)."""

    def __missing__(self, key):
        return "?"


def _head(d: Path, result: dict) -> list[str]:
    """The title, the verdict and the wave's inputs, figures, resumes and harness errors."""
    plan = result["plan"]
    cfg = _Shown(plan.get("config") if isinstance(plan.get("config"), dict) else {})
    lines = [f"# Wave {result['wave_id']}", ""]
    if isinstance(plan.get("replay_of"), dict):
        r = _Shown(plan["replay_of"])
        lines += [f"Replay of task {r['task_id']} of wave {r['wave_id']} (same seed, same faults).", ""]
    if result.get("interrupted"):
        how = "" if "at once" in result["interrupted"] else " the wave was stopped in order;"
        lines += [f"**Interrupted by {result['interrupted']}**:{how} tasks that had not finished are `unknown`.", ""]
    runner = plan.get("runner") if isinstance(plan.get("runner"), dict) else {}
    faults = cfg["faults"] if isinstance(cfg["faults"], list) else [cfg["faults"]]
    lines += [f"**Verdict: {result['verdict']}**  ",
             f"runner `{runner.get('name', cfg['runner'])}`, {cfg['tasks']} tasks, "
             f"concurrency {cfg['concurrency']}, "
             f"seed {cfg['seed']}, faults {', '.join(str(f) for f in faults) or 'none'}, "
             f"{_Shown(cfg['workload'] if isinstance(cfg['workload'], dict) else {})['steps']} steps per task", ""]
    fig = result.get("figures") or {}
    if fig.get("wave_wall_s") is not None:
        fleet = (f"Ray and actors {fig['fleet_start_s']} s" if "fleet_start_s" in fig
                 else "Ray and actors lent, already running")
        store = (f"store start {fig['store_start_s']} s" if "store_start_s" in fig
                 else "store lent by the fleet, already running")
        lines += [f"Wave wall time {fig['wave_wall_s']} s ({store}, {fleet}).", ""]
    for r in result.get("resumed") or []:
        lines += [f"Resumed after its driver died (at +{r['t']:.1f} s): {len(r['finished'])} task(s) that had ended "
                  f"kept their results, {len(r['unfinished'])} ran on; attempts reaped: "
                  f"{', '.join(r['closed_attempts']) or 'none'}.", ""]
    if result.get("runner_failures"):
        lines += ["## The runner fails with no fault at all", ""] + [f"- {e}" for e in result["runner_failures"]] + [
            "", "Its uninterrupted reference run shows the defect: the wave fails (exit 1).", ""]
    if result.get("harness_errors"):
        lines += ["## Harness errors", ""] + [f"- {e}" for e in result["harness_errors"]] + [""]
    if result.get("warnings"):
        lines += ["## Warnings", ""] + [f"- {e}" for e in result["warnings"]] + [""]
    return lines


def _replay_lines(grades: list[dict]) -> list[str]:
    """Resume survival, double applies, recalls and what replays cost."""
    idle = [g for g in grades if g.get("not_exercised")]
    # survival is judged over tasks that ran to an end (not those a stopped wave cut off) and whose kill tested
    # something; a kill whose receipt names no sandbox of the task is not shown to have interrupted a run
    unshown = [g for g in grades if g.get("kill_not_shown") and not g.get("not_exercised")]
    interrupted = [g for g in grades if g["interrupted"] and g.get("ended", True) and not g.get("not_exercised")
                   and not g.get("kill_not_shown")]
    survived = [g for g in interrupted if g["verdict"] == PASS]
    double = [g for g in grades if (g["checks"].get("no_double_apply") or {}).get("verdict") == FAIL]
    wasted_tokens = sum(g.get("wasted_tokens") or 0 for g in grades)
    wasted = sum(g.get("wasted_calls") or 0 for g in grades)
    recalls = sum(g.get("model_recalls") or 0 for g in grades)
    n_int = sum(max(0, g["attempts"] - 1) for g in grades)
    rsr = f"{len(survived)}/{len(interrupted)}" if interrupted else "n/a (no task was interrupted)"
    per = f"{wasted / n_int:.2f} calls and {wasted_tokens / n_int:.0f} tokens per interruption" if n_int else "n/a"
    left_out = (f"; {len(idle)} task(s) left out: their kill was not exercised (it landed before the attempt "
                "did anything durable)" if idle else "") + (
        f"; {len(unshown)} task(s) left out: their kill names no sandbox of the task (not shown to have interrupted "
        "a run: unknown)" if unshown else "")
    return [f"- Resume survival rate (interrupted tasks that pass): {rsr}{left_out}",
            f"- Double-apply tasks: {len(double)}",
            f"- Model recalls of recorded steps: {recalls}",
            f"- Replay cost: {wasted} wasted model call(s), {wasted_tokens} token(s) over {n_int} "
            f"interruption(s) ({per})"]


def _own(grades: list[dict]) -> int:
    """Tasks compared with themselves: no fault planned, one attempt nothing touched (cluster/grade/selfref.py)."""
    return sum(1 for g in grades if ((g.get("checks") or {}).get("resume_equivalent") or {}).get("reference") == "self")


def _durability(d: Path, result: dict) -> list[str]:
    """The faults tested, and the durability figures over every task."""
    grades, plan = result["tasks"], result["plan"]
    refs = result.get("references", [])
    ref_pass = sum(1 for g in refs if g["verdict"] == PASS)
    cached = sum(1 for t in plan["tasks"] if (t.get("reference") or {}).get("cached"))
    resume = [x for g in grades for x in g.get("resume_s") or []]
    commit = [g["store_write_ms_per_step"] for g in grades if g.get("store_write_ms_per_step") is not None]
    leaks, checks = result["leaks"], result["wave_checks"]
    tested = _fault_coverage(d, plan)
    lines = ["## Faults", "", "- " + "; ".join(tested), ""] if tested else []
    return lines + ["## Durability", ""] + _replay_lines(grades) + [
        f"- Time to resume (a failed attempt's end to the next attempt's first model request): {_pcts(resume, 's')}",
        f"- Store write time per step (p50 over tasks; the commit overhead): {_pcts(commit, 'ms')}",
        f"- Wall time per task vs its uninterrupted reference: {_wall(grades, refs)}",
        f"- Positive control (uninterrupted reference runs that pass): {ref_pass}/{len(refs)} run in this wave"
        f", {cached} reused from the reference cache, {_own(grades)} tasks their own (uninterrupted, no fault planned)",
        f"- Store audit: {_audit(d)}",
        f"- Leaked sandboxes: {_count(leaks['sandboxes'])} at the hosts' end-of-wave sweep, "
        f"{_count(leaks.get('sandboxes_sweeper'))} by the sweep actor "
        f"(no_leaked_sandbox: {checks['no_leaked_sandbox']}); "
        f"incomplete uploads left: {_count(leaks['incomplete_uploads'])}",
        f"- Sweep actor: {_sweeper(d)}",
        f"- Processes that outlived their runner's exit (killed with its sandbox): {_outlived(grades + refs)}", ""]


def _outlived(grades: list[dict]) -> str:
    looked = [g for g in grades if "no_outliving_process" in g["checks"]]
    if not looked:
        return ("not looked at (the docker backend has no wrapper to report them, or no attempt's wrapper reported: "
                "a runner that killed it)")
    rows = [o for g in looked for o in (g["checks"].get("no_outliving_process") or {}).get("outlived") or []]
    if not rows:
        return f"none ({len(looked)} task(s) looked at)"
    names = sorted({p.get("name", "?") for o in rows for p in o["processes"]})
    after0 = sum(1 for o in rows if o["exit_code"] == 0)
    return (f"{sum(len(o['processes']) for o in rows)} in {len(rows)} attempt(s), {after0} of them after an exit 0 "
            f"({', '.join(names[:6])})")


def _cells_and_signatures(d: Path, grades: list[dict]) -> list[str]:
    lines: list[str] = []
    cells: dict[str, Counter] = defaultdict(Counter)
    for g in grades:
        cells[_cell(g)][g["verdict"]] += 1
    lines += ["## Cells", "", "| cell | tasks | pass | fail | unknown | not applied | pass rate |",
              "|---|---|---|---|---|---|---|"]
    for cell, c in sorted(cells.items()):
        n = sum(c.values())
        lines.append(f"| {cell} | {n} | {c[PASS]} | {c[FAIL]} | {c[UNKNOWN]} | {c[NOT_APPLIED]} | "
                     f"{c[PASS] / n:.0%} |")
    lines.append("")

    sigs: dict[str, list[str]] = defaultdict(list)
    for g in grades:
        if g["signature"]:
            sigs[g["signature"]].append(g["task_id"])
    lines += ["## Failure signatures", ""]
    if sigs:
        for sig, tids in sorted(sigs.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"- `{sig}`: {len(tids)} task(s): {', '.join(tids[:10])}; replay one: "
                         f"`sandfleet wave replay {d / tids[0]}`")
    else:
        lines.append("- none")
    return lines


def write_summary(d: Path, result: dict, picture: subprocess.Popen | None = None) -> Path:
    """SUMMARY.md, the timeline picture (drawn here, or by `picture`: the child `start_timeline_png` started while
    the wave was graded) and the web page."""
    d = Path(d)
    grades, refs = result["tasks"], result.get("references", [])
    lines = _head(d, result) + _inputs(result) + _durability(d, result) + _cells_and_signatures(d, grades)
    lines += ["", "## Tasks", "", "| task | fault | attempts | verdict | recalls | failed / not passing checks | "
              "why attempts ended |", "|---|---|---|---|---|---|---|"]
    for g in grades + refs:
        bad = ", ".join(f"{k}={c['verdict']}" for k, c in g["checks"].items() if c["verdict"] != PASS) or "-"
        causes = "; ".join(c for c in g.get("attempt_causes") or [] if c != "exit 0") or "-"
        lines.append(f"| {g['task_id']} | {'+'.join(g['faults']) or '-'} | {g['attempts']} | {g['verdict']} | "
                     f"{g.get('model_recalls')} | {bad} | {causes} |")
    lines += ["", "Files: " + ", ".join(f"`{name}`" for name, _ in results.LAYOUT if name != results.SUMMARY) + ".",
              ""]
    try:
        finish_timeline_png(picture) if picture is not None else _timeline_png(d)
    except Exception as exc:  # noqa: BLE001 - the picture is a nicety, the summary says if it failed
        lines.append(f"(timeline picture not drawn: {exc})")
    blocked = None  # a directory where one of the report's files goes: named after the rest is written
    try:
        from cluster.htmlreport import write_html

        write_html(d, result)
        lines.append(f"The report as a web page: `{results.INDEX_HTML}` (a page per task under `{results.PAGES}/`).")
    except Exception as exc:  # noqa: BLE001 - the page is a view of the same files; the summary says if it failed
        lines.append(f"(web report not written: {type(exc).__name__}: {exc})")
        blocked = exc if isinstance(exc, results.StoredPathError) else None
    out = d / results.SUMMARY
    # (a runner's words in it, escaped: `cat` is safe)
    try:
        results.write_stored(out, results.terminal_safe("\n".join(lines)))
    finally:  # what `serve` lists the wave by is written even when SUMMARY.md cannot be
        _write_verdict(d, result)
    if blocked is not None:
        raise blocked
    return out


def _write_verdict(d: Path, result: dict) -> None:
    """`verdict.json`: what `sandfleet serve` lists a wave by, so its index reads one small file per wave."""
    from cluster.serve import summary_of

    results.write_stored(d / results.VERDICT, orjson.dumps({
        "wave_id": result["wave_id"], "verdict": result["verdict"],
        "harness_errors": list(result.get("harness_errors") or []) + ([result["harness_error"]]
                                                                     if result.get("harness_error") else []),
        "tasks": [summary_of(g) for g in result["tasks"]]}, option=orjson.OPT_INDENT_2))


def _fault_coverage(d: Path, plan: dict | None = None) -> list[str]:
    """Per fault id: how many planned instances really applied; a fault none of which applied is NOT TESTED
    by this wave (whatever the tasks' verdicts say about everything else). A damaged faults.json is named (file,
    record, what is wrong): the faults it does not show are not counted as tested."""
    receipts, damage = read_receipts(Path(d) / results.FAULTS)
    if plan is not None:
        try:  # the timeline bounds when a receipt can have fired (a damaged one bounds nothing)
            timeline = results.read_jsonl(Path(d) / results.TIMELINE, ("event",), skip_bad=True)
        except (OSError, ValueError):
            timeline = []
        receipts, left = checked_receipts(receipts, plan, timeline)
        if left:
            damage = "; ".join(x for x in (damage, f"{results.FAULTS}: {len(left)} receipt(s) that answer no planned "
                                           "fault or repeat one, left out: " + "; ".join(left[:5])) if x)
    by: dict[str, Counter] = defaultdict(Counter)
    for r in receipts:
        by[r["fault_id"]][r["status"]] += 1
    out = []
    for fid, c in sorted(by.items()):
        n = sum(c.values())
        note = "" if c["applied"] else " — **not tested** (no planned instance changed anything)"
        out.append(f"{fid} applied {c['applied']}/{n}"
                   + (f", not applied {c['not_applied']}" if c["not_applied"] else "")
                   + (f", unknown {c['unknown']}" if c["unknown"] else "") + note)
    if damage:
        out.append(f"**damaged**: {damage} (a planned fault with no readable receipt is `unknown`)")
    return out


def _inputs(result: dict) -> list[str]:
    """The stored files the grader could not read, or whose records it left out for their shape, each named."""
    inputs = result.get("inputs") if isinstance(result.get("inputs"), dict) else {}
    bad = [f"- `{name}`: unreadable: {why}" for name, why in sorted((inputs.get("unreadable") or {}).items())]
    bad += [f"- `{name}`: {v.get('count', '?')} record(s) left out for their shape: {'; '.join(v.get('first')[:3])}"
            for name, v in sorted((inputs.get("skipped") or {}).items())
            if isinstance(v, dict) and isinstance(v.get("first"), list)]
    if not bad:
        return []
    return ["## Inputs the grader could not use", "", *bad,
            "", "What depends on them is `unknown`, never `pass`.", ""]


def _pcts(xs: list[float], unit: str) -> str:
    if not xs:
        return "n/a"
    xs = sorted(xs)

    def q(p):
        return xs[min(len(xs) - 1, int(p * len(xs)))]
    return f"p50 {q(0.5):g} {unit}, p95 {q(0.95):g} {unit} (n={len(xs)})"


def _wall(grades: list[dict], refs: list[dict]) -> str:
    ref = {g["seed"]: g["wall_s"] for g in refs if g.get("wall_s")}
    extra = sorted(g["wall_s"] - ref[g["seed"]] for g in grades if g.get("wall_s") and g["seed"] in ref
                   and g["interrupted"])
    if not extra:
        return "n/a (no interrupted task beside a reference run in this wave)"
    return f"interrupted tasks took {extra[len(extra) // 2]:+.2f} s (p50) over their reference (n={len(extra)})"


def _report(d: Path, name: str):
    """(the harness report `name` with the shape the reports read, or None; why not, or None when it is missing)."""
    try:
        r = orjson.loads(results.regular_bytes(Path(d) / name))
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:  # (orjson.JSONDecodeError is a ValueError)
        return None, f"{name} cannot be read: {str(exc).split(': ', 1)[-1][:200]}"
    why = results.report_misfit(name, r)
    return (None, f"{name}: {why}") if why else (r, None)


def _sweeper(d: Path) -> str:
    r, why = _report(d, results.SWEEPER)
    if r is None:
        return f"unknown ({why})" if why else "no report (sweeper.json missing)"
    if r.get("unavailable"):
        return "**unavailable**: " + "; ".join(r.get("errors") or [])
    out = (f"{r['scans']} pass(es) (p50 {r['scan_ms_p50']} ms); seen with no lease: {len(r['leaked'])}, reaped after "
           f"the {r['settle_s']} s settle window: {len(r['reaped'])}, left at the end: {len(r['left_at_end'])}; "
           f"dangling leases: {len(r['dangling_leases'])}; expired but running: {len(r['expired_but_running'])}")
    if "nodes_scanned" in r:  # sandbox nodes that are other machines: each scanned by its own host
        out += f"; nodes scanned by their hosts: {', '.join(r['nodes_scanned']) or 'none'}"
    if r.get("unanswered_nodes"):
        out += "; **not answering at the last pass** (nothing is known of them): " + "; ".join(
            f"{n} ({why})" for n, why in sorted(r["unanswered_nodes"].items()))
    if r.get("errors"):
        out += "; errors: " + "; ".join(r["errors"][:3])
    return out


def _audit(d: Path) -> str:
    a, why = _report(d, results.STORE_AUDIT)
    if a is None:
        return f"unknown ({why or 'no store-audit.json'})"
    if a.get("error") is not None:  # the audit failed: what failed is named (call, bucket, prefix, key, error)
        return f"unknown: the audit failed: {a.get('failed') or a['error']}"
    checked = sum(1 for recs in a.get("tasks", {}).values() for r in recs if r.get("checked_against_write"))
    f = [x for x in a.get("findings") or [] if x["signature"] != "incomplete_multipart_upload"]
    listed = a.get("objects_listed")
    if a.get("sampled"):  # a bounded audit says what it did not read
        read = (f"{a.get('objects_checked', '?')} of {listed if listed is not None else '?'} objects checked "
                f"(read back through {a.get('client', '?')}; a sample past the cap of {a.get('max_objects', '?')}, "
                f"sample seed {a.get('sample_seed', '?')}: the others were listed, not read)")
    elif listed is not None:
        read = f"{a.get('objects_checked', '?')} of {listed} objects checked (read back through {a.get('client', '?')})"
    else:  # an audit from before the cap
        read = f"{a.get('objects_checked', '?')} object(s) read back through {a.get('client', '?')}"
    out = (f"{read}, {checked} checked against what their writer sent; "
           f"{len(a.get('aborted_uploads') or [])} incomplete upload(s) aborted")
    if f:
        out += "; **findings**: " + "; ".join(f"`{x['signature']}` {x['key']}: {x['detail']}" for x in f[:5])
    return out


def _count(x) -> str:
    return "unknown" if x is None else str(len(x))


def start_timeline_png(d: Path) -> subprocess.Popen | None:
    """Draw `timeline.png` in a child process from the closed timeline (matplotlib's import alone is most of a
    CPU-second): the wave grades on the other core meanwhile. None when the child cannot start (drawn inline)."""
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    try:
        return subprocess.Popen([sys.executable, "-m", "cluster.report", "timeline-png", str(d)], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError:
        return None


def finish_timeline_png(child: subprocess.Popen, timeout_s: float = 120) -> None:
    """Wait for the child that draws the picture; its error, if any, is raised (the summary names it)."""
    try:
        _, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise RuntimeError(f"the drawing did not end in {timeout_s:.0f} s") from None
    if child.returncode != 0:
        tail = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or [f"exit {child.returncode}"]
        raise RuntimeError(tail[0])


PNG_LANES = 300  # timeline.png draws a lane per task up to this many tasks; past it, attempts running over time


def _timeline_png(d: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = results.read_jsonl(d / results.TIMELINE)
    starts = {(e["task"], e["attempt"]): e["t"] for e in events if e["event"] == "attempt_start"}
    tasks = sorted({e["task"] for e in events if e.get("task")})
    if not tasks:
        return
    cleared: dict = {}
    for c in events:  # (the first clear of each fault instance)
        if c["event"] == "fault_clear":
            cleared.setdefault(c.get("instance"), c["t"])
    if len(tasks) > PNG_LANES:
        fig = _many_tasks_png(plt, events, starts, len(tasks))
    else:
        row = {t: i for i, t in enumerate(tasks)}
        fig, ax = plt.subplots(figsize=(10, 0.35 * len(tasks) + 1.5))
        for e in events:
            if e["event"] == "attempt_end":
                t0 = starts.get((e["task"], e["attempt"]), e["t"])
                color = "tab:green" if e.get("exit_code") == 0 else "tab:red"
                ax.barh(row[e["task"]], e["t"] - t0, left=t0, color=color, height=0.6)
            elif e["event"] == "fault_inject" and e.get("applied"):
                ax.plot(e["t"], row[e["task"]], marker="v", color="black")
                end = cleared.get(e.get("instance"))
                if end is not None and end - e["t"] > 0.05:  # a window fault: show how long it was open
                    ax.hlines(row[e["task"]] - 0.38, e["t"], end, color="black", linewidth=3)
        ax.set_yticks(range(len(tasks)), tasks)
        ax.set_xlabel("seconds since wave start (green: attempt exited 0, red: killed or failed, ▼ fault, "
                      "▬ fault window)")
        ax.invert_yaxis()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    results.write_stored(d / results.TIMELINE_PNG, buf.getvalue())  # a link left there is replaced, not written


def _many_tasks_png(plt, events: list[dict], starts: dict, tasks: int):
    """A wave of more tasks than lanes can show (a lane each made a 10,000-task picture 280,000 pixels tall, 11 MB,
    and took minutes to draw): the attempts running over time, when attempts ended killed or failed, and when faults
    were applied. index.html still has a lane for every task that did not pass."""
    spans = [(starts.get((e["task"], e["attempt"]), e["t"]), e["t"], e.get("exit_code") == 0)
             for e in events if e["event"] == "attempt_end" and e.get("task")]
    steps = sorted([(a, 1) for a, _, _ in spans] + [(b, -1) for _, b, _ in spans])
    xs, ys, running = [0.0], [0], 0
    for t, change in steps:
        running += change
        xs.append(t)
        ys.append(running)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.step(xs, ys, where="post", color="tab:green", label="attempts running")
    bad = [b for _, b, ok in spans if not ok]
    if bad:
        ax.plot(bad, [0] * len(bad), "|", color="tab:red", markersize=12, label="an attempt ended killed or failed")
    faults = [e["t"] for e in events if e["event"] == "fault_inject" and e.get("applied")]
    if faults:
        top = max(ys) or 1
        ax.plot(faults, [top * 1.04] * len(faults), "v", color="black", markersize=4, label="a fault applied")
    ax.set_title(f"{tasks} tasks, {len(spans)} attempts: a lane per task is drawn up to {PNG_LANES} tasks "
                 "(index.html has one for each task that did not pass)", fontsize=9)
    ax.set_xlabel("seconds since wave start")
    ax.set_ylabel("attempts running")
    ax.legend(loc="upper right", fontsize=8)
    return fig


if __name__ == "__main__":  # `python -m cluster.report timeline-png DIR`: start_timeline_png's child
    if sys.argv[1:2] != ["timeline-png"] or len(sys.argv) != 3:
        sys.exit("usage: python -m cluster.report timeline-png WAVE_DIR")
    _timeline_png(Path(sys.argv[2]))
