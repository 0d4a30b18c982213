"""Run-file schema: good files pass, bad ones fail with one clear line, unknown versions are refused."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import jsonschema
import pytest

from attnconf.reports import runfile
from tests.test_reports_fixtures import FIXTURES, GOOD, torch_cpu as _torch_v1, upgrade


def torch_cpu():
    return upgrade(_torch_v1())


def test_schema_is_valid_draft_2020_12() -> None:
    schema = runfile.schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("name", GOOD)
def test_good_files_load(name: str) -> None:
    run = runfile.load(FIXTURES / name)
    assert run["schema_version"] == 2


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("bad-version.json", "unsupported schema_version 3 (this reader knows 2)"),
        ("bad-status.json", "records[0].status: 'weird' is not one of"),
        ("bad-missing-message.json", "records[3].message: None is not of type 'string'"),
    ],
)
def test_bad_files_fail_with_one_line(name: str, expected: str) -> None:
    with pytest.raises(runfile.RunFileError) as info:
        runfile.load(FIXTURES / name)
    text = str(info.value)
    assert expected in text and name in text
    assert "\n" not in text


def _invalid(mutate) -> str:
    obj = torch_cpu()
    mutate(obj)
    with pytest.raises(runfile.RunFileError) as info:
        runfile.validate(obj)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_specific_errors_name_the_field() -> None:
    assert "schema_version None" in _invalid(lambda o: o.pop("schema_version"))
    assert "'environment' is a required property" in _invalid(lambda o: o.pop("environment"))
    assert "records[0].clauses[0]" in _invalid(lambda o: o["records"][0]["clauses"].__setitem__(0, "op-1"))
    assert "verdict.verdict" in _invalid(lambda o: o["verdict"].__setitem__("verdict", "PASS"))
    assert "panel" in _invalid(lambda o: o["panel"]["torch:sdpa-math"][0].pop("out_b64"))
    assert "Additional properties" in _invalid(lambda o: o["records"][0].__setitem__("stauts", "pass"))
    assert "not in the run's divergences" in _invalid(lambda o: o["records"][2]["divergences"].append("NOPE"))


def test_not_json_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(runfile.RunFileError, match="not JSON"):
        runfile.load(bad)
    with pytest.raises(runfile.RunFileError, match="cannot read"):
        runfile.load(tmp_path / "missing.json")
    bad.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(runfile.RunFileError, match="not a JSON object"):
        runfile.load(bad)


def test_write_is_strict_json_and_round_trips_nonfinite(tmp_path: Path) -> None:
    import numpy as np

    obj = torch_cpu()
    obj["records"][3]["ratios"]["float32"]["max"] = math.nan
    obj["records"][0]["ratios"]["float32"]["max"] = np.float64(math.inf)
    obj["records"][0]["examples"] = np.int64(7)
    path = runfile.write(tmp_path / "sub" / "run.json", obj)
    text = path.read_text(encoding="utf-8")
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    back = runfile.load(path)
    assert math.isnan(back["records"][3]["ratios"]["float32"]["max"])
    assert back["records"][0]["ratios"]["float32"]["max"] == math.inf
    assert back["records"][0]["examples"] == 7
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]  # no temporary file left


def test_write_refuses_invalid_and_leaves_nothing(tmp_path: Path) -> None:
    obj = copy.deepcopy(torch_cpu())
    obj["schema_version"] = 99
    with pytest.raises(runfile.RunFileError, match="schema_version 99"):
        runfile.write(tmp_path / "run.json", obj)
    assert list(tmp_path.iterdir()) == []
