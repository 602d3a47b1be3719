"""`rename4`: a small service of four modules where one step renames a required field
across all four in one multi-file apply (`apply_edits`).

The service: `svc/schema.py` (FIELDS, REQUIRED), `svc/validate.py` (checks a payload
against REQUIRED), `svc/store.py` (COLUMNS of a row) and `svc/handler.py` (builds the
payload from a request and saves it). Its tests: `tests/test_store.py` (store-only:
a row built from schema.FIELDS round-trips through the store) and
`tests/test_contract.py` (cross-module: a request through the handler validates and is
stored). A torn rename (schema and store renamed, validate and handler not) passes the
store-only tests and fails the contract test (../shared/reference/002).

Other steps append a marked line (`sf-step=N`) to a module, publish, or run the tests.
The grader judges the artifact's tests statically (it never runs code a runner wrote):
`tests()` reads the four modules' literal names with `ast` and evaluates what the two
test files assert. A unit test checks that judgement against really running them.
"""
from __future__ import annotations

import ast

from fleet.workloads.base import MARK, ToolStep, effect_ids, marker_counts, rng, tools

RENAMES = (("user_name", "login"), ("email", "contact"), ("zip", "postcode"), ("phone", "mobile"))
# the order of the multi-file apply: a kill after the 2nd file leaves schema+store renamed only
MODULES = ("svc/schema.py", "svc/store.py", "svc/validate.py", "svc/handler.py")
NOTES = ("guard against empty payloads", "document the row shape", "log rejected requests",
         "index rows by id", "trim whitespace", "reject unknown fields")

TEST_STORE = '''import unittest

from svc import schema, store


class StoreOnly(unittest.TestCase):
    def test_row_round_trips(self):
        db = {}
        row = {f: f"v-{f}" for f in schema.FIELDS}
        row["id"] = 1
        store.save(db, row)
        self.assertEqual(set(db[1]), set(schema.FIELDS))
'''
TEST_CONTRACT = '''import unittest

from svc import handler, schema


class Contract(unittest.TestCase):
    def test_request_through_handler(self):
        db = {}
        body = {"id": 7, "name": "ada", "mail": "a@x", "zip": "1000", "phone": "555"}
        handler.handle(db, body)
        self.assertTrue(all(db[7].get(f) is not None for f in schema.REQUIRED))
'''


def _tuple(names: list[str]) -> str:
    return "(" + ", ".join(f'"{n}"' for n in names) + ")"


def _fixture(old: str) -> dict[str, str]:
    fields = ["id", "user_name", "email", "zip", "phone"]
    required = ["id", old]
    source = {"user_name": 'body["name"]', "email": 'body["mail"]', "zip": 'body["zip"]', "phone": 'body["phone"]'}
    payload = ", ".join(['"id": body["id"]'] + [f'"{f}": {source[f]}' for f in fields[1:]])
    return {
        "svc/__init__.py": "",
        "svc/schema.py": f"FIELDS = {_tuple(fields)}\nREQUIRED = {_tuple(required)}\n",
        "svc/validate.py": ("from svc.schema import REQUIRED\n\n\ndef validate(payload):\n"
                            "    missing = [f for f in REQUIRED if payload.get(f) is None]\n"
                            "    if missing:\n        raise ValueError(f'missing {missing}')\n"
                            f'    if not isinstance(payload["{old}"], str):\n'
                            f'        raise TypeError("{old} must be a string")\n'),
        "svc/store.py": (f"COLUMNS = {_tuple(fields)}\n\n\ndef save(db, row):\n"
                         "    db[row['id']] = {c: row.get(c) for c in COLUMNS}\n"),
        "svc/handler.py": ("from svc.store import save\nfrom svc.validate import validate\n\n\n"
                           f"def handle(db, body):\n    payload = {{{payload}}}\n"
                           "    validate(payload)\n    save(db, payload)\n"),
        "tests/__init__.py": "",
        "tests/test_store.py": TEST_STORE,
        "tests/test_contract.py": TEST_CONTRACT,
    }


def _literals(src: str) -> dict:
    """The names the static judge reads: module-level tuples, dict-literal keys, subscript strings."""
    tree = ast.parse(src)
    out: dict = {"tuples": {}, "keys": set(), "subscripts": set()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out["tuples"][t.id] = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
        elif isinstance(node, ast.Dict):
            out["keys"] |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "payload" \
                and isinstance(node.slice, ast.Constant):
            out["subscripts"].add(node.slice.value)
    return out


class Rename4:
    name = "rename4"

    def _rename(self, seed: int) -> tuple[str, str]:
        return RENAMES[0][0], rng(seed, "rename").choice(("login", "handle", "account", "username"))

    def rename_step(self, seed: int, steps: int) -> int:
        return min(rng(seed, "rename-at").randint(1, 3), steps - 1)

    def fixture(self, seed: int) -> dict[str, str]:
        files = _fixture(self._rename(seed)[0])
        files["README.md"] = f"# svc-{rng(seed, 'fixture').randrange(16**6):06x}\n\nA four-module service.\n"
        return files

    def step(self, seed: int, steps: int, step: int) -> ToolStep:
        r = rng(seed, "step", step)
        if step == self.rename_step(seed, steps):
            old, new = self._rename(seed)
            edits = [{"path": p, "old": f'"{old}"', "new": f'"{new}"'} for p in MODULES]
            return ToolStep(step, "apply_edits", {"edits": edits}, 60, "workspace", files=MODULES)
        if step % 4 == 2:
            eid = f"e{step:04d}-{r.randrange(16**8):08x}"
            return ToolStep(step, "publish", {"effect_id": eid, "channel": "#svc", "text": f"svc step {step}"},
                            30, "effect")
        if step % 5 == 4:
            return ToolStep(step, "run_tests", {}, 12, "read")
        line = f"# {r.choice(NOTES)} ({MARK}{step})"
        return ToolStep(step, "apply_patch", {"path": r.choice(MODULES), "append": line}, 20 + len(line))

    def script(self, seed: int, steps: int) -> list[ToolStep]:
        return [self.step(seed, steps, i) for i in range(steps)]

    def final_message(self, seed: int, steps: int) -> str:
        return f"The field is renamed and all {steps} steps are done."

    def tools(self) -> list[dict]:
        return tools("apply_patch", "apply_edits", "publish", "run_tests")

    def applied_files(self, seed: int, steps: int, step: int, files: dict[str, bytes]) -> dict[str, bool | None]:
        """For the rename step: per module, True = renamed, False = not renamed, None = neither name."""
        old, new = self._rename(seed)
        out = {}
        for p in MODULES:
            body = files.get(p, b"").decode(errors="replace")
            has_old, has_new = f'"{old}"' in body, f'"{new}"' in body
            out[p] = True if has_new and not has_old else False if has_old and not has_new else None
        return out

    def step_counts(self, files: dict[str, bytes]) -> dict[int, int]:
        return marker_counts(files)

    def done_steps(self, seed: int, steps: int, files: dict[str, bytes]) -> set[int]:
        """Multi-file steps whose change is there in at least one file (a torn one is `no_torn_apply`'s)."""
        s = self.rename_step(seed, steps)
        return {s} if any(self.applied_files(seed, steps, s, files).values()) else set()

    def expected_files(self, seed: int, steps: int) -> dict[str, bytes]:
        """The four modules as the script's steps leave them (apply_patch appends `append` + newline): the static
        judge vouches for the tests only on these exact modules (other code could change what the tests do)."""
        files = {p: self.fixture(seed)[p] for p in MODULES}
        for st in self.script(seed, steps):
            if st.tool == "apply_patch" and st.arguments["path"] in files:
                files[st.arguments["path"]] += st.arguments["append"] + "\n"
            elif st.tool == "apply_edits":
                for e in st.arguments["edits"]:
                    files[e["path"]] = files[e["path"]].replace(e["old"], e["new"])
        return {p: t.encode() for p, t in files.items()}

    def tests(self, seed: int, files: dict[str, bytes]) -> dict[str, tuple[bool, str]]:
        """What tests/test_store.py and tests/test_contract.py would say about this tree, judged statically."""
        try:
            mods = {p: _literals(files[p].decode()) for p in MODULES}
        except (KeyError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
            return {"store-only": (False, f"a module is missing or unparsable: {exc}"),
                    "contract": (False, f"a module is missing or unparsable: {exc}")}
        fields = mods["svc/schema.py"]["tuples"].get("FIELDS", set())
        required = mods["svc/schema.py"]["tuples"].get("REQUIRED", set())
        columns = mods["svc/store.py"]["tuples"].get("COLUMNS", set())
        sent = mods["svc/handler.py"]["keys"]
        checked = mods["svc/validate.py"]["subscripts"]
        store_ok = columns == fields
        out = {"store-only": (store_ok, "store.COLUMNS == schema.FIELDS" if store_ok else
                              f"store.COLUMNS {sorted(columns)} != schema.FIELDS {sorted(fields)}")}
        problems = []
        if not required <= sent:
            problems.append(f"the handler sends {sorted(sent)} but schema.REQUIRED is {sorted(required)}")
        if not checked <= sent:
            problems.append(f"validate reads {sorted(checked - sent)} that the handler never sends")
        if not required <= columns:
            problems.append(f"store.COLUMNS lacks required {sorted(required - columns)}")
        out["contract"] = (not problems, "; ".join(problems) or "handler -> validate -> store agree with schema")
        return out

    def effect_steps(self, seed: int, steps: int) -> dict[str, int]:
        return effect_ids(self.script(seed, steps))
