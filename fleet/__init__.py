"""Where tasks run. Rooms (docs/architecture.md, fleet/ section):

- `host/`: `SandboxHost`, the per-node actor (leases, relay watch, node dir, volumes, watches, sweep).
- `ledger`: the lease ledger actor; `lifecycle`: transition tables; `records`: records that cross the wave's seams.
- `refs`: a Ray answer as an asyncio future (hosts, sweep actor, wave); `wire`: the gate line and byte copy.
- `sweeper`: the sweep actor; `markers`: what carries a marker on this machine; `hostdirs`: a host's dir on its node.
- `sandbox/`: the backend template and the process backend; `docker_backend`, `dockerapi`, `dockerimage`: docker.
- `backends`: a host's backend factory; `hollow`: the scale bench's hollow nodes.
- `cgroups/`, `netns`, `seccomp`: a sandbox's cgroup, network namespace and seccomp filter.
- `lazyfs/`: the lazy file system of the crash disk modes.
- `services/`: the task registry and JSON service base; `model_endpoint`, `dialects`, `dialect_messages`,
  `dialect_responses`: the model endpoint; `effects`: the effects service; `gateway`: the head's gate.
- `codeship`: the runner's code shipped to other nodes.
- `runners/`, `workloads/`: the test's world (runners follow the runner contract and import nothing of sandfleet).
"""
