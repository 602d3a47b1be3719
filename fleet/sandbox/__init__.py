"""Sandbox backends. The public methods (`start`, `kill`, `freeze`, `thaw`, `wait`,
`remove`) add timing, state changes and logging, then call a private `_method` per
backend (template method). The process backend runs each runner as

    sh (joins the sandbox cgroups) -> nsenter --net (the network namespace the host made)
        -> bwrap (new mount, pid, ipc, uts, cgroup namespaces; a minimal read-only root)
        -> setpriv (uid/gid 65534, no capabilities, no_new_privs) -> tini -s -g -> runner

Inside, the host is read-only and mostly absent: /usr and /etc read-only, the
runner's code and interpreter read-only at their own paths, a private /tmp,
/proc of its own pid namespace, /sys read-only with an empty /sys/fs/cgroup, no new user namespaces
(a seccomp filter: fleet/seccomp.py), and
the tmpfs workspace at /workspace as the only writable place (and cwd). The
network namespace is empty but for loopback listeners the host opened in it and
relays to the harness services (fleet/netns.py): the only things a runner reaches.

The workspace is a size-limited tmpfs the backend mounts on the host before the
start (source `sandfleet-ws.<wave>.<sandbox>`: a marker a sweep finds), seeds
with the task's files, reads back after the runner exits (the artifact is
captured by the harness, never reported by the runner), and unmounts on remove.
Every process of the sandbox is in one cgroup per controller (memory, pids,
freezer, cpu) on cgroup v1, or in one unified dir on cgroup v2, named
`sandfleet/<wave>/<sandbox>`: the marker a sweep finds (fleet/cgroups/).

Rooms:
- `spec`: `SandboxSpec`, `Sandbox`, the paths and uid inside, `SandboxError`.
- `backend`: the backend template (`SandboxBackend`) and `pidfd_ended`.
- `process`: the process backend; `bwrap`: its launcher, bwrap arguments and wrapper.
- `access`: whether the sandbox user can reach and run the runner's command.
- `workspace`: the tmpfs workspace and a task's kept volume (keep, move, the crash modes' lazy mount).
- `artifacts`: `read_tree`, the capture of the artifact.
"""
from fleet.lifecycle import SANDBOX_TRANSITIONS, Lifecycle, SandboxState
from fleet.sandbox.access import SYSTEM_ROOTS, cached_command_problem, command_problem, unreadable_by_sandbox_user
from fleet.sandbox.artifacts import read_tree
from fleet.sandbox.backend import SandboxBackend, pidfd_ended
from fleet.sandbox.bwrap import LAUNCH, WRAP, bwrap_args
from fleet.sandbox.process import ProcessBackend, check_process_backend, outliving
from fleet.sandbox.spec import (BASH, MAX_ARTIFACT_BYTES, MAX_ARTIFACT_DEPTH, MAX_ARTIFACT_FILES, RUN_IN, RUNNER_LOG,
                                SANDBOX_UID, VOLUME_SOURCE, WORKSPACE_IN, Sandbox, SandboxError, SandboxSpec,
                                sandbox_key)
from fleet.sandbox.workspace import (LAZY_DATA, MOVED_SKIP, PENDING_ARMS, lazy_of, pack_volume, prepare_workspace,
                                     release_volume, release_workspace, unmount_workspace, unpack_volume)

__all__ = ["BASH", "LAUNCH", "LAZY_DATA", "MAX_ARTIFACT_BYTES", "MAX_ARTIFACT_DEPTH", "MAX_ARTIFACT_FILES",
           "MOVED_SKIP", "PENDING_ARMS", "RUNNER_LOG", "RUN_IN", "SANDBOX_TRANSITIONS", "SANDBOX_UID", "SYSTEM_ROOTS",
           "VOLUME_SOURCE", "WORKSPACE_IN", "WRAP", "Lifecycle", "ProcessBackend", "Sandbox", "SandboxBackend",
           "SandboxError", "SandboxSpec", "SandboxState", "bwrap_args", "cached_command_problem",
           "check_process_backend", "command_problem", "lazy_of", "outliving", "pack_volume", "pidfd_ended",
           "prepare_workspace", "read_tree", "release_volume", "release_workspace", "sandbox_key",
           "unmount_workspace", "unpack_volume", "unreadable_by_sandbox_user"]
