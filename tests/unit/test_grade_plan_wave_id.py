"""A plan.json whose wave id is not the one the wave ran as is named (exit 2), never graded as runner failures."""
from __future__ import annotations

import contextlib
import io
import shutil

import orjson
import pytest

from cluster import cli, results
from tests.unit.test_grade_fuzz import FIXTURE, no_picture  # noqa: F401 - a fixture, used by name


def test_a_plan_whose_wave_id_was_changed_is_named_not_blamed_on_the_runner(tmp_path, no_picture):  # noqa: F811
    """A hostile review's find: plan.json's `wave_id` set to "x" on a passing wave made every task fail
    no_foreign_writes (exit 1) and SUMMARY.md blame the runner."""
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    plan = orjson.loads((d / results.PLAN).read_bytes())
    ran_as = plan["wave_id"]
    (d / results.PLAN).write_bytes(orjson.dumps(dict(plan, wave_id="x")))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as ex:
        cli.main(["grade", str(d)])
    assert ex.value.code == 2, err.getvalue()
    assert "plan.json: field `wave_id` is 'x'" in err.getvalue() and ran_as in err.getvalue(), err.getvalue()
    assert results.TIMELINE in err.getvalue()
