import json
import math

import numpy as np

from harness.checks.base import CheckResult
from harness.report.json_report import build_report, jsonable, read_report, write_report


def test_jsonable_makes_strict_json():
    v = jsonable({"a": float("inf"), "b": math.nan, "c": np.float64(1.5), "d": (1, np.int64(2)),
                  "e": CheckResult("x", "slo", True, 1, 2), 3: None})
    assert v == {"a": None, "b": None, "c": 1.5, "d": [1, 2],
                 "e": {"name": "x", "category": "slo", "passed": True, "observed": 1, "limit": 2, "detail": "",
                       "judged": True},
                 "3": None}
    json.dumps(v, allow_nan=False)


def test_build_and_write_report(tmp_path):
    rep = build_report(experiment="e", verdict="pass", stack={}, faults=[], phases={},
                       checks=[CheckResult("a", "slo", True, float("inf"), 1.0), {"name": "b", "passed": False}],
                       requests={"total": 0, "ok": 0, "failed": 0}, integrity={}, recovery={}, restarts=0,
                       errors=[], extra_field=np.float32(2.0))
    assert rep["checks"][0]["observed"] is None and rep["checks"][1]["name"] == "b"
    assert rep["extra_field"] == 2.0
    p = write_report(tmp_path / "sub" / "report.json", rep)
    typed = read_report(p)
    assert typed.verdict == "pass" and typed.checks[1].passed is False and typed.failed_checks()[0].name == "b"
    assert typed.to_dict() == rep   # every field kept, extra ones too
    assert not list((tmp_path / "sub").glob("*.tmp"))
