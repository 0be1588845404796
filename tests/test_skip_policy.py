"""The skip policy (tests/skip_policy.py) on example test files run by pytest itself: a skip on the allow-list passes,
any other fails the run naming the test and its reason; a pass without skips passes. The examples run with an
allow-list of their own (the real one names real test modules, which this process may have imported already)."""

from __future__ import annotations

import pytest

SKIPS = '''
import pytest

def test_needs_something():
    pytest.skip("{reason}")

def test_runs():
    assert True
'''
POLICY = '''
from skip_policy import SkipPolicy

def pytest_configure(config):
    config.pluginmanager.register(SkipPolicy(False, {("test_example_gpu.py", "needs a GPU"): "no GPU here"}))
'''


def run(pytester: pytest.Pytester, name: str, reason: str) -> pytest.RunResult:
    pytester.makeconftest(POLICY)
    pytester.makepyfile(**{name: SKIPS.format(reason=reason)})
    return pytester.runpytest()


def test_a_skip_not_on_the_allow_list_fails_the_run_naming_it(pytester):
    result = run(pytester, "test_example_shards", "no ../shared/data")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*skips not on the allow-list*", "*test_example_shards.py::test_needs_something: "
                                 "no ../shared/data*"])


def test_a_skip_on_the_allow_list_passes(pytester):
    result = run(pytester, "test_example_gpu", "needs a GPU")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=1)
    assert "allow-list" not in result.stdout.str()


def test_the_allow_list_matches_the_file_and_the_reason_together(pytester):
    assert run(pytester, "test_example_other", "needs a GPU").ret == pytest.ExitCode.TESTS_FAILED  # another file
    assert run(pytester, "test_example_gpu", "no ../shared/data").ret == pytest.ExitCode.TESTS_FAILED  # other reason


def test_every_entry_names_a_test_file_that_exists_and_gives_a_reason():
    from pathlib import Path

    from skip_policy import ALLOWED, allowed

    here = Path(__file__).parent
    for (file, part), why in ALLOWED.items():
        assert (here / file).is_file(), file
        assert part in (here / file).read_text(), (file, part)  # the reason is the one that file gives
        assert len(why) > 40, (file, why)
        assert allowed(f"tests/{file}::test_x", f"a reason with {part} in it") == why
