"""Test markers kept here rather than in the test files: the `slow` tests of modules that are edited often, so the
mark cannot be lost in a merge. Other modules mark their own (`pytestmark = pytest.mark.slow` or
`@pytest.mark.slow`).

    python -m pytest -q                   # everything (what CI runs)
    python -m pytest -m "not slow" -q     # the quick tests: no train.py subprocesses, sweeps or learning tests
"""

from __future__ import annotations

import pytest

import archsweep.core.train.schemas  # noqa: F401  (registers the config groups' schemas, which the yaml files name)

# module -> its slow tests by function name (every parametrisation), or "*" for the whole module
SLOW = {
    "test_model_learning.py": "*",  # learning tests: tiny models overfit a batch
    "test_inference_cli.py": "*",  # trains two checkpoints through train.py, then generate.py / evaluate.py
    "test_diagnostics.py": {"test_train_logs_norms_entropy_maps_and_accuracy_by_length",
                            "test_diverging_run_is_stopped_and_marked"},  # train.py runs
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        slow = SLOW.get(item.path.name)
        name = getattr(item, "originalname", item.name)
        if slow == "*" or (slow and name in slow):
            item.add_marker(pytest.mark.slow)
