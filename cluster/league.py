"""The durability league: the same seeded waves over several runners and fault sets.

`sandfleet league CONFIG` runs one wave per (runner, fault set) with the same seed,
on one fleet, and writes `LEAGUE.md` and `league.png` from the graded waves:
resume survival rate, double-apply tasks, wasted model calls and tokens per
interruption, time to resume, per-step time of the uninterrupted reference runs,
each with its sample size. Every figure is recomputed from the stored waves.
"""
from __future__ import annotations

import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import orjson
import yaml
from pydantic import Field, ValidationError, field_validator

from cluster import results
from cluster.config import ConfigError, RunnerSpec, Strict, WaveConfig, build_config, load_yaml, parse_runner
from cluster.config_yaml import yaml_problem
from cluster.config_errors import format_error, is_config_name, mask_urls, shown
from faults.base import CATALOG


class FaultSet(Strict):
    """A fault set with wave fields of its own, over the league's `wave` (e.g. `enumerate_boundaries` for PK1 beside
    storage faults on a fixed task count)."""
    faults: list[str]
    label: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9 +@._-]{0,40}$",
                              description="the row's name in LEAGUE.md (default: the fault ids joined by +)")
    wave: dict = Field(default_factory=dict, description="wave fields of this set's waves, over the league's")

    def name(self) -> str:
        return self.label or "+".join(self.faults) or "none"


class LeagueConfig(Strict):
    name: str = Field("league", pattern=r"^[a-z0-9][a-z0-9-]{0,30}$")
    runners: list[str | RunnerSpec] = Field(..., min_length=1)
    fault_sets: list[list[str] | FaultSet] = Field(default_factory=lambda: [["PK1"], ["ST1"], ["PK1", "ST1"]],
                                                   min_length=1)
    wave: dict = Field(default_factory=dict, description="wave fields shared by every wave (tasks, seed, ...)")

    @field_validator("runners", mode="before")
    @classmethod
    def _runners(cls, v):
        if not isinstance(v, list):
            raise ValueError("runners must be a list of built-in names or runner mappings")
        return [parse_runner(r) for r in v]

    @field_validator("fault_sets", mode="before")
    @classmethod
    def _sets(cls, v):
        """A mapping is a FaultSet, named by its index on error (not the union's two errors), and its `wave` may
        not carry the fields the set and the league own."""
        if not isinstance(v, list):
            return v
        out = []
        for i, item in enumerate(v):
            if isinstance(item, dict):
                unknown = sorted(set(item) - set(FaultSet.model_fields))
                if unknown:
                    key = unknown[0]
                    what = f"unknown field {key!r} (value {shown(item[key], (key,), unknown=True)})" \
                        if is_config_name(key) else "a key that is not a config name (not shown)"
                    raise ValueError(f"fault_sets[{i}]: {what}; a fault set mapping has: "
                                     f"{', '.join(FaultSet.model_fields)}")
                owned = sorted(set(item.get("wave") or {}) & {"faults", "runner"})
                if owned:
                    raise ValueError(f"fault_sets[{i}].wave: {owned[0]!r} is not a wave field a set may set (the "
                                     "set's own `faults` and the league's `runners` say it); remove it")
                try:
                    item = FaultSet(**item)
                except ValidationError as err:
                    e = err.errors()[0]
                    where = ".".join(str(x) for x in e["loc"])
                    raise ValueError(f"fault_sets[{i}].{where}: {mask_urls(e['msg'])} (value "
                                     f"{shown(e.get('input'), tuple(e['loc']))})") from None
            out.append(item)
        return out

    @field_validator("fault_sets")
    @classmethod
    def _faults(cls, v):
        for fs in v:
            bad = [f for item in (fs.faults if isinstance(fs, FaultSet) else fs) for f in item.split("+")
                   if f not in CATALOG]
            if bad:
                raise ValueError(f"unknown fault id {bad[0]!r}; valid fault ids: {', '.join(sorted(CATALOG))}")
        return v

    def sets(self) -> list[FaultSet]:
        return [fs if isinstance(fs, FaultSet) else FaultSet(faults=fs) for fs in self.fault_sets]

    def waves(self) -> list[tuple[str, FaultSet, WaveConfig]]:
        out = []
        for r in self.runners:
            for fs in self.sets():
                cfg = build_config({**self.wave, **fs.wave, "runner": r.model_dump() if isinstance(r, RunnerSpec)
                                    else r, "faults": fs.faults}, source=f"league wave ({fs.name()})")
                out.append((cfg.runner_spec()["name"], fs, cfg))
        return out


def load_league(path: Path) -> LeagueConfig:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"league config {str(p)!r} does not exist")
    try:
        data = load_yaml(p.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"league config {str(p)!r} is not valid YAML: {yaml_problem(err)}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"league config {str(p)!r}: top level must be a non-empty mapping")
    try:
        league = LeagueConfig(**data)
    except ValidationError as err:
        raise ConfigError(format_error(err, str(p), LeagueConfig).replace("invalid wave config",
                                                                        "invalid league config")) from None
    league.waves()  # every wave's config must be valid before anything runs
    return league


def wave_metrics(result: dict, d: Path) -> dict:
    """The league's figures for one graded wave, from its stored files."""
    grades = result["tasks"]
    timeline = results.read_jsonl(d / results.TIMELINE)
    # as SUMMARY counts them (report.py): a kill that landed before the attempt did anything durable
    # (`not_exercised`, the task not_applied) tests no recovery, so it is in neither the numerator nor the n; nor is
    # a kill whose receipt names no sandbox of the task (`kill_not_shown`: not shown to have interrupted a run)
    interrupted = [g for g in grades if g["interrupted"] and g.get("ended", True) and not g.get("not_exercised")
                   and not g.get("kill_not_shown")]
    workload = result["plan"]["config"]["workload"]

    def count(pred) -> int:
        return sum(1 for g in grades if pred(g))

    return {
        "wave_id": result["wave_id"], "verdict": result["verdict"], "tasks": len(grades),
        "pass": count(lambda g: g["verdict"] == "pass"),
        "interrupted": len(interrupted), "survived": sum(1 for g in interrupted if g["verdict"] == "pass"),
        "double_apply": count(lambda g: (g["checks"].get("no_double_apply") or {}).get("verdict") == "fail"),
        "recalls": sum(g.get("model_recalls") or 0 for g in grades),
        "interruptions": sum(max(0, g["attempts"] - 1) for g in grades),
        "wasted_calls": sum(g.get("wasted_calls") or 0 for g in grades),
        "wasted_tokens": sum(g.get("wasted_tokens") or 0 for g in grades),
        "resume_s": _resume_times(interrupted, timeline, results.read_jsonl(d / results.MODEL_CALLS)),
        "per_step_overhead_s": _per_step(timeline, workload["steps"], workload["think_ms"] / 1000),
        "write_ms_per_step": [g["store_write_ms_per_step"] for g in grades
                              if isinstance(g.get("store_write_ms_per_step"), (int, float))],
        "not_applied": count(lambda g: g["verdict"] == "not_applied"),
        "unknown": count(lambda g: g["verdict"] == "unknown"),
    }


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (95 % by default): honest at small n and at 0 or n,
    where a plain k/n +- interval is not (8 kills a row is a small sample for a percentage)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / den
    return max(0.0, mid - half), min(1.0, mid + half)


# DCP-2.0's four deterministic kill windows (004_*.txt) as sandfleet's boundaries
DCP_WINDOWS = (("PROMPT", "right after the Nth model answer is delivered (`after_model_calls`), before the runner "
                          "records it"),
               ("EXEC", "inside a tool's run: a named window the runner announces (PK5 `after_checkpoints`), or the "
                        "longtool workload's shell step"),
               ("WRITE", "at the Nth store write (`after_store_writes`, the ambiguous variant holds its answer), or on "
                         "a crash-mode disk mid-append (`sandbox.disk: torn`): SENTINEL_WRITE"),
               ("VERIFY", "right after the Nth external effect was answered (`after_effects`)"))


def dcp_lines(rows: list[dict]) -> list[str]:
    """Per runner, the league in DCP-2.0's columns: Rcrash with its 95 % interval, Tresume, Wtoken, write overhead."""
    out = ["", "In DCP-2.0's terms (`004`): Rcrash = interrupted tasks that passed, with a 95 % Wilson interval; "
               "Tresume = time to resume p50; Wtoken = model tokens wasted per interruption; write overhead = store "
               "write time per step p50 (the runner's own commits through the proxy).", "",
           "| runner | Rcrash | 95 % interval | Tresume p50 | Wtoken | write overhead per step p50 |",
           "|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["runner"] for r in rows):
        mine = [r for r in rows if r["runner"] == name]
        k, n = sum(r["survived"] for r in mine), sum(r["interrupted"] for r in mine)
        lo, hi = wilson(k, n)
        inter = sum(r["interruptions"] for r in mine)
        wtok = f"{sum(r['wasted_tokens'] for r in mine) / inter:.0f} (n={inter})" if inter else "n/a"
        writes = [x for r in mine for x in r.get("write_ms_per_step") or []]
        out.append(f"| {name} | " + (f"{k / n:.1%} ({k}/{n})" if n else "n/a (0 interrupted)") + " | "
                   + (f"{lo:.0%}-{hi:.0%}" if n else "n/a") + f" | {_med([x for r in mine for x in r['resume_s']])} | "
                   f"{wtok} | " + (f"{sorted(writes)[len(writes) // 2]:.1f} ms" if writes else "n/a") + " |")
    out += ["", "DCP-2.0's kill windows, as sandfleet's boundaries:", ""]
    out += [f"- {w}: {what}" for w, what in DCP_WINDOWS]
    return out


def _resume_times(interrupted: list[dict], timeline: list[dict], calls: list[dict]) -> list[float]:
    """From each interrupted attempt's end to the next attempt's first call for a step never asked before."""
    out = []
    for g in interrupted:
        tid = g["task_id"]
        mine = sorted((c for c in calls if c["task"] == tid), key=lambda c: c["t"])
        for e in timeline:
            if e.get("task") != tid or e["event"] != "attempt_end" or e.get("exit_code") == 0 \
                    or e.get("ended_at") is None:
                continue
            t_end = e["ended_at"]
            asked = {c["step"] for c in mine if c["t"] <= t_end}
            nxt = next((c for c in mine if c["t"] > t_end and c["step"] not in asked), None)
            if nxt is not None:
                out.append(nxt["t"] - t_end)
    return out


def _per_step(timeline: list[dict], steps: int, think_s: float) -> list[float]:
    """Per-step time of the uninterrupted reference runs, less the model's think time."""
    return [(e["ended_at"] - e["started_at"]) / (steps + 1) - think_s for e in timeline
            if e["event"] == "attempt_end" and e.get("task", "").startswith("ref-") and e.get("exit_code") == 0
            and e.get("started_at") and e.get("ended_at")]


def run_league(league: LeagueConfig, results_root: Path, progress: bool = True, fleet=None) -> Path:
    """Run every wave of the league on one fleet (a lent one is left running) and write LEAGUE.md."""
    from cluster.driver import WaveRun
    from cluster.raycluster import FleetSession

    ts = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    out = Path(results_root).resolve() / f"league-{league.name}-{ts}"
    out.mkdir(parents=True)
    rows = []
    own = fleet is None
    try:
        for name, fs, cfg in league.waves():
            if fleet is None:
                fleet = FleetSession.lent_for(cfg)
            t = time.perf_counter()
            wave = WaveRun(cfg, out / "waves", progress=progress, fleet=fleet)
            result = wave.run()
            m = wave_metrics(result, wave.dir)
            m.update(runner=name, faults=fs.faults, label=fs.name(), wall_s=round(time.perf_counter() - t, 1),
                     harness_errors=result.get("harness_errors", []), manifest=wave.plan.get("manifest"))
            rows.append(m)
            (out / results.LEAGUE_JSON).write_bytes(
                orjson.dumps({"config": league.model_dump(mode="json"), "rows": rows}, option=orjson.OPT_INDENT_2))
    finally:
        if own and fleet is not None:
            fleet.stop()
    write_league(out, league, rows)
    return out


def manifest_warnings(rows: list[dict]) -> list[str]:
    """Waves of the league that ran on something else than its first wave (anything but the runner, which a league
    varies on purpose, and the seed): their figures are not comparable as they stand."""
    from cluster.manifest import differences

    if not rows:
        return []
    out = []
    for r in rows[1:]:
        diff = differences(rows[0].get("manifest"), r.get("manifest"))
        if diff:
            out.append(f"- `{r['wave_id']}` ({r['runner']}) differs from `{rows[0]['wave_id']}`: "
                       + "; ".join(diff[:6]))
    return ["", "**Warning: these waves ran on different things; compare them with care:**", ""] + out if out else []


def _label(row: dict) -> str:
    return row.get("label") or "+".join(row["faults"]) or "none"


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.0f} ms (n={len(xs)})" if xs else "n/a"


def write_league(out: Path, league: LeagueConfig, rows: list[dict]) -> None:
    seed = league.wave.get("seed", 1)
    lines = [f"# Durability league `{league.name}`", "",
             f"Seed {seed}; tasks per wave in the pass column; every wave is stored under "
             f"`waves/` and can be re-graded with `sandfleet grade`. Rates are over the tasks whose attempts were "
             "really interrupted (n given).", "",
             "| runner | faults | verdict | pass | resume survival | double-apply tasks | recalls | "
             "wasted calls / tokens per interruption | time to resume p50 | wave |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rsr = f"{r['survived']}/{r['interrupted']}" if r["interrupted"] else "n/a (0 interrupted)"
        per = (f"{r['wasted_calls'] / r['interruptions']:.2f} / {r['wasted_tokens'] / r['interruptions']:.0f}"
               f" (n={r['interruptions']})" if r["interruptions"] else "n/a")
        lines.append(f"| {r['runner']} | {_label(r)} | {r['verdict']} | "
                     f"{r['pass']}/{r['tasks']} | "
                     f"{rsr} | {r['double_apply']}/{r['tasks']} | {r['recalls']} | {per} | {_med(r['resume_s'])} | "
                     f"`{r['wave_id']}` |")
    lines += ["", "Per runner, over every wave above:", "",
              "| runner | tasks passed | resume survival | double-apply tasks | recalls | "
              "wasted calls per interruption | time to resume p50 | runner time per step p50 |",
              "|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["runner"] for r in rows):
        mine = [r for r in rows if r["runner"] == name]
        tot = {k: sum(r[k] for r in mine) for k in ("tasks", "pass", "interrupted", "survived", "double_apply",
                                                      "recalls", "interruptions", "wasted_calls")}
        rsr = f"{tot['survived']}/{tot['interrupted']} ({tot['survived'] / tot['interrupted']:.0%})" \
            if tot["interrupted"] else "n/a"
        per = f"{tot['wasted_calls'] / tot['interruptions']:.2f} (n={tot['interruptions']})" \
            if tot["interruptions"] else "n/a"
        lines.append(f"| {name} | {tot['pass']}/{tot['tasks']} | {rsr} | {tot['double_apply']}/{tot['tasks']} | "
                     f"{tot['recalls']} | {per} | {_med([x for r in mine for x in r['resume_s']])} | "
                     f"{_med([x for r in mine for x in r['per_step_overhead_s']])} |")
    lines += dcp_lines(rows)
    lines += manifest_warnings(rows)
    lines += ["", "Time to resume: from the end of an interrupted attempt to the next attempt's first model call "
              "for a step never asked before. Runner time per step: an uninterrupted reference run's wall time per "
              "model call, minus the model's think time: what the runner itself spends per step (its start-up "
              "spread over the steps, journal commits, tools).", ""]
    try:
        _plot(out / results.LEAGUE_PNG, rows)
        lines.append("![league](league.png)")
    except Exception as exc:  # noqa: BLE001
        lines.append(f"(picture not drawn: {exc})")
    (out / results.LEAGUE_MD).write_text("\n".join(lines) + "\n")
    from cluster.htmlreport import write_markdown_page

    write_markdown_page(out, results.LEAGUE_MD, f"league {league.name}")


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runners = list(dict.fromkeys(r["runner"] for r in rows))
    fsets = list(dict.fromkeys(_label(r) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5 + 0.2 * len(runners)))
    width = 0.8 / max(1, len(fsets))
    for j, fs in enumerate(fsets):
        rsr, wasted = [], []
        for name in runners:
            r = next((x for x in rows if x["runner"] == name and _label(x) == fs), None)
            # no bar (not a zero) where nothing was interrupted: a rate over no tasks is not 0 %
            rsr.append(r["survived"] / r["interrupted"] if r and r["interrupted"] else float("nan"))
            wasted.append(r["wasted_calls"] / r["interruptions"] if r and r["interruptions"] else float("nan"))
        xs = [i + j * width for i in range(len(runners))]
        axes[0].bar(xs, rsr, width, label=fs)
        axes[1].bar(xs, wasted, width, label=fs)
    for ax, title in ((axes[0], "resume survival rate (no bar: nothing interrupted)"),
                      (axes[1], "wasted model calls per interruption")):
        ax.set_xticks([i + width * (len(fsets) - 1) / 2 for i in range(len(runners))], runners, rotation=15)
        ax.set_title(title)
    axes[0].set_ylim(0, 1.05)
    axes[0].legend(title="faults", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
