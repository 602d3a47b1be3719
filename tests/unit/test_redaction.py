"""Redaction by value (cluster/grade/evidence.py): an issued key in any of the common forms a runner may print it
(encoded, spaced, masked) is taken out of evidence, pages and runner.log; text that only looks like one is kept."""
from __future__ import annotations

import base64
import re
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.grade.evidence import GAP, PIECE, redact, redact_runner_logs

URLSAFE = string.ascii_letters + string.digits + "-_"
# keys as the harness issues them: model/effects keys `sf-` + 32 url-safe characters, store secrets 40
model_keys = st.text(URLSAFE, min_size=32, max_size=32).map(lambda s: "sf-" + s)
store_secrets = st.text(URLSAFE, min_size=40, max_size=40)
keys = st.one_of(model_keys, store_secrets)
# what may surround a printed key: words, punctuation, other lines (never the key's own characters in a row)
around = st.text(string.ascii_letters + " .:=,\n", max_size=30)
seps = st.text(" ,:-|/\t.", min_size=1, max_size=GAP)


def _alnum(s: str) -> str:
    return "".join(c for c in s if c.isalnum())


def _longest_shown_run(out: str, key: str) -> int:
    """The longest run of the key's letters and digits, in order and consecutive in the key, still in `out`
    with anything between them (a loose upper bound of what redaction left readable)."""
    k, text = _alnum(key), _alnum(out)
    best = 0
    for i in range(len(k)):
        for j in range(i + best + 1, len(k) + 1):
            if k[i:j] in text:
                best = j - i
            else:
                break
    return best


@settings(max_examples=150, deadline=None)
@given(key=keys, pre=around, post=around)
def test_base32_of_a_key_is_redacted_in_both_cases_and_without_padding(key, pre, post):
    b32 = base64.b32encode(key.encode()).decode()
    for shown in (b32, b32.rstrip("="), b32.lower()):
        out = redact(f"{pre}{shown}{post}", (key,), shapes=False)
        assert shown.rstrip("=") not in out and "<redacted>" in out, (shown, out)


@settings(max_examples=150, deadline=None)
@given(key=keys, sep=seps, start=st.integers(0, 20), length=st.integers(PIECE, 32), pre=around, post=around)
def test_a_spaced_run_of_twelve_or_more_characters_of_a_key_is_redacted(key, sep, start, length, pre, post):
    """12+ consecutive characters of the key, in order, each parted by a few characters that are not letters or
    digits: "S E C R E T ...", "S-E-C-R-E-T ..." leave fewer than 12 of its characters in a row readable."""
    piece = key[start:start + length]
    if len(_alnum(piece)) < PIECE + 2 or re.search(r"[-_]{2}", piece):
        return  # (mostly `-`/`_`: not 12 letters or digits to show; or two of its own `-_` spaced out: a long gap)
    out = redact(f"{pre} {sep.join(piece)} {post}", (key,), shapes=False)
    assert "<redacted>" in out and _longest_shown_run(out, key) < PIECE, (sep.join(piece), out)


@settings(max_examples=150, deadline=None)
@given(key=store_secrets, mask=st.sampled_from("*•#"), every=st.integers(2, 3), phase=st.integers(0, 2))
def test_a_half_masked_key_showing_twelve_or_more_of_its_characters_in_place_is_redacted(key, mask, every, phase):
    """Every 2nd or 3rd character masked ("A*C*E*...", "AB•DE•..."): 13 to 27 of a 40-character secret shown in
    their places, never 12 in a row."""
    shown = "".join(mask if (i + phase) % every == 0 else c for i, c in enumerate(key))
    if sum(1 for c, k in zip(shown, key) if c == k and c.isalnum()) < PIECE + 1:
        return
    out = redact(f"secret: {shown} (masked)", (key,), shapes=False)
    assert "<redacted>" in out, (shown, out)
    assert sum(1 for c in out if c.isalnum() and c in key) < 40, out  # not left as it was


def test_masked_forms_that_show_a_prefix_or_both_ends_are_redacted():
    key = "Qw7-Er8_Ty9Qw7-Er8_Ty9Qw7-Er8_Ty9Uio7890"
    for shown in (key[:14] + "*" * 26, key[:7] + "*" * 26 + key[-7:], "•" * 20 + key[20:]):
        out = redact(f"key={shown};", (key,), shapes=False)
        assert "<redacted>" in out and _longest_shown_run(out, key) < 6, (shown, out)


@settings(max_examples=200, deadline=None)
@given(key=keys, text=st.text(string.printable, max_size=300))
def test_text_that_does_not_hold_a_key_is_left_as_it_was(key, text):
    """Redaction by value takes out only what shows 12 of the key's characters in order: ordinary text (which may
    well hold a few of its characters, spaced or masked) is kept byte for byte."""
    if _longest_shown_run(text, key) >= PIECE:
        return
    kept = ("sha256 9f2c..ab digest " + "ab" * 32 + " step 3 exit 1 ******** a*b*c*d*e*f*g*h*i*j*k*l*m "
            "S E C R E T: 1 2 3 4 5 6 7 8 9 0 1 2 3 4")
    assert redact(text, (key,), shapes=False) == text
    assert redact(kept, (key,), shapes=False) == kept


def test_runner_log_redaction_uses_the_same_rule(tmp_path):
    """runner.log is rewritten at the wave's end by value with the same rule as evidence (and pages, which show
    evidence or these logs): base32, spaced and masked forms go, other text stays."""
    from cluster import results

    key = "Qw7-Er8_Ty9Qw7-Er8_Ty9Qw7-Er8_Ty9Uio7890"
    log = tmp_path / results.SANDBOXES / "t000-a1" / results.RUNNER_LOG
    log.parent.mkdir(parents=True)
    kept = b"TOKEN_REFRESH: connection_refused\ntotal tokens: 123456\n"
    shown = [base64.b32encode(key.encode()).decode(), " ".join(key), "".join(c if i % 2 else "*"
                                                                           for i, c in enumerate(key))]
    log.write_bytes(kept + "\n".join(shown).encode() + b"\n")
    assert redact_runner_logs(results.ResultsDir(tmp_path), (key,)) == 1
    data = log.read_bytes()
    assert data.startswith(kept) and data.count(b"<redacted>") == 3, data
    for s in shown:
        assert s.encode() not in data


def test_grades_quoting_what_a_runner_chose_are_redacted_by_value_and_keep_the_rest():
    """A check's detail can quote an object's name the runner chose (no_foreign_writes, a retry loop): the grades
    SUMMARY.md and the pages show are redacted with the same rule; figures and other text stay."""
    from cluster.grade.evidence import redact_grades

    key = "Qw7-Er8_Ty9Qw7-Er8_Ty9Qw7-Er8_Ty9Uio7890"
    name = "w/t001/" + base64.b32encode(key.encode()).decode()
    grades = [{"task_id": "t000", "checks": {
        "no_foreign_writes": {"verdict": "fail", "writes": [{"key": name, "status": 200, "t": 1.5}],
                              "detail": f"1 write(s) outside its own prefix; first: PUT {name} -> 200"},
        "liveness": {"verdict": "pass", "longest_silence_s": 2.0, "detail": "longest silence 2.0 s"}}}]
    redact_grades(grades, (key,))
    c = grades[0]["checks"]
    assert c["no_foreign_writes"]["detail"] == "1 write(s) outside its own prefix; first: PUT w/t001/<redacted> -> 200"
    assert c["no_foreign_writes"]["writes"] == [{"key": "w/t001/<redacted>", "status": 200, "t": 1.5}]
    assert c["liveness"] == {"verdict": "pass", "longest_silence_s": 2.0, "detail": "longest silence 2.0 s"}
