"""The skip policy (tests/skip_policy.py) on example test files run by pytest itself: a skip on the allow-list passes,
any other fails the run naming the test and its reason; a pass without skips passes."""

from __future__ import annotations

import pytest

SKIPS = '''
import pytest

def test_needs_something():
    pytest.skip("{reason}")

def test_runs():
    assert True
'''


def run(pytester: pytest.Pytester, name: str, reason: str) -> pytest.RunResult:
    pytester.makepyfile(**{name: SKIPS.format(reason=reason)})
    # importlib mode: the example may share its name with a test module this process has imported already
    return pytester.runpytest("-p", "skip_policy", "--import-mode=importlib")


def test_a_skip_not_on_the_allow_list_fails_the_run_naming_it(pytester):
    result = run(pytester, "test_shards_of_mine", "no ../shared/data")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*skips not on the allow-list*", "*test_shards_of_mine.py::test_needs_something: "
                                 "no ../shared/data*"])


def test_a_skip_on_the_allow_list_passes(pytester):
    result = run(pytester, "test_train_conf", "needs a GPU")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=1)
    assert "allow-list" not in result.stdout.str()


def test_the_allow_list_matches_the_file_and_the_reason_together(pytester):
    result = run(pytester, "test_gpu_elsewhere", "needs a GPU")  # the reason of another file's entry
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_every_entry_names_a_test_file_that_exists_and_gives_a_reason():
    from pathlib import Path

    from skip_policy import ALLOWED

    here = Path(__file__).parent
    for (file, part), why in ALLOWED.items():
        assert (here / file).is_file(), file
        assert part in (here / file).read_text(), (file, part)  # the reason is the one that file gives
        assert len(why) > 40, (file, why)
