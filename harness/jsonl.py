"""JSON-lines files, as the run writes them (``timeline.jsonl``, ``metrics.jsonl``,
``gpu.jsonl``, a fault's own log): one JSON object per line, appended while the run lasts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_objects"]


def read_objects(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, in file order. A missing file is empty; a line
    that is not a JSON object (a torn last line of a process that died writing it) is skipped."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for raw in p.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
