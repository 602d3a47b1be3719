"""The process sandbox's command line: the launcher (joins the cgroups, then `nsenter --net` and bwrap), bwrap's
arguments (own namespaces, a minimal read-only root, the workspace the only writable place, setpriv to uid 65534, tini)
and the wrapper that reports the runner's exit."""
from __future__ import annotations

import os

from fleet.sandbox.access import SYSTEM_ROOTS
from fleet.sandbox.spec import BASH, SANDBOX_UID, WORKSPACE_IN, SandboxSpec

# The parent writes the launcher's pid into every sandbox cgroup, then sends "go" on stdin:
# nothing of the sandbox runs before it is fully inside its cgroups.
LAUNCH = r"""
read -r go || exit 97
exec </dev/null
exec nsenter --net="$SF_NETNS" bwrap "$@"
"""
# Runs the runner inside the sandbox (as tini's child): when the runner exits, it reports its own pid and the
# runner's exit code on the report pipe and waits for the host to close the hold pipe, so the host can see which
# processes outlived the runner before the sandbox's end takes them. The runner itself gets neither pipe.
WRAP = r"""
r=$1 h=$2
exec 8>&"$r" 9<&"$h" {r}>&- {h}<&-
shift 2
trap : TERM INT HUP
"$@" 8>&- 9<&-
rc=$?
printf '%s %s\n' "$$" "$rc" >&8
read -r _ <&9
exit $rc
"""


def bwrap_args(spec: SandboxSpec, pipes: tuple[int, int] | None = None, seccomp_fd: int | None = None) -> list[str]:
    """`pipes`: (report write end, hold read end) for WRAP, which then runs the runner; `seccomp_fd`: the filter
    that refuses new user namespaces (fleet/seccomp.py)."""
    a = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup",
         "--die-with-parent", "--new-session", "--hostname", "sandbox",
         "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for host in SYSTEM_ROOTS[2:]:  # (/usr and /etc are bound above)
        if os.path.islink(host):
            a += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            a += ["--ro-bind", host, host]
    # /tmp: private, and writable by the runner (sticky, as on any machine: the contract's TMPDIR)
    # /sys/fs/cgroup: an empty tmpfs, so the sandbox sees no cgroup, its own or another wave's (issue 42)
    a += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--ro-bind", "/sys", "/sys",
          "--perms", "0755", "--tmpfs", "/sys/fs/cgroup"]
    made = {"/", "/usr", "/etc", "/tmp", "/proc", "/dev", "/sys"}

    def parents(path: str) -> list[str]:
        out, cur = [], os.path.dirname(path.rstrip("/"))
        while cur not in made and cur != "/":
            out.append(cur)
            cur = os.path.dirname(cur)
        made.update(out)
        return [x for p in reversed(out) for x in ("--perms", "0755", "--dir", p)]

    for path in sorted(set(spec.ro_binds)):
        if os.path.exists(path):
            a += parents(path) + ["--ro-bind", path, path]
            made.add(path)
    for host, inside in sorted(spec.ro_mounts.items(), key=lambda kv: kv[1]):  # a dir before what is in it
        a += parents(inside) + ["--ro-bind", host, inside]
        made.add(inside)
    for path in spec.hide:
        a += ["--tmpfs", path]
    if seccomp_fd is not None:
        a += ["--seccomp", str(seccomp_fd)]
    a += ["--bind", spec.workspace, WORKSPACE_IN, "--chdir", WORKSPACE_IN,
          "--cap-add", "CAP_SETUID,CAP_SETGID", "--",
          "/usr/bin/setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
          "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs",
          "/usr/bin/tini", "-s", "-g", "--"]
    if pipes is not None:
        a += [BASH, "-c", WRAP, "sandfleet-wrap", str(pipes[0]), str(pipes[1])]  # (dash takes fds 0-9 only)
    return a + list(spec.argv)
