"""Storage-fault campaigns: how strong a store fault can a runner take?

`sandfleet campaign storage --fault ST1 --runner durable,naive --window 0.5-300` runs, per runner,
seeded waves in which every task meets the fault at one strength (`fault_timing.<F>.strength`: an
outage's seconds, a latency in ms, an error share, a lag...), and searches the range by bisection on a
log scale: first both ends, then the geometric middle of the highest strength survived and the lowest
strength failed, `probes` waves in all. A strength is *survived* when every task that really met the
fault passed; a wave in which no task met it is `inconclusive` and is never counted either way.
Writes CAMPAIGN.md (every wave, the bracket per runner) and campaign.png (survival against strength).
All waves run on one fleet; each is stored under `waves/` and can be re-graded.
"""
from __future__ import annotations

import math
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import orjson

from cluster import results
from cluster.config import ConfigError, build_config
from faults.base import CATALOG

KNOBS = {"ST1": "outage length (s)", "ST2": "added latency (ms)", "ST3": "share of requests failed",
         "ST4": "window (s)", "ST5": "rejection window (s)", "ST7": "read-after-write lag (s)",
         "ST8": "PUTs throttled", "CR1": "seconds the old key is still served"}


def parse_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split("-", 1))
    except ValueError:
        raise ConfigError(f"--window {text!r}: expected LO-HI, e.g. 0.5-300") from None
    if not (0 < lo < hi < 1e6) or not (math.isfinite(lo) and math.isfinite(hi)):
        raise ConfigError(f"--window {text!r}: need 0 < LO < HI < 1e6")
    return lo, hi


def plan_waves(fault: str, runners: list, lo: float, hi: float, wave: dict) -> None:
    """Validate every wave's config before anything runs (bad input loses nothing)."""
    if fault not in KNOBS or fault not in CATALOG:
        raise ConfigError(f"--fault {fault!r}: campaigns take one of {', '.join(sorted(KNOBS))}")
    for r in runners:
        for x in (lo, hi):
            probe_config(fault, r, x, wave)


def probe_config(fault: str, runner, strength: float, wave: dict):
    """The wave config of one probe: `fault` at `strength`, over the campaign's base wave."""
    timing = dict(wave.get("fault_timing") or {})
    timing[fault] = {**timing.get(fault, {}), "strength": strength}
    if fault in ("ST1", "ST2", "ST3", "ST5", "ST7", "ST8") and not {"at_s", "after_model_calls"} & set(timing[fault]):
        # armed right after the runner's first model answer, not at a clock time: on a loaded host a clock time can
        # fall before the runner's first request or after its last one, and a probe that met nothing proves nothing
        timing[fault]["after_model_calls"] = [1, 1]
    if fault == "ST7":  # a lag only shows when an attempt resumes: a kill after the runner's 3rd answer
        timing.setdefault("PK1", {"after_model_calls": [3, 4]})
    return build_config({**wave, "runner": runner, "faults": [f"{fault}+PK1" if fault == "ST7" else fault],
                         "fault_timing": timing}, source="campaign wave")


_config = probe_config  # (its old name, as tests/unit/test_campaign.py imports it)


def _outcome(result: dict, fault: str) -> dict:
    met = [g for g in result["tasks"]
           if fault in g["faults"] and (g["checks"].get("fault_applied") or {}).get("verdict") == "pass"]
    passed = [g for g in met if g["verdict"] == "pass"]
    if result.get("harness_errors"):
        return {"met": len(met), "passed": len(passed), "outcome": "harness error"}
    if not met:
        return {"met": 0, "passed": 0, "outcome": "inconclusive"}
    return {"met": len(met), "passed": len(passed), "outcome": "survived" if len(passed) == len(met) else "failed"}


def run_campaign(fault: str, runners: list, lo: float, hi: float, wave: dict, results_root: Path,
                 probes: int = 6, progress: bool = False, fleet=None) -> Path:
    from cluster.driver import WaveRun
    from cluster.raycluster import FleetSession

    plan_waves(fault, runners, lo, hi, wave)
    ts = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    out = Path(results_root).resolve() / f"campaign-{fault.lower()}-{ts}"
    out.mkdir(parents=True)
    rows: list[dict] = []
    own = fleet is None
    interrupted = None

    def on_signal(signum, frame):
        raise CampaignInterrupted(signal.Signals(signum).name)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for runner in runners:
            tried: dict[float, str] = {}

            def probe(x: float, runner=runner, tried=tried) -> str:
                nonlocal fleet
                cfg = probe_config(fault, runner, round(x, 4), wave)
                if fleet is None:
                    fleet = FleetSession.lent_for(cfg)
                t = time.perf_counter()
                w = WaveRun(cfg, out / "waves", progress=progress, fleet=fleet)
                result = w.run()
                if result.get("interrupted"):  # the wave took the signal and stopped in order: so do we
                    raise CampaignInterrupted(str(result["interrupted"]))
                o = _outcome(result, fault)
                rows.append({"runner": cfg.runner_spec()["name"], "fault": fault, "strength": round(x, 4), **o,
                             "wave_id": result["wave_id"], "wall_s": round(time.perf_counter() - t, 1)})
                (out / results.CAMPAIGN_JSON).write_bytes(
                    orjson.dumps({"fault": fault, "range": [lo, hi], "rows": rows}, option=orjson.OPT_INDENT_2))
                tried[x] = o["outcome"]
                return o["outcome"]

            budget = max(2, probes)
            ok, bad = None, None
            for x in (lo, hi):
                r = probe(x)
                budget -= 1
                if r == "survived":
                    ok = max(ok or x, x)
                elif r == "failed":
                    bad = min(bad or x, x)
            while budget > 0 and ok is not None and bad is not None and bad > ok and bad / ok > 1.05:
                x = math.sqrt(ok * bad)
                r = probe(x)
                budget -= 1
                if r == "survived":
                    ok = x
                elif r == "failed":
                    bad = x
                else:  # inconclusive or harness error: narrow nothing, try the next point up
                    ok = x if ok is None else ok
                    break
    except CampaignInterrupted as exc:
        interrupted = str(exc)
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
        try:
            if own and fleet is not None:
                fleet.stop()
        finally:
            write_campaign(out, fault, lo, hi, rows, interrupted)
    if interrupted:
        raise CampaignInterrupted(interrupted)
    return out


class CampaignInterrupted(Exception):
    """A signal stopped the campaign: the waves that finished are written, the bracket says it is partial."""


def bracket(rows: list[dict], runner: str) -> str:
    mine = [r for r in rows if r["runner"] == runner]
    ok = [r["strength"] for r in mine if r["outcome"] == "survived"]
    bad = [r["strength"] for r in mine if r["outcome"] == "failed"]
    if not ok and not bad:
        return "inconclusive: no wave met the fault"
    if not bad:
        return f"survives the whole range tried (up to {max(ok):g})"
    if not ok:
        return f"fails even at the weakest strength tried ({min(bad):g})"
    lo_ok = max(x for x in ok if x < min(bad)) if any(x < min(bad) for x in ok) else None
    return (f"survives up to {lo_ok:g}, fails at {min(bad):g}" if lo_ok is not None else
            f"fails at {min(bad):g}; survived only above it (not monotone: {sorted(ok)})")


def write_campaign(out: Path, fault: str, lo: float, hi: float, rows: list[dict],
                   interrupted: str | None = None) -> None:
    runners = list(dict.fromkeys(r["runner"] for r in rows))
    lines = [f"# Storage-fault campaign: {fault} ({KNOBS.get(fault, 'strength')})", ""]
    if interrupted:
        lines += [f"**Interrupted by {interrupted}**: only the waves below finished; the brackets are partial "
                  "(a strength never tried says nothing).", ""]
    lines += [f"Range {lo:g}-{hi:g}, bisected on a log scale. A strength is survived when every task that really "
              "met the fault passed; a wave where no task met it is inconclusive.", "",
              "| runner | strongest survived → weakest failed |", "|---|---|"]
    lines += [f"| {name} | {bracket(rows, name)} |" for name in runners]
    lines += ["", "| runner | strength | tasks that met the fault | passed | outcome | wave | wall |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['runner']} | {r['strength']:g} | {r['met']} | {r['passed']} | {r['outcome']} | "
                     f"`{r['wave_id']}` | {r['wall_s']} s |")
    try:
        _plot(out / results.CAMPAIGN_PNG, fault, rows, runners)
        lines += ["", "![campaign](campaign.png)"]
    except Exception as exc:  # noqa: BLE001
        lines.append(f"(picture not drawn: {exc})")
    (out / results.CAMPAIGN_MD).write_text("\n".join(lines) + "\n")
    from cluster.htmlreport import write_markdown_page

    write_markdown_page(out, results.CAMPAIGN_MD, f"campaign {fault}")


def _plot(path: Path, fault: str, rows: list[dict], runners: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name in runners:
        pts = sorted((r["strength"], r["passed"] / r["met"]) for r in rows if r["runner"] == name and r["met"])
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel(f"{fault}: {KNOBS.get(fault, 'strength')}")
    ax.set_ylabel("tasks that passed / met the fault")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
