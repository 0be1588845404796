"""What W&B would receive, read from an offline `run-*.wandb` file with ../shared/tools/wandb_offline.py (no
server). Imported by the tests that check W&B's records."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

TOOL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "wandb_offline.py"


@cache
def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("wandb_offline", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_run(path: str | Path) -> dict[str, Any]:
    """{"name", "group", "tags", "config", "history", "summary", ...} of one offline run file."""
    return _tool().read_run(str(path))
