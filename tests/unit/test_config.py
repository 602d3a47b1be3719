import orjson
import pytest

from cluster.config import ConfigError, build_config, load_config
from faults.base import CATALOG


def test_defaults_are_valid():
    cfg = build_config({})
    assert cfg.runner == "durable" and cfg.faults == []


def test_unknown_fault_names_field_value_and_choices():
    with pytest.raises(ConfigError) as e:
        build_config({"faults": ["PK1", "XX9"]})
    msg = str(e.value)
    assert "`faults`" in msg and "XX9" in msg and ", ".join(sorted(CATALOG)) in msg


def test_unknown_field_lists_the_allowed_ones():
    with pytest.raises(ConfigError) as e:
        build_config({"sandbox": {"backnd": "process"}})
    assert "sandbox.backnd" in str(e.value) and "backend" in str(e.value)


def test_out_of_range_value():
    with pytest.raises(ConfigError, match="concurrency"):
        build_config({"concurrency": 0})


def test_faults_as_comma_string_and_overrides():
    cfg = build_config({"faults": "PK1, ST1"}, {"runner": "naive", "tasks": None})
    assert cfg.faults == ["PK1", "ST1"] and cfg.runner == "naive" and cfg.tasks == 4


def test_yaml_file_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_runner_as_a_command_mapping(tmp_path):
    (tmp_path / "agent.py").write_text("print('hi')\n")
    cfg = build_config({"runner": {"command": "python3 agent.py --fast", "workdir": str(tmp_path),
                                   "env": {"MY_FLAG": "1"}}})
    spec = cfg.runner_spec()
    assert spec["command"] == ["python3", str(tmp_path / "agent.py"), "--fast"]
    assert spec["env"] == {"MY_FLAG": "1"} and spec["name"] == tmp_path.name


def test_builtin_runner_is_a_script_command():
    spec = build_config({"runner": "naive"}).runner_spec()
    assert spec["builtin"] == "naive" and spec["command"][-1].endswith("fleet/runners/naive.py")


def test_bad_runner_specs_name_the_field():
    with pytest.raises(ConfigError, match="runner") as e:
        build_config({"runner": "nope"})
    assert "durable, durable-local, naive" in str(e.value)
    with pytest.raises(ConfigError, match="workdir"):
        build_config({"runner": {"command": "x", "workdir": "/no/such/dir"}})
    with pytest.raises(ConfigError, match="SANDFLEET_TASK_ID"):
        build_config({"runner": {"command": "x", "env": {"SANDFLEET_TASK_ID": "t9"}}})
    with pytest.raises(ConfigError, match="command"):
        build_config({"runner": {"command": []}})
    with pytest.raises(ConfigError, match="runner.comand"):
        build_config({"runner": {"comand": "x"}})


def test_league_config_errors_name_the_field(tmp_path):
    from cluster.league import load_league

    p = tmp_path / "l.yaml"
    p.write_text("runners: [durable, nope]\n")
    with pytest.raises(ConfigError, match="nope"):
        load_league(p)
    p.write_text("runners: [durable]\nfault_sets: [[PK9]]\n")
    with pytest.raises(ConfigError, match="PK9"):
        load_league(p)
    p.write_text("runners: [durable]\nwave: {tasks: 0}\n")
    with pytest.raises(ConfigError, match="tasks"):
        load_league(p)
    p.write_text("")
    with pytest.raises(ConfigError, match="non-empty"):
        load_league(p)
    p.write_text("runners: [durable, naive]\nfault_sets: [[PK1], []]\nwave: {seed: 3}\n")
    waves = load_league(p).waves()
    assert [(n, f.faults) for n, f, _ in waves] == [("durable", ["PK1"]), ("durable", []), ("naive", ["PK1"]),
                                                     ("naive", [])]
    assert all(c.seed == 3 for _, _, c in waves)


def test_an_unknown_league_field_lists_the_league_fields_not_the_wave_configs(tmp_path):
    """The league's errors went through the wave config's formatter, which walked the wave config: an unknown league
    field was answered with the wave config's fields as the allowed ones."""
    from cluster.league import load_league

    p = tmp_path / "l.yaml"
    p.write_text("runners: [durable]\nbogus: 1\n")
    with pytest.raises(ConfigError) as err:
        load_league(p)
    assert "invalid league config" in str(err.value) and "field `bogus`: value 1: unknown field" in str(err.value)
    assert "allowed fields here: fault_sets, name, runners, wave" in str(err.value), str(err.value)


def test_a_league_fault_set_carries_wave_fields_of_its_own(tmp_path):
    """PK1 at every boundary beside the storage family in one league: a set's own wave fields override the
    league's, its label names its rows, and a bad fault id or field inside a set is named."""
    from cluster.league import load_league

    p = tmp_path / "league.yaml"
    p.write_text("runners: [durable]\nwave: {seed: 3, tasks: 2}\nfault_sets:\n"
                 "  - {faults: [PK1], label: PK1@boundaries, wave: {enumerate_boundaries: true, boundaries: 4}}\n"
                 "  - [ST1]\n")
    (_, pk, c1), (_, st, c2) = load_league(p).waves()
    assert (pk.name(), c1.enumerate_boundaries, c1.boundaries) == ("PK1@boundaries", True, 4)
    assert (st.name(), c2.enumerate_boundaries, c2.tasks, c2.seed) == ("ST1", False, 2, 3)
    p.write_text("runners: [durable]\nfault_sets: [{faults: [PK9]}]\n")
    with pytest.raises(ConfigError, match="PK9"):
        load_league(p)
    p.write_text("runners: [durable]\nfault_sets: [{faults: [ST1], wave: {enumerate_boundaries: true}}]\n")
    with pytest.raises(ConfigError, match="enumerate_boundaries"):
        load_league(p)
    p.write_text("runners: [durable]\nfault_sets: [{faults: [PK1], wave: {faults: [ST1]}}]\n")
    with pytest.raises(ConfigError, match=r"fault_sets\[0\]\.wave: 'faults' is not a wave field a set may set"):
        load_league(p)
    p.write_text("runners: [durable]\nfault_sets: [{faults: [PK1], colour: red}]\n")
    with pytest.raises(ConfigError, match=r"fault_sets\[0\]: unknown field 'colour'.*faults, label, wave") as e:
        load_league(p)
    assert "list[str]" not in str(e.value), e.value


@pytest.mark.parametrize("data, field", [
    ({"nodes": 3, "address": "auto"}, "field `nodes`: value 3"),
    ({"faults": ["PK3"]}, "field `faults`: value ['PK3']"),
    ({"sandbox": {"image": "x"}}, "field `sandbox.image`: value 'x'"),
    ({"fault_timing": {"PK1": {"after_model_calls": [1, 2], "after_effects": [1, 1]}}},
     "field `fault_timing.PK1.after_model_calls`"),
    ({"fault_timing": {"PK1": {"bogus": 1}}}, "allowed fields here: after_checkpoints"),
    # a check on one fault's timing names that fault's field, not a field of fault_timing with value None
    ({"fault_timing": {"ST1": {"after_effects": [1, 2]}}}, "field `fault_timing.ST1.after_effects`: value [1, 2]"),
    ({"fault_timing": {"PK5": {"at_s": [1, 2]}}}, "field `fault_timing.PK5.at_s`: value [1, 2]"),
    ({"fault_timing": {"CR1": {"hits": 3}}}, "field `fault_timing.CR1.hits`: value 3"),
])
def test_a_check_across_fields_names_the_field_it_is_about(data, field):
    with pytest.raises(ConfigError) as exc:
        build_config(data)
    assert field in str(exc.value) and "(top level)" not in str(exc.value), str(exc.value)


def test_a_key_given_twice_is_an_error_not_the_last_one_winning(tmp_path):
    cfg = tmp_path / "w.yaml"
    cfg.write_text("tasks: 2\nsandbox: {memory_mb: 128}\ntasks: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    assert "'tasks' is given twice" in str(e.value) and "line 3" in str(e.value), str(e.value)
    cfg.write_text("tasks: 2\nsandbox: {memory_mb: 128, memory_mb: 256}\n")  # nested mappings too
    with pytest.raises(ConfigError, match="'memory_mb' is given twice"):
        load_config(cfg)


@pytest.mark.parametrize("health, field", [
    ({"answer_s": 0}, "field `health.answer_s`: value 0"),
    ({"strikes": 0}, "field `health.strikes`: value 0"),
    ({"actor_timeout_s": "soon"}, "field `health.actor_timeout_s`: value 'soon'"),
    ({"probe": 1}, "allowed fields here: actor_strikes, actor_timeout_s, answer_s, strikes"),
])
def test_health_knobs_are_checked(health, field):
    with pytest.raises(ConfigError) as exc:
        build_config({"health": health})
    assert field in str(exc.value), str(exc.value)
    assert build_config({"health": {"answer_s": 1.5}}).health.answer_s == 1.5
    assert build_config({}).health.model_dump() == {"answer_s": 3.0, "strikes": 3, "actor_timeout_s": 5.0,
                                                    "actor_strikes": 3}


def test_an_external_stores_secret_never_reaches_the_plan_and_comes_back_from_the_environment(monkeypatch):
    from cluster.config import REDACTED, STORE_SECRET_ENV, ConfigError, build_config
    from cluster.wave.plan import build_plan

    secret = "s3cr3t-" + "x" * 33
    cfg = build_config({"store": {"url": "http://127.0.0.1:9", "access_key": "AK", "secret_key": secret}})
    plan = build_plan(cfg, "w-test")
    assert secret not in orjson.dumps(plan).decode() and plan["config"]["store"]["secret_key"] == REDACTED
    monkeypatch.delenv(STORE_SECRET_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"store.secret_key.*SANDFLEET_STORE_SECRET_KEY"):
        build_config(plan["config"])  # what resume and replay do
    monkeypatch.setenv(STORE_SECRET_ENV, secret)
    assert build_config(plan["config"]).store.secret_key == secret
    assert build_plan(build_config({}), "w-test")["config"]["store"]["secret_key"] is None  # embedded: nothing to hide


def test_shrink_refuses_what_it_cannot_shrink_before_anything_runs(tmp_path):
    """A passed task: nothing to shrink (exit 0, nothing run); a runner whose code changed since the wave: refused
    (254) unless --anyway, and the rest of the manifest that differs (a kernel) is warned about; candidates are each
    one step smaller, in a fixed order."""
    import subprocess
    import sys

    import orjson

    from cluster import manifest
    from cluster.artifacts import reference_key
    from cluster.config import build_config
    from cluster.shrink import candidates, size

    cfg = build_config({"faults": ["PK1", "ST1"], "tasks": 1})
    runner = {"name": "naive", "command": [sys.executable, "-c", "pass"], "env": {}}
    task = {"task_id": "t000", "role": "task", "seed": 3, "runner": "naive", "steps": 8, "workload": "patch-repo",
            "reference": {"task_id": "ref-t000", "key": "0" * 32},
            "faults": [{"fault_id": "PK1", "instance": "t000-PK1", "task_id": "t000", "trigger": "model_call", "at_s": 0.0,
                        "window_s": None, "params": {"after": 4}},
                       {"fault_id": "ST1", "instance": "t000-ST1", "task_id": "t000", "trigger": "time", "at_s": 1.0, "window_s": 2.0,
                        "params": {}}]}
    cands = candidates(task, runner)
    assert [w for w, _ in cands][:2] == ["without t000-PK1 (PK1)", "without t000-ST1 (ST1)"]
    assert all(size(t) < size(task) for _, t in cands), [(w, size(t)) for w, t in cands]
    assert cands[-1][0] == "4 steps instead of 8" and cands[-1][1]["reference"]["key"] != "0" * 32, cands[-1]
    assert [w for w, _ in cands][2:5] == ["t000-PK1: after model_call 2 instead of 4", "t000-ST1: at 0.5 s instead "
                                          "of 1.0 s", "t000-ST1: a 1.0 s window instead of 2.0 s"]
    d = tmp_path / "w-1"
    d.mkdir()
    plan = {"wave_id": "w-1", "seed": 3, "config": cfg.public_dump(), "runner": runner, "tasks": [task],
            "references": [],
            "manifest": manifest.build(cfg, runner, "old")}
    plan["manifest"]["workload"]["code_digest"] = "old"
    plan["manifest"]["machine"]["kernel"] = "5.10.0-other"  # the rest of the manifest: warned about, not refused
    (d / "plan.json").write_bytes(orjson.dumps(plan))
    (d / "t000.grade.json").write_bytes(orjson.dumps({"verdict": "pass", "signature": None}))
    run = [sys.executable, "-m", "cluster.cli", "shrink", str(d / "t000"), "--no-progress"]
    p = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "nothing to shrink" in p.stdout, (p.stdout, p.stderr)
    (d / "t000.grade.json").write_bytes(orjson.dumps({"verdict": "fail", "signature": "no_model_recall"}))
    p = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert p.returncode == 254 and "runner.code_digest: 'old'" in p.stderr and "--anyway" in p.stderr, p.stderr
    assert reference_key(runner, "", 0, 0) in p.stderr
    assert "warning: manifest differs from what runs now: machine.kernel: '5.10.0-other' != " in p.stderr, p.stderr
    assert p.stderr.count("manifest differs from what runs now") == 1, p.stderr  # nothing else differs
    p = subprocess.run(run[:-2] + [str(d / "t009")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 254 and "has no task 't009'" in p.stderr, p.stderr
    for bad in (b"[1, 2]", b'{"verdict": 5}', b'{"verdict": "fail"}'):  # valid JSON, not a grade: damaged, exit 2
        (d / "t000.grade.json").write_bytes(bad)
        p = subprocess.run(run, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "is damaged" in p.stderr and "Traceback" not in p.stderr, (bad, p.stderr)
    assert not list(tmp_path.glob("w-2*"))  # nothing ran


def test_a_cell_that_flips_across_waves_on_one_manifest_is_flaky():
    from cluster.serve import cell_trends

    def row(wave, created, verdict, key):
        return {"wave_id": wave, "created": created, "manifest_key": key,
                "tasks": [{"cell": "durable × patch-repo × PK1", "verdict": verdict},
                          {"cell": "durable × patch-repo × ST1", "verdict": "pass"}]}

    t = cell_trends([row("w3", 3, "pass", "m1"), row("w1", 1, "pass", "m1"), row("w2", 2, "fail", "m1")])
    assert [v for _, v, _ in t["durable × patch-repo × PK1"]["history"]] == ["pass", "fail", "pass"]
    assert t["durable × patch-repo × PK1"]["flaky"] and not t["durable × patch-repo × ST1"]["flaky"]
    t = cell_trends([row("w1", 1, "pass", "m1"), row("w2", 2, "fail", "m2")])  # the code changed between them
    assert not t["durable × patch-repo × PK1"]["flaky"]


def test_serve_names_a_damaged_wave_on_its_row_and_renders_the_others(tmp_path):
    """Valid JSON of the wrong shape (found by a hostile review: one such wave emptied the whole index)."""
    from cluster.serve import collect, index_html

    for name, plan, verdict in (("w-1", b'{"wave_id": "w-1", "tasks": "x"}', None),
                                ("w-2", b'{"wave_id": "w-2", "tasks": []}', b'"pass"'),
                                ("w-3", b'{"wave_id": "w-3", "tasks": []}', b'{"verdict": null, "tasks": null}'),
                                ("w-4", b'[]', None),
                                ("w-5", b'{"wave_id": "w-5", "created_at": 5, "tasks": [], "runner": {"name": "d"}}',
                                 b'{"verdict": "pass", "tasks": [{"task_id": "t0", "verdict": "pass", "cell": "c"}]}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "plan.json").write_bytes(plan)
        if verdict is not None:
            (tmp_path / name / "verdict.json").write_bytes(verdict)
    (tmp_path / "w-5" / "t1.grade.json").write_bytes(b"[1, 2]")  # beside a good verdict.json: not read
    rows = {r["dir"]: r for r in collect(tmp_path)}
    assert set(rows) == {"w-1", "w-2", "w-3", "w-4", "w-5"}
    assert all(any("damaged" in p for p in rows[w]["problems"]) for w in ("w-1", "w-2", "w-3", "w-4")), rows
    assert rows["w-5"]["problems"] == [] and rows["w-5"]["verdict"] == "pass"
    page = index_html(tmp_path, list(rows.values()))
    assert all(w in page for w in rows) and page.count("damaged") >= 4


def test_a_fleet_wave_with_its_own_store_url_is_bad_input_naming_both():
    with pytest.raises(ConfigError, match="address 'fleet' runs on the fleet's own store; store.url 'http://x:1'"):
        build_config({"address": "fleet", "store": {"url": "http://x:1", "access_key": "a", "secret_key": "b"}})


def test_the_config_edge_cases_a_hostile_review_found_are_named(tmp_path):
    """Issue 42, finding 9: each was accepted silently or named wrongly; each is now exit 254's error, naming the
    field, the value and what is allowed."""
    import os
    import subprocess
    import sys

    def err(data) -> str:
        with pytest.raises(ConfigError) as e:
            build_config(data)
        return str(e.value)

    assert "field `faults`: value {'PK1': 1}: faults must be a list" in err({"faults": {"PK1": 1}})
    assert "NUL byte" in err({"runner": {"name": "x", "command": ["a\0b"]}})
    got = err({"store": {"url": "http://u:p@127.0.0.1:9", "access_key": "a", "secret_key": "b"}})
    assert "field `store.url`" in got and "store.access_key" in got
    f = tmp_path / "c.yaml"
    f.write_text("faults: [PK1]\nfault_timing: {ST1: {after_model_calls: [1, 2]}}\n")
    with pytest.raises(ConfigError, match=r"field `fault_timing.ST1`.*does not run.*\['PK1'\]"):
        load_config(f)
    assert load_config(f, {"faults": ["ST1"]}).faults == ["ST1"]  # --faults replaces the file's list
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for p in (fifo, "/dev/zero"):
        with pytest.raises(ConfigError, match="is not a regular file"):
            load_config(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    p = subprocess.run([sys.executable, "-m", "cluster.cli", "wave", "run", "--results", ""], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert p.returncode == 254 and "--results" in p.stderr and "empty" in p.stderr, p.stderr
    assert not list(tmp_path.glob("w-*")), "a wave ran into the current directory"
