"""A skip is a decision (a pytest plug-in, registered by conftest.py): a run with any skip that is not on the
allow-list below fails, naming the test and its reason, so that a missing dependency, data folder or device cannot
turn a check into a silent pass. Each entry is a test file, a part of the skip's reason, and why the skip is right.

To run without something the suite needs (no ../shared/data, no torchscale), install or fetch it (README, Set-up;
docs/tasks.md); a new skip needs an entry here with its reason, reviewed like any change.
"""

from __future__ import annotations

import pytest

# (test file, a part of the skip's reason) -> why that skip is a decision, not a hole
ALLOWED: dict[tuple[str, str], str] = {
    ("test_gpu.py", "bench/gpu.py --tiny"): "no GPU: on a CPU these tests run once, inside bench/gpu.py --tiny "
                                            "(test_gpu_bench.py), not a second time on their own",
    ("test_train_conf.py", "needs a GPU"): "trainer=gpu builds a GPU trainer, which needs a GPU; the CPU machines "
                                           "check the refusal instead (test_refusals.py)",
    ("test_refusals.py", "root writes into read-only directories"): "running as root (containers, CI): root writes "
                                                                    "anywhere, so a read-only folder cannot be refused",
    ("test_attention_kinds.py", "compiled flex_attention disagrees"): "a torch bug detected at run time (the reason "
                                                                      "names the gap): backend=flex is then unusable "
                                                                      "on that machine, which the docs say",
}


def allowed(nodeid: str, reason: str, allow_list: dict[tuple[str, str], str] = ALLOWED) -> str | None:
    """Why the skip of `nodeid` for `reason` is allowed, or None."""
    file = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return next((why for (name, part), why in allow_list.items() if name == file and part in reason), None)


class SkipPolicy:
    def __init__(self, worker: bool, allow_list: dict[tuple[str, str], str] = ALLOWED) -> None:
        self.worker = worker  # an xdist worker: the controller sees every worker's reports and decides
        self.allow_list = allow_list
        self.skips: list[tuple[str, str]] = []
        self.unexpected: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            reason = reason.removeprefix("Skipped: ")
            self.skips.append((report.nodeid, reason))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.worker:
            return
        self.unexpected = [(nodeid, reason) for nodeid, reason in self.skips
                           if allowed(nodeid, reason, self.allow_list) is None]
        if self.unexpected and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.unexpected:
            return
        terminalreporter.section("skips not on the allow-list (tests/skip_policy.py): the run fails", red=True)
        for nodeid, reason in self.unexpected:
            terminalreporter.line(f"{nodeid}: {reason}")
        terminalreporter.line("install or fetch what they need (README, Set-up), or add an entry with its reason")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipPolicy(worker=hasattr(config, "workerinput")), "skip_policy_checker")
