"""`sandfleet shrink` and `sandfleet serve` on real waves: a failing task's fault plan made smaller, run by run, until
no smaller plan fails with the same signature (or the budget is used up); then the results root that holds the
wave and every run of the shrink, listed by `serve` to a real HTTP client."""
from __future__ import annotations

import subprocess
import sys
import urllib.request

import orjson
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shrunk(fleet, tmp_path_factory):
    import ray

    from cluster.config import build_config
    from cluster.driver import WaveRun

    root = tmp_path_factory.mktemp("shrink-results")
    # the negative control's deterministic failure (test_wave.py): the kill lands while the proxy holds naive's
    # first progress save, beside an outage that has nothing to do with it: shrinking must drop the outage
    cfg = build_config(dict(runner="naive", faults=["PK1", "ST1"], tasks=1, concurrency=1, seed=11,
                            workload={"steps": 10, "think_ms": 30}, deadline_s=90,
                            fault_timing={"PK1": {"at_request": {"methods": ["PUT"], "key_prefix": "naive/progress.json"}},
                                          "ST1": {"after_model_calls": [2, 6]}}))
    wave = WaveRun(cfg, root, progress=False, fleet=fleet)
    result = wave.run()
    # through `latest`, as a user types it: the shrink's runs move `latest`, and it must come back to this wave
    p = subprocess.run([sys.executable, "-m", "cluster.cli", "shrink", str(root / "latest" / "t000"), "--budget", "5",
                        "--address", ray.get_runtime_context().gcs_address, "--no-progress"],
                       capture_output=True, text=True, timeout=600)
    return result, wave.dir, p


def test_shrink_finds_a_smaller_plan_that_fails_the_same_way_and_records_every_run(shrunk):
    result, d, p = shrunk
    g = result["tasks"][0]
    assert g["verdict"] == "fail" and g["signature"], g
    assert p.returncode == 0, p.stderr[-3000:]
    assert (d.parent / "latest").resolve() == d.resolve()
    rec = orjson.loads((d / "shrink-t000.json").read_bytes())
    assert rec["reproduced"] and rec["signature"] == g["signature"], rec
    tried = rec["tried"]
    assert 2 <= len(tried) <= 5 and tried[0]["what"] == "as it ran", tried
    assert all(t["verdict"] in ("pass", "fail", "unknown", "not_applied") for t in tried), tried
    best = rec["smallest"]
    assert best["verdict"] == "fail" and best["signature"] == g["signature"], best
    assert best["size"] < tried[0]["size"], (best, tried[0])  # smaller than the plan as it ran
    assert [f["fault_id"] for f in best["faults"]] == ["PK1"], best  # the outage was not part of the failure
    # every run is a wave of its own under the same results root, and the one printed replays the smallest plan
    assert f"replay it: sandfleet wave replay {d.parent / best['wave_id'] / 't000'}" in p.stdout, p.stdout
    plan = orjson.loads((d.parent / best["wave_id"] / "plan.json").read_bytes())
    assert [f["instance"] for f in plan["tasks"][0]["faults"]] == [f["instance"] for f in best["faults"]], plan


def test_serve_lists_every_wave_of_a_results_root_and_serves_their_pages(shrunk):
    _, d, _ = shrunk
    root = d.parent
    waves = sorted(x.name for x in root.iterdir() if (x / "plan.json").is_file() and not x.is_symlink())
    assert len(waves) >= 3, waves
    (root / waves[-1] / "verdict.json").write_bytes(b'{"verdict": "pass", "tasks": [')  # damaged: named, not fatal
    proc = subprocess.Popen([sys.executable, "-m", "cluster.cli", "serve", str(root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving" in line and "http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
        url = line.split(" at ", 1)[1].split()[0]
        page = urllib.request.urlopen(url, timeout=30).read().decode()
        assert all(w in page for w in waves), page[:2000]
        assert "verdict.json: damaged" in page, page[:3000]
        assert "Cells across waves" in page and "naive × patch-repo × " in page, page[:3000]
        one = urllib.request.urlopen(f"{url}w/{waves[0]}/index.html", timeout=30)
        assert one.status == 200 and waves[0] in one.read().decode()
        for bad in (f"w/{waves[0]}/../../etc/passwd", "w/../etc/passwd", f"w/{waves[0]}/%2e%2e/%2e%2e/etc/hostname"):
            try:
                urllib.request.urlopen(url + bad, timeout=30)
                raise AssertionError(f"{bad} was served")
            except urllib.error.HTTPError as exc:
                assert exc.code == 404, bad
    finally:
        proc.terminate()
        proc.wait(timeout=30)
