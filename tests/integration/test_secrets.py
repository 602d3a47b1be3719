"""No secret the harness issued lands in results/: a runner prints its whole environment, its store credentials
(through its own credential_process) and its keys base64-, base32-, hex-encoded, reversed, spaced out and
half-masked; afterwards every file under the wave's results directory (runner.log, evidence, pages) is searched for
every issued secret in each of those forms."""
from __future__ import annotations

import base64
import textwrap

import pytest

from cluster.config import build_config
from cluster.driver import WaveRun

pytestmark = pytest.mark.integration

LEAKY = textwrap.dedent("""\
    import base64, os, shlex, subprocess, sys
    env = dict(os.environ)
    print("\\n".join(f"{k}={v}" for k, v in sorted(env.items())))
    for k in ("OPENAI_API_KEY", "SANDFLEET_EFFECTS_KEY"):
        v = env[k].encode()
        print(k, base64.b64encode(v).decode(), v.hex(), env[k][::-1], file=sys.stderr)
    cfg = open(env["AWS_CONFIG_FILE"]).read()
    cmd = next(l.split("=", 1)[1] for l in cfg.splitlines() if l.startswith("credential_process"))
    creds = subprocess.run(shlex.split(cmd), capture_output=True, text=True).stdout
    print(creds)
    import json
    secret = json.loads(creds)["SecretAccessKey"]
    print(base64.b64encode(secret.encode()).decode(), secret.encode().hex(), secret[::-1])
    for v in (secret, env["OPENAI_API_KEY"]):
        print("b32", base64.b32encode(v.encode()).decode(), base64.b32encode(v.encode()).decode().lower())
        print("spaced", " ".join(v), "|", "-".join(v))
        print("masked", "".join(c if i % 2 else "*" for i, c in enumerate(v)), v[:14] + "*" * (len(v) - 14))
""")


def test_a_runner_that_prints_every_secret_leaves_none_in_results(fleet, tmp_path):
    code = tmp_path / "leaky"
    code.mkdir()
    (code / "leaky.py").write_text(LEAKY)
    cfg = build_config({"tasks": 1, "concurrency": 1, "faults": "none", "max_attempts": 1, "seed": 5,
                        "runner": {"command": ["python3", "leaky.py"], "workdir": str(code), "name": "leaky"},
                        "workload": {"steps": 2, "think_ms": 10}})
    wave = WaveRun(cfg, tmp_path / "results", progress=False, fleet=fleet)
    wave.run()
    secrets = wave.access.issued_secrets()
    assert len(secrets) >= 3, secrets  # the model/effects key, the attempt's store secret, the store's own
    logs = sorted(wave.out.sandboxes.glob("*/runner.log"))
    assert logs and "<redacted>" in logs[0].read_text(errors="replace"), "the runner printed nothing redacted"
    forms = {}
    for s in secrets:
        b = s.encode()
        forms.update({s: s, f"b64 {s[:6]}": base64.b64encode(b).decode().rstrip("="), f"hex {s[:6]}": b.hex(),
                      f"rev {s[:6]}": s[::-1], f"b32 {s[:6]}": base64.b32encode(b).decode().rstrip("="),
                      f"b32 lower {s[:6]}": base64.b32encode(b).decode().rstrip("=").lower(),
                      f"spaced {s[:6]}": " ".join(s[:12]), f"dashed {s[:6]}": "-".join(s[:12]),
                      f"masked {s[:6]}": "".join(c if i % 2 else "*" for i, c in enumerate(s))[:24],
                      f"prefix {s[:6]}": s[:12]})
    found = []
    for p in sorted(wave.dir.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            found += [(str(p.relative_to(wave.dir)), name) for name, f in forms.items() if f.encode() in data]
    assert not found, found
