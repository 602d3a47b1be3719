# sandfleet: `make wave` runs a real wave on the embedded defaults; `make test` runs the suite.
# Both set everything up first (as root on a fresh Debian machine: apt + a local .venv).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sandfleet-installed

EXAMPLES := $(patsubst %/requirements.txt,%,$(wildcard examples/*/requirements.txt))

.PHONY: setup system docker browser wave test test-quick test-unit test-cgroup2 lint docs bench examples clean
.PHONY: examples-codex examples-crewai examples-claude-code test-claude-code league-claude-code

setup: system $(STAMP)

# The process sandbox backend needs bubblewrap, setpriv and nsenter (util-linux) and tini; the lazy file system of
# the crash disk modes (fleet/lazyfs/) needs fuse3 (fusermount3, libfuse3).
system:
	@if ! command -v tini >/dev/null 2>&1 || ! command -v bwrap >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1 || \
	    ! command -v nsenter >/dev/null 2>&1 || ! command -v setpriv >/dev/null 2>&1 || \
	    ! command -v fusermount3 >/dev/null 2>&1; then \
		echo "installing system packages: bubblewrap tini util-linux iproute2 fuse3"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap tini util-linux iproute2 fuse3 >/dev/null; \
	fi

# The docker sandbox backend: Debian's docker.io, started with no bridge and no iptables (infra/dockerd-up).
docker:
	@command -v dockerd >/dev/null 2>&1 || { echo "installing system packages: docker.io"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null; }
	@infra/dockerd-up

# Debian's chromium, headless: the report test loads a wave's index.html in it (in a network namespace of its own)
browser:
	@command -v chromium >/dev/null 2>&1 || { echo "installing system packages: chromium"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

# The fault proxy's compiled front (relay/, Rust, std only): a wheel built here with maturin, its binary in
# .venv/bin. With no cargo on the machine the proxy serves alone (slower, the same behaviour).
CARGO := $(shell command -v cargo 2>/dev/null || ls $$HOME/.cargo/bin/cargo /root/.cargo/bin/cargo 2>/dev/null | head -1)
RELAY_SRC := relay/Cargo.toml relay/Cargo.lock relay/pyproject.toml relay/src/main.rs relay/src/forward.rs

$(STAMP): pyproject.toml $(RELAY_SRC)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,docs]'
	@if [ -z "$(CARGO)" ]; then echo "no cargo here: the fault proxy serves alone (relay/ not built)"; \
	elif ! PATH="$(dir $(CARGO)):$$PATH" $(BIN)/python -m pip install -q --force-reinstall ./relay; then \
		$(BIN)/python -m pip uninstall -q -y sandfleet-relay; \
		echo "WARNING: relay/ did not build: the fault proxy serves alone (tests/integration/test_relay.py skips)"; fi
	@touch $(STAMP)

wave: setup
	$(BIN)/sandfleet wave run configs/quickstart.yaml

# the linter first (seconds), as CI does: a lint error fails `make test` here, not only on CI
test: setup lint docker browser examples
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 tests/unit tests/harness tests/integration

# The process backend on a real cgroup v2 kernel: Debian's own kernel booted unified in a qemu VM (software
# emulation: KVM guests do not boot on this machine kind), the image built once per machine from Debian's packages
# (mmdebstrap) and cached under /var/cache/sandfleet-vm; no network in the VM; the checkout and the venv shared
# read-only. Runs tests/integration/test_cgroup2.py there (~1 min); SFVM_WAVE=1 (as CI runs it) runs `make wave`'s
# config after it (~2.5 min under emulation; the guest waits up to 300 s for Ray's raylet, Ray's own 30 s being too
# short there). Bounded: qemu is killed by its PID after SFVM_TIMEOUT s (600; 1800 with the wave).
test-cgroup2: setup
	infra/vm/test-cgroup2

lint: setup
	$(BIN)/ruff check .

# The docs site (mkdocs.yml) into site/, --strict: a broken link or anchor is an error. The reference pages under
# docs/reference/ are generated from the code (`$(BIN)/python -m cluster.docgen`; a unit test checks them). Never
# add -q: it hides the warnings that --strict counts.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# the edit-test loop: the unit and harness tiers only (no Ray, no store, no sandbox; well under a minute)
test-quick: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit tests/harness

test-unit: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

# HAProxy (Debian's, HTTP mode, 127.0.0.1 only, own config, stopped by PID) is the production relay the
# proxy is measured beside
bench: setup docker
	command -v haproxy >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy
	$(BIN)/python -m tests.bench.run
	$(BIN)/python -m tests.bench.scale
	$(BIN)/python -m tests.bench.isolated
	$(BIN)/python -m tests.bench.cost
	$(BIN)/python -m tests.bench.phases
	$(BIN)/python -m tests.bench.report
	$(BIN)/python -m tests.bench.keys_ab
	$(BIN)/python -m tests.bench.lazyfs
	$(BIN)/python -m tests.bench.hollow

# Each example runner (examples/*/) gets its own venv from its pinned requirements.txt (none imports
# sandfleet). Idempotent: a venv whose requirements are installed (stamp file) is skipped.
examples:
	@$(PYTHON) examples/mkvenv.py $(EXAMPLES)

# Opt-in example rows, not in `make test` (their installs are heavy; their tests skip, naming the target):
# Codex CLI 0.169.0 from npm (its native binary is ~400 MB), pinned by package.json + package-lock.json; node and
# npm from Debian's packages when missing. Install scripts are off: the binary comes as an optional dependency.
examples-codex:
	@command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm
	cd examples/codex_cli && npm ci --no-audit --no-fund --ignore-scripts

# CrewAI 1.15.30 (~1 GB of dependencies, ~2 min): its pins in requirements-optin.txt, which `make examples` skips
examples-crewai:
	@$(PYTHON) examples/mkvenv.py --requirements requirements-optin.txt examples/crewai

# Claude Code 2.1.328 (npm, 356 MB): its license is Anthropic's commercial terms, not open source, so it is never
# installed by `make examples` or run by `make test`. Its postinstall (which puts the native binary in place) is run
# on its own, as its error message says, with every other install script off. `test-claude-code` runs its
# integration tests, on process nodes and on two isolated ones (SANDFLEET_CLAUDE_CODE=1 opts in);
# `league-claude-code` its league beside `durable`.
examples-claude-code:
	@command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm
	cd examples/claude_code && npm ci --no-audit --no-fund --ignore-scripts && \
		node node_modules/@anthropic-ai/claude-code/install.cjs

test-claude-code: setup examples-claude-code
	SANDFLEET_CLAUDE_CODE=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/integration/test_league_agents.py \
		tests/integration/test_examples_isolated.py -k claude_code

league-claude-code: setup examples-claude-code
	$(BIN)/sandfleet league configs/league-claude-code.yaml

clean:
	rm -rf $(VENV) results build site *.egg-info
