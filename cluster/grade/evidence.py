"""Evidence and redaction: what a failed or unknown task leaves for a person to read (`evidence/<task>/`), with
every secret the harness issued taken out, by value (the wave's own keys, also cut, glued or repeated) and by
shape (a re-grade no longer knows the values)."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import orjson

from cluster import results


# What evidence files must never show: keys and tokens a runner may print (its env, a request it logs).
# Model and effects keys are `sf-` + 32 url-safe characters; store secrets are 40 url-safe characters.
_SECRETS = [
    (re.compile(r"sf-[A-Za-z0-9_-]{32}"), "sf-<redacted>"),  # glued to other text or repeated: still a key
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1<redacted>"),
    (re.compile(r"(?i)\b([A-Z0-9_]*(?:KEY|SECRET|TOKEN|PASSWORD)[A-Z0-9_]*\s*[=:]\s*[\"']?)[^\s\"',;]{6,}"),
     r"\1<redacted>"),
    (re.compile(r"(?i)(\"(?:SecretAccessKey|SessionToken|secret_key|api_key)\"\s*:\s*\")[^\"]+"), r"\1<redacted>"),
    (re.compile(r"(Signature=)[0-9a-f]{64}"), r"\1<redacted>"),
    (re.compile(r"(?<![A-Za-z0-9_-])(?=[A-Za-z0-9_-]{40}(?![A-Za-z0-9_-]))(?![0-9a-f]{40})[A-Za-z0-9_-]{40}"),
     "<redacted:40>"),
]


def secret_forms(values) -> list[str]:
    """Each secret as a runner might print it: plain, reversed, base64 (standard and URL-safe, with and without
    padding), hex (both cases) and URL-quoted."""
    import base64
    from urllib.parse import quote

    out = []
    for v in values:
        if not v:
            continue
        b = v.encode()
        for form in (v, v[::-1], base64.b64encode(b).decode(), base64.urlsafe_b64encode(b).decode(), b.hex(),
                     b.hex().upper(), quote(v, safe="")):
            out += [form, form.rstrip("=")]
    return sorted(set(out))


@functools.lru_cache(maxsize=8)
def _pieces(values: tuple) -> frozenset:
    return frozenset(f[i:i + 12] for f in secret_forms(values) if len(f) >= 12 for i in range(len(f) - 11))


def redact(text: str, values: list[str] | tuple = (), shapes: bool = True) -> str:
    """Remove secrets: first every known secret value (the keys the harness issued in this wave) in every form a
    runner may print it (`secret_forms`), also any 12-character piece of one (a key cut by a log tail, glued to
    other text, printed twice); then the shapes of the keys the harness hands out (a re-grade no longer knows the
    values)."""
    pieces = _pieces(tuple(values))
    if pieces:
        # one pass over the text: every 12-character window that is a piece of a secret's form (a set lookup
        # each, so hundreds of issued keys cost no more than one)
        spans = [(i, i + 12) for i in range(len(text) - 11) if text[i:i + 12] in pieces]
        if spans:
            spans.sort()
            merged = [list(spans[0])]
            for a, b in spans[1:]:
                if a <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            out, last = [], 0
            for a, b in merged:
                out += [text[last:a], "<redacted>"]
                last = b
            text = "".join(out) + text[last:]
    if shapes:  # (`shapes=False`: by value only, for raw logs whose other text must stay as the runner wrote it)
        for pattern, repl in _SECRETS:
            text = pattern.sub(repl, text)
    return text


def write_evidence(d: Path, g: dict, h, secrets: tuple = ()) -> None:
    """evidence/<task>/: the grade, the attempts and their causes, the task's store writes, the proxy requests
    and model calls around each fault, the runner's output tail per attempt; secrets redacted."""
    tid = g["task_id"]
    ev = results.ResultsDir(d).evidence(tid)
    ev.mkdir(parents=True, exist_ok=True)

    def put(name: str, data) -> None:
        body = data if isinstance(data, str) else orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
        (ev / name).write_text(redact(body, secrets))

    put(results.EVIDENCE_GRADE, g)
    put(results.EVIDENCE_ATTEMPTS, [e for e in h.events if e["event"] in ("attempt_start", "attempt_end", "task_end")])
    put(results.EVIDENCE_STORE_WRITES, [{k: w.get(k) for k in ("t", "method", "key", "status", "req_bytes", "ms")}
                              for w in (h.writes or [])][:2000])
    fired = sorted(r["fired_at"] for r in h.receipts if r["task_id"] == tid and r.get("fired_at"))

    def near(t: float) -> bool:
        return any(abs(t - f) <= 3.0 for f in fired)
    put(results.EVIDENCE_AROUND_FAULTS, {
        "faults": [r for r in h.receipts if r["task_id"] == tid],
        "proxy_requests": [r for r in h.requests or [] if near(r["t"])][:500],
        "model_calls": [c for c in h.calls or [] if near(c["t"])][:500]})
    out = []
    for p in results.ResultsDir(d).runner_logs(tid):
        try:
            with open(p, "rb") as f:
                start = max(0, p.stat().st_size - 65536)
                f.seek(start)
                tail = f.read().decode(errors="replace").splitlines()
                tail = (tail[1:] if start else tail)[-200:]  # never a line cut in the middle (a cut key)
        except OSError as exc:
            tail = [f"(unreadable: {exc})"]
        out.append(f"==> {p.parent.name} (last {len(tail)} lines)\n" + "\n".join(tail) + "\n")
    put(results.EVIDENCE_RUNNER_LOGS, "".join(out))


def redact_runner_logs(out: results.ResultsDir, values) -> int:
    """Every attempt's raw `runner.log` under results/ rewritten with the wave's secrets taken out, by value (in
    every form of `secret_forms`; a runner that prints its environment printed its keys): no other text changes,
    so what the grader reads in the log is what the runner wrote. Returns how many files changed; bytes that are
    not UTF-8 stay."""
    changed = 0
    if not values:
        return 0
    for p in sorted(out.sandboxes.glob(f"*/{results.RUNNER_LOG}")):
        try:
            text = p.read_bytes().decode("utf-8", errors="surrogateescape")
            clean = redact(text, values, shapes=False)  # by value: the grader reads these logs after
            if clean != text:
                p.write_bytes(clean.encode("utf-8", errors="surrogateescape"))
                changed += 1
        except OSError:
            continue
    return changed
