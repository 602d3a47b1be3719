"""A plan.json whose stored `config` is damaged is a damaged results file: exit 2, naming the file and the field
(issue 42's last hostile review, finding 4: `wave replay`, `shrink` and `wave resume` said 254, the code of bad user
input, while the exit-code reference says a damaged stored file is 2). What the user typed (`--address`) that the
config refuses is still 254, named as the option."""
from __future__ import annotations

import shutil

import orjson
import pytest

from cluster import results
from tests.unit.test_damaged_files_fuzz import COMMANDS, _cli, stubs  # noqa: F401 - a fixture, used by name
from tests.unit.test_grade_fuzz import FIXTURE


def _wave(tmp_path, **config):
    d = tmp_path / "w"
    shutil.copytree(FIXTURE, d)
    plan = orjson.loads((d / results.PLAN).read_bytes())
    plan["config"].update(config)
    (d / results.PLAN).write_bytes(orjson.dumps(plan))
    (d / results.TIMELINE).write_bytes(b"".join(x for x in (d / results.TIMELINE).read_bytes().splitlines(True)
                                                if b'"event":"wave_end"' not in x))  # (so resume reads on)
    return d


@pytest.mark.parametrize("command", ["resume", "replay", "shrink"])
@pytest.mark.parametrize("field, value", [("tasks", "many"), ("concurrency", -3), ("workload", 7)])
def test_a_damaged_stored_config_is_exit_2_naming_file_and_field(tmp_path, stubs, command, field, value):  # noqa: F811
    d = _wave(tmp_path, **{field: value})
    code, out, err = _cli(*COMMANDS[command](d))
    assert code == 2, (code, out, err)
    assert str(d / results.PLAN) in err and f"`{field}" in err, err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("command", ["resume", "replay", "shrink"])
def test_a_bad_address_option_is_still_254_named_as_the_option(tmp_path, stubs, command):  # noqa: F811
    d = _wave(tmp_path)
    code, out, err = _cli(*COMMANDS[command](d), "--address", "not an address")
    assert code == 254 and "--address" in err and "not an address" in err, (code, out, err)
