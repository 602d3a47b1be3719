"""Sandbox cgroups, on cgroup v1 or v2 (detected once: `mode()`).

v1 (memory, pids, freezer and cpu hierarchies): one dir per controller under the harness's own cgroup in each, at
`<own>/sandfleet/<wave>/<sandbox>`. v2 (the unified hierarchy alone at /sys/fs/cgroup): one dir at the same path
under the harness's own cgroup, the subtree it was started in (its delegated subtree); memory, pids and cpu are
enabled down to each sandbox through `cgroup.subtree_control`, freeze and kill are `cgroup.freeze` and
`cgroup.kill`. v2 allows no process in an inner node, so when the own cgroup is not the root, the processes in it
move once to a leaf `<own>/sandfleet-home` before its controllers are enabled, and a process leaving the harness's
group goes back there. Either way the path itself is the marker a sweep uses to find leftovers after a crash.

Rooms:
- `hierarchy`: the mode, the harness's own cgroup, the host checks, v2 delegation, the harness's groups, listings.
- `sandbox_cgroup`: a sandbox's cgroup, v1 (`SandboxCgroup`) and v2 (`UnifiedSandboxCgroup`).
"""
from fleet.cgroups.hierarchy import (CONTROLLERS, HARNESS, HOME, HOW_TO_DELEGATE, MARK, ROOT, UNIFIED, V2_CONTROLLERS,
                                     CgroupError, CgroupSetupError, check_available, delegated_root, enable,
                                     group_dirs, harness_dirs, home, join_file, join_harness, leave_harness,
                                     list_sandboxes, mode, own_dirs, own_path, procs_base, shares_to_weight, unified,
                                     wave_dir, wave_dirs)
from fleet.cgroups.sandbox_cgroup import SandboxCgroup, UnifiedSandboxCgroup

__all__ = ["CONTROLLERS", "HARNESS", "HOME", "HOW_TO_DELEGATE", "MARK", "ROOT", "UNIFIED", "V2_CONTROLLERS",
           "CgroupError", "CgroupSetupError", "SandboxCgroup", "UnifiedSandboxCgroup", "check_available",
           "delegated_root", "enable", "group_dirs", "harness_dirs", "home", "join_file", "join_harness",
           "leave_harness", "list_sandboxes", "mode", "own_dirs", "own_path", "procs_base", "shares_to_weight",
           "unified", "wave_dir", "wave_dirs"]
