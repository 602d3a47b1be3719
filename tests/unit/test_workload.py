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
