"""Shared check of the strategy tests: what our code passes to the data-parallel strategy it builds, read from the
arguments themselves rather than from the strategy's private attributes (Lightning keeps `timeout` and
`start_method` only as `_timeout` and `_start_method`)."""

from __future__ import annotations

from typing import Any

import pytest


def record_strategy_arguments(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """For this test, Lightning's registered strategy `name` is built as a subclass of its class that keeps the
    keyword arguments it was constructed with as `.arguments` (the registry is restored afterwards)."""
    from lightning.pytorch.strategies import StrategyRegistry

    entry = StrategyRegistry[name]  # {"strategy": class, "init_params": {...}, ...}

    class Recording(entry["strategy"]):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.arguments = kwargs

    monkeypatch.setitem(entry, "strategy", Recording)
