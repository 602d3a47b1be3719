from fleet import workloads
from fleet.workloads.base import tree_digest

WL = workloads.get("patch-repo")


def apply_script(seed: int, steps: int, twice: tuple = ()) -> dict[str, bytes]:
    """What a faithful runner leaves in repo/: the fixture with every apply_patch line appended."""
    files = {p: t for p, t in WL.fixture(seed).items()}
    for s in WL.script(seed, steps):
        for _ in range(2 if s.step in twice else 1):
            if s.tool == "apply_patch":
                files[s.arguments["path"]] += s.arguments["append"] + "\n"
    return {p: t.encode() for p, t in files.items()}


def test_script_is_fixed_per_seed_and_step():
    assert WL.script(3, 8) == WL.script(3, 8)
    assert [s.arguments for s in WL.script(3, 8)] != [s.arguments for s in WL.script(4, 8)]
    assert WL.script(3, 8)[:5] == WL.script(3, 5)  # a longer script extends a shorter one


def test_script_mixes_workspace_steps_and_external_effects():
    kinds = {s.kind for s in WL.script(3, 8)}
    assert kinds == {"workspace", "effect", "read"}
    eff = WL.effect_steps(3, 8)
    assert eff and all(WL.script(3, 8)[step].tool == "publish" for step in eff.values())


def test_step_markers_count_each_application():
    files = apply_script(3, 8)
    ws_steps = [s.step for s in WL.script(3, 8) if s.kind == "workspace"]
    assert WL.step_counts(files) == {i: 1 for i in ws_steps}
    assert WL.step_counts(apply_script(3, 8, twice=(ws_steps[1],)))[ws_steps[1]] == 2
    assert tree_digest(files) == tree_digest(apply_script(3, 8))
    assert tree_digest(files) != tree_digest(apply_script(4, 8))


# ---------------------------------------------------------------- rename4, hunks8, longtool
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402


def _rename_tree(seed: int, files_done: int) -> tuple[dict[str, bytes], int]:
    """rename4's fixture with the first `files_done` edits of its multi-file apply made."""
    wl = workloads.get("rename4")
    tree = {p: t.encode() for p, t in wl.fixture(seed).items()}
    step = next(s for s in wl.script(seed, 10) if s.files)
    for e in step.arguments["edits"][:files_done]:
        tree[e["path"]] = tree[e["path"]].replace(e["old"].encode(), e["new"].encode())
    return tree, step.step


@pytest.mark.parametrize("seed", [1, 2, 5])
def test_rename4_static_judge_agrees_with_really_running_its_tests(tmp_path, seed):
    """The grader never runs a runner's code; its static reading of the tests must say what running them says."""
    wl = workloads.get("rename4")
    for n in range(5):
        tree, _ = _rename_tree(seed, n)
        d = tmp_path / f"t{n}"
        for p, body in tree.items():
            (d / p).parent.mkdir(parents=True, exist_ok=True)
            (d / p).write_bytes(body)
        real = {name: subprocess.run([sys.executable, "-m", "unittest", "-q", mod], cwd=d,
                                     capture_output=True, timeout=60).returncode == 0
                for name, mod in (("store-only", "tests.test_store"), ("contract", "tests.test_contract"))}
        static = {k: ok for k, (ok, _) in wl.tests(seed, tree).items()}
        assert static == real, (n, static, real)
        # before and after the apply both pass; a torn apply (schema+store only) passes store-only, fails contract
        assert real == {"store-only": n != 1, "contract": n in (0, 4)}


def test_rename4_applied_files_tells_before_after_and_torn():
    wl = workloads.get("rename4")
    for n, want in ((0, {False}), (2, {True, False}), (4, {True})):
        tree, step = _rename_tree(3, n)
        assert set(wl.applied_files(3, 10, step, tree).values()) == want
    assert wl.done_steps(3, 10, _rename_tree(3, 0)[0]) == set()
    assert wl.done_steps(3, 10, _rename_tree(3, 2)[0]) == {_rename_tree(3, 2)[1]}


def test_hunks8_has_eight_distinct_hunks_and_counts_a_duplicate():
    wl = workloads.get("hunks8")
    script = wl.script(4, 8)
    assert len({s.arguments["append"] for s in script}) == 8 and {s.tool for s in script} == {"apply_patch"}
    tree = {p: t for p, t in wl.fixture(4).items()}
    for s in script + [script[3]]:  # step 3's hunk twice: still valid code, caught by its marker
        tree[s.arguments["path"]] += s.arguments["append"] + "\n"
    files = {p: t.encode() for p, t in tree.items()}
    compile(files["src/handlers.py"], "handlers.py", "exec")
    compile(files["src/routes.py"], "routes.py", "exec")
    assert wl.step_counts(files) == {i: (2 if i == 3 else 1) for i in range(8)}


def test_longtool_has_one_seeded_shell_step_that_leaves_a_marker(tmp_path):
    wl = workloads.get("longtool")
    script = wl.script(6, 10)
    tool = [s for s in script if s.tool == "run_command"]
    assert len(tool) == 1 and 1.0 <= wl.tool_seconds(6) <= 4.0
    assert wl.script(6, 10) == script and wl.script(7, 10) != script
    cmd = tool[0].arguments["command"].replace(f"sleep {wl.tool_seconds(6)}", "true")
    subprocess.run(["sh", "-c", cmd], cwd=tmp_path, check=True, timeout=30)
    assert wl.step_counts({"build.log": (tmp_path / "build.log").read_bytes()}) == {tool[0].step: 1}
    assert os.path.exists(tmp_path / "build.log")


def test_rename4_expected_modules_are_what_the_script_leaves_and_extra_code_is_not_vouched_for():
    from cluster.grade import TaskHistory, grade_task

    wl = workloads.get("rename4")
    seed, steps = 9, 6
    tree = {p: t.encode() for p, t in wl.fixture(seed).items()}
    for st in wl.script(seed, steps):
        if st.tool == "apply_patch":
            tree[st.arguments["path"]] += (st.arguments["append"] + "\n").encode()
        elif st.tool == "apply_edits":
            for e in st.arguments["edits"]:
                tree[e["path"]] = tree[e["path"]].replace(e["old"].encode(), e["new"].encode())
    assert all(tree[p] == b for p, b in wl.expected_files(seed, steps).items())
    task = {"task_id": "t", "seed": seed, "runner": "x", "workload": "rename4", "steps": steps, "faults": []}

    def torn_check(files):
        h = TaskHistory(task=task, events=[{"event": "task_end", "state": "done"}], artifact=files, calls=[],
                        effects=[], writes=[], requests=[])
        return grade_task(h)["checks"]["no_torn_apply"]
    assert torn_check(tree)["verdict"] == "pass"
    new = wl._rename(seed)[1]
    sneaky = dict(tree, **{"svc/handler.py": tree["svc/handler.py"].replace(
        b"    validate(payload)", f"    payload = dict(payload, {new}=None)\n    validate(payload)".encode())})
    c = torn_check(sneaky)
    assert c["verdict"] == "unknown" and c["differ"] == ["svc/handler.py"], c
