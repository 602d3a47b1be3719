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
    padding), base32 (both cases, with and without padding), hex (both cases) and URL-quoted."""
    import base64
    from urllib.parse import quote

    out = []
    for v in values:
        if not v:
            continue
        b = v.encode()
        b32 = base64.b32encode(b).decode()
        for form in (v, v[::-1], base64.b64encode(b).decode(), base64.urlsafe_b64encode(b).decode(), b32,
                     b32.lower(), b.hex(), b.hex().upper(), quote(v, safe="")):
            out += [form, form.rstrip("=")]
    return sorted(set(out))


PIECE = 12  # a run of this many characters of a secret (of any of its forms) in order is redacted
GAP = 3  # ... also when its characters are spaced by up to this many others that are not letters or digits
_BREAK = 2 * GAP + 1  # (around a `-` or `_` of the key's own, spaced too: "a :: - :: b" parts a and b by 7)
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def _squeezed(text: str) -> tuple[str, list[int]]:
    """The text's letters and digits, glued where a few other characters parted them (a run of more than _BREAK is a
    break, `\0`), with each kept character's index in the text: "S E C-R" -> "SECR"."""
    out, where, run = [], [], 0
    for i, c in enumerate(text):
        if c in _ALNUM:
            if run > _BREAK and out:
                out.append("\0")
                where.append(i)
            out.append(c)
            where.append(i)
            run = 0
        else:
            run += 1
    return "".join(out), where


@functools.lru_cache(maxsize=8)
def _pieces(values: tuple) -> frozenset:
    """Every PIECE-character window of every form of every secret, as written and squeezed (its own separators
    dropped: a secret with `-` or `_` in it, spaced out, squeezes to the same letters)."""
    forms = secret_forms(values)
    squeezed = [_squeezed(f)[0] for f in forms]
    return frozenset(f[i:i + PIECE] for f in forms + squeezed if len(f) >= PIECE
                     for i in range(len(f) - PIECE + 1))


MASK_SPAN = 4  # a masked form is found by two shown characters at most this far apart
MASKS = "*•#?·●…"  # what stands for a hidden character (around those two); past them, any but a space
# two shown characters with 1 to MASK_SPAN - 1 masks between them, or side by side next to a mask
_ANCHORS = [re.compile(rf"(?=([A-Za-z0-9])[{MASKS}]{{1,{MASK_SPAN - 1}}}([A-Za-z0-9]))"),
            re.compile(rf"(?=([A-Za-z0-9])([A-Za-z0-9])[{MASKS}])"),
            re.compile(rf"(?<=[{MASKS}])([A-Za-z0-9])(?=([A-Za-z0-9]))")]


@functools.lru_cache(maxsize=8)
def _mask_index(values: tuple) -> dict:
    """(c1, c2, d) -> [(secret, i)] for the characters at i and i + d (d <= MASK_SPAN) of each secret as issued and
    reversed: where a masked form of it ("Ab*d*f..." showing some characters in place) may be anchored."""
    index: dict = {}
    for v in {x for s in values if s for x in (s, s[::-1])}:
        for i in range(len(v)):
            for d in range(1, MASK_SPAN + 1):
                if i + d < len(v):
                    index.setdefault((v[i], v[i + d], d), []).append((v, i))
    return index


def _masked_spans(text: str, values: tuple) -> list[tuple[int, int]]:
    """Spans of the text that show PIECE or more characters of a secret in their places, the others masked: found
    from two shown characters with only MASKS between them (or beside them), then followed over any character that
    is not a letter, a digit or a space. "AbCd****...", "A*C*E*..." and "AbCdEf****...uVwXyZ" style forms."""
    if not any(m in text for m in MASKS):
        return []
    index = _mask_index(values)
    spans, n = [], len(text)
    anchors = sorted({(m.start(1), m.start(2)) for p in _ANCHORS for m in p.finditer(text)})
    done = -1
    for t, t2 in anchors:
        d = t2 - t
        if t < done:
            continue
        for v, i in index.get((text[t], text[t2], d), ()):
            o = t - i  # the secret laid over the text from o
            lo, hi, shown = max(0, o), min(n, o + len(v)), 0
            first = last = None
            for j in range(t, hi):  # forwards from the anchor
                c = text[j]
                if c in _ALNUM:
                    if c != v[j - o]:
                        break
                    shown, last = shown + 1, j
                elif c.isspace():
                    break
            for j in range(t - 1, lo - 1, -1):  # and backwards
                c = text[j]
                if c in _ALNUM:
                    if c != v[j - o]:
                        break
                    shown, first = shown + 1, j
                elif c.isspace():
                    break
            if shown >= PIECE:
                spans.append((first if first is not None else t, (last if last is not None else t) + 1))
                done = spans[-1][1]
                break
    return spans


def _merged(spans: list) -> list[list[int]]:
    spans = sorted(spans)
    merged = [list(spans[0])]
    for a, b in spans[1:]:
        if a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def redact(text: str, values: list[str] | tuple = (), shapes: bool = True) -> str:
    """Remove secrets: first every known secret value (the keys the harness issued in this wave) in every form a
    runner may print it (`secret_forms`): any PIECE characters of one in order, as written (a key cut by a log tail,
    glued to other text, printed twice) or spaced by up to GAP characters that are not letters or digits
    ("S E C R E T", "S-E-C-R"); and a masked form showing PIECE or more of its characters in their places ("SECR**",
    "S*C*E*"). Then the shapes of the keys the harness hands out (a re-grade no longer knows the values)."""
    values = tuple(values)
    pieces = _pieces(values)
    if pieces:
        # one pass over the text and one over its squeezed letters: every PIECE-character window that is a piece
        # of a secret's form (a set lookup each, so hundreds of issued keys cost no more than one)
        spans = [(i, i + PIECE) for i in range(len(text) - PIECE + 1) if text[i:i + PIECE] in pieces]
        sq, where = _squeezed(text)
        spans += [(where[i], where[i + PIECE - 1] + 1) for i in range(len(sq) - PIECE + 1)
                  if sq[i:i + PIECE] in pieces]
        spans += _masked_spans(text, values)
        if spans:
            out, last = [], 0
            for a, b in _merged(spans):
                out += [text[last:a], "<redacted>"]
                last = b
            text = "".join(out) + text[last:]
    if shapes:  # (`shapes=False`: by value only, for raw logs whose other text must stay as the runner wrote it)
        for pattern, repl in _SECRETS:
            text = pattern.sub(repl, text)
    return text


def redact_grades(grades: list[dict], values) -> None:
    """Every string of the grades' checks redacted by value, in place: a detail can quote what a runner chose (an
    object's name in `no_foreign_writes` or a retry loop's, its last line of output), and the grades are what
    SUMMARY.md and the pages show. By value only: the rest of a detail stays as the grader wrote it."""
    values = tuple(values)
    if not values:
        return

    def clean(x):
        if isinstance(x, str):
            return redact(x, values, shapes=False)
        if isinstance(x, list):
            return [clean(v) for v in x]
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        return x
    for g in grades:
        g["checks"] = clean(g.get("checks") or {})


def write_evidence(d: Path, g: dict, h, secrets: tuple = ()) -> None:
    """evidence/<task>/: the grade, the attempts and their causes, the task's store writes, the proxy requests
    and model calls around each fault, the runner's output tail per attempt; secrets redacted."""
    tid = g["task_id"]
    ev = results.ResultsDir(d).evidence(tid)
    ev = results.own_dir(d, *ev.relative_to(d).parts)  # (a link left in its place is never written through)

    def put(name: str, data) -> None:
        body = data if isinstance(data, str) else orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
        results.write_stored(ev / name, redact(body, secrets))

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
    listed = getattr(h, "runner_logs", None)  # (as the grader listed them; a history made elsewhere lists here)
    for p in results.ResultsDir(d).runner_logs(tid) if listed is None else listed:
        try:  # a regular file only, never through a link, never a FIFO or a device (a runner shaped that folder)
            raw = results.tail_bytes(p, 65536)
            tail = raw.decode(errors="replace").splitlines()
            tail = (tail[1:] if len(raw) == 65536 else tail)[-200:]  # never a line cut in the middle (a cut key)
        except (OSError, ValueError) as exc:
            tail = [f"(not read: {exc})"]
        out.append(f"==> {p.parent.name} (last {len(tail)} lines)\n" + "\n".join(tail) + "\n")
    put(results.EVIDENCE_RUNNER_LOGS, results.terminal_safe("".join(out)))  # `cat` of it is safe (runner.log is raw)


def redact_runner_logs(out: results.ResultsDir, values) -> int:
    """Every attempt's raw `runner.log` under results/ rewritten with the wave's secrets taken out, by value (in
    every form of `secret_forms`; a runner that prints its environment printed its keys): no other text changes,
    so what the grader reads in the log is what the runner wrote. Returns how many files changed; bytes that are
    not UTF-8 stay."""
    changed = 0
    if not values:
        return 0
    for p in sorted(out.sandboxes.glob(f"*/{results.RUNNER_LOG}")):
        if p.parent.is_symlink():  # a linked attempt folder: neither read nor written through
            continue
        try:  # a regular file only, never through a link, replaced whole (a FIFO there would hang the wave's end)
            text = results.regular_bytes(p).decode("utf-8", errors="surrogateescape")
            clean = redact(text, values, shapes=False)  # by value: the grader reads these logs after
            if clean != text:
                results.write_stored(p, clean.encode("utf-8", errors="surrogateescape"))
                changed += 1
        except (OSError, ValueError):
            continue
    return changed
