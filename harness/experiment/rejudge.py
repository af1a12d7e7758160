"""Re-judge a finished run from its saved data (``specchaos report DIR``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.errors import SpecchaosError, first_error
from harness.experiment.config import SpecchaosConfig
from harness.experiment.journal import journal_errors, steady_state_summary
from harness.report.judge import judge_run
from harness.report.allure import publish_allure
from harness.report.prometheus import publish_prometheus
from harness.report.json_report import write_report

__all__ = ["rejudge"]


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecchaosError(f"unreadable {what}: {exc}", where=str(path)) from None


def rejudge(run_dir: str | Path) -> dict[str, Any]:
    """Re-judge a finished run from its saved data (``specchaos report DIR``): the
    checks are pure functions of ``records.jsonl``, ``reference.jsonl``, ``timeline.jsonl``
    and the saved ``config.json``/``journal.json``/``run.json``; the report is
    rewritten, and so are ``timeline.png``, the Allure results and ``specchaos.prom`` (pushed
    again when a Pushgateway is configured). Idempotent: re-judging twice gives the same report.

    Raises:
        SpecchaosError: the directory lacks the saved run data, or a saved file is
            unreadable or invalid (named with its field).
    """
    d = Path(run_dir)
    if not (d / "config.json").is_file() or not (d / "timeline.jsonl").is_file():
        raise SpecchaosError("not a specchaos run directory (config.json or timeline.jsonl missing)", where=str(d))
    try:
        cfg = SpecchaosConfig.model_validate(_read_json(d / "config.json", "run configuration"),
                                             context={"recorded": True})
    except ValidationError as exc:
        field_path, msg, _ = first_error(exc)
        raise SpecchaosError(msg, where=f"{d / 'config.json'}: {field_path}") from None
    journal = _read_json(d / "journal.json", "Chaos Toolkit journal") if (d / "journal.json").is_file() else None
    if (d / "run.json").is_file():
        meta = _read_json(d / "run.json", "run metadata")
    else:   # a run directory from before run.json existed
        doc = _read_json(d / "experiment.json", "experiment") if (d / "experiment.json").is_file() else {}
        old = _read_json(d / "report.json", "report") if (d / "report.json").is_file() else {}
        meta = {"experiment": doc.get("title", d.name), "stack": old.get("stack") or {},
                "errors": journal_errors(journal),
                "interrupted": bool(journal and journal.get("status") == "interrupted"),
                "journal_status": (journal or {}).get("status"), "steady_state": steady_state_summary(journal)}
    if journal is None and not meta.get("interrupted") and not meta.get("errors"):
        # No journal and nothing said why: the harness itself died (e.g. SIGKILL).
        meta["errors"] = ["the run ended without a journal: the harness was killed before it finished"]
        meta["interrupted"] = True
    report = judge_run(d, cfg, dict(meta), journal=journal)
    write_report(d / "report.json", report)
    publish_allure(d, report, journal)   # timeline.png + Allure results; never raises
    publish_prometheus(d, report, cfg.prometheus)   # specchaos.prom (+ push); never raises
    return report
