"""The warm script runner (`scripts.run`, `scripts.popen`) against `subprocess`: the same script, arguments and
environment give the same exit code, output and files, with the run's own process, working directory, environment
and (when asked) session, signalled and killed as a Popen is."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import scripts

pytestmark = pytest.mark.slow  # script processes, served and fresh (only the slow tests start them)
ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import atexit, json, os, signal, sys, time
import probe_lib  # from the run's PYTHONPATH
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "marker": os.environ.get("ARCHSWEEP_TEST_MARKER"),
                  "path": sys.path[:3], "lib": probe_lib.WHERE, "main": __name__,
                  "torch_threads": __import__("torch").get_num_threads()}))
print("to stderr", file=sys.stderr)
mode = sys.argv[1]
if mode == "ppid":
    print("parent", os.getppid())
if mode == "sleep":
    open("ready", "w").close()
    time.sleep(600)
if mode == "kill":
    os.kill(os.getpid(), signal.SIGTERM)
if mode == "raise":
    raise ValueError("the probe's error")
sys.exit(0 if mode == "ppid" else int(mode))
"""


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "probe_lib.py").write_text("WHERE = __file__\n")
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return path


def lib_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """This process's environment with the probe's library folder first on PYTHONPATH."""
    path = os.pathsep.join([str(tmp_path / "lib"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, **more}


def both(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    return scripts.run(cmd, **kwargs), subprocess.run(cmd, **kwargs)


@pytest.mark.parametrize("mode", ["0", "3", "raise", "kill"])
def test_a_served_script_ends_as_a_fresh_process_does(probe, tmp_path, mode):
    env = lib_env(tmp_path, ARCHSWEEP_TEST_MARKER=f"marker-{mode}")
    warm, fresh = both([sys.executable, str(probe), mode], cwd=tmp_path / "work", env=env, capture_output=True,
                       text=True, timeout=120)
    assert warm.returncode == fresh.returncode == {"0": 0, "3": 3, "raise": 1, "kill": -signal.SIGTERM}[mode]
    assert warm.stdout == fresh.stdout  # argv, cwd, the marker, sys.path and PYTHONPATH, __main__, torch threads
    assert f'"marker": "marker-{mode}"' in warm.stdout and f'"cwd": "{tmp_path / "work"}"' in warm.stdout
    assert f'"path": ["{tmp_path}", "{tmp_path / "lib"}"' in warm.stdout
    assert ("atexit ran" in warm.stdout) == (mode != "kill")
    assert warm.stderr == fresh.stderr
    if mode == "raise":
        assert "ValueError: the probe's error" in warm.stderr


def test_a_run_is_served_unless_fresh_runs_are_asked_for(probe, tmp_path, monkeypatch):
    def parent() -> int:
        out = scripts.run([sys.executable, str(probe), "ppid"], cwd=tmp_path, env=lib_env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=True)
        return int(out.stdout.split("parent ")[1].split()[0])

    assert parent() not in (os.getpid(), os.getppid())  # the server's child
    monkeypatch.setenv(scripts.FRESH_ENV, "1")
    assert parent() == os.getpid()


def test_a_server_is_not_used_by_a_run_whose_interpreter_settings_differ(probe, tmp_path, monkeypatch):
    """A PYTHONPATH or thread count the server did not start with: the run is a fresh process (a fresh interpreter
    prints its own imports with PYTHONPROFILEIMPORTTIME; the server's child would print none)."""
    env = lib_env(tmp_path, PYTHONPROFILEIMPORTTIME="1")
    out = scripts.run([sys.executable, str(probe), "0"], cwd=tmp_path, env=env, capture_output=True, text=True,
                      timeout=120)
    assert out.returncode == 0 and "import time:" in out.stderr and "| torch" in out.stderr


def test_stderr_into_stdout_and_a_timeout_as_subprocess_has_them(probe, tmp_path):
    env = lib_env(tmp_path)
    merged = scripts.run([sys.executable, str(probe), "0"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120)
    assert "to stderr" in merged.stdout and "atexit ran" in merged.stdout and merged.stderr is None
    with pytest.raises(subprocess.TimeoutExpired):
        scripts.run([sys.executable, str(probe), "sleep"], cwd=tmp_path, env=env, capture_output=True, timeout=3)
    again = scripts.run([sys.executable, str(probe), "0"], cwd=tmp_path, env=env, capture_output=True, check=True,
                        timeout=120)
    assert b"atexit ran" in again.stdout  # the server goes on after a run it killed
    with pytest.raises(subprocess.CalledProcessError):
        scripts.run([sys.executable, str(probe), "3"], cwd=tmp_path, env=env, capture_output=True, check=True,
                    timeout=120)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def when_ready(proc, folder: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (folder / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the probe never got to its sleep"
        time.sleep(0.02)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_served_run_is_signalled_in_its_own_session_as_a_popen_one_is(probe, tmp_path, signum):
    results = {}
    for name, start in (("warm", scripts.popen), ("fresh", subprocess.Popen)):
        work = tmp_path / name
        work.mkdir()
        proc = start([sys.executable, str(probe), "sleep"], cwd=work, env=lib_env(tmp_path), stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        when_ready(proc, work)
        served = parent_of(proc.pid) != os.getpid()
        assert os.getpgid(proc.pid) == proc.pid  # its own process group, as start_new_session gives
        with pytest.raises(subprocess.TimeoutExpired):
            proc.communicate(timeout=0.2)  # still sleeping; a later communicate has all of it
        assert proc.poll() is None
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
        results[name] = served, proc.returncode, out.replace(str(work), "WORK"), err
    assert results["warm"][0] and not results["fresh"][0]
    # an uncaught KeyboardInterrupt prints its traceback, runs the atexit hooks, then ends Python by SIGINT too
    assert results["warm"][1:] == results["fresh"][1:] and results["warm"][1] == -signum
    assert ("atexit ran" in results["warm"][2]) == (signum == signal.SIGINT)
    assert ("KeyboardInterrupt" in results["warm"][2]) == (signum == signal.SIGINT)


def test_served_runs_go_side_by_side_and_end_each_with_its_own_code(probe, tmp_path):
    procs = {}
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        procs[name] = scripts.popen([sys.executable, str(probe), "sleep"], cwd=tmp_path / name, env=lib_env(tmp_path),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for name, proc in procs.items():
        when_ready(proc, tmp_path / name)
    assert parent_of(procs["one"].pid) == parent_of(procs["two"].pid) != os.getpid()  # both served, at once
    procs["two"].kill()
    assert procs["two"].wait(timeout=60) == -signal.SIGKILL and procs["one"].poll() is None
    procs["one"].terminate()
    assert procs["one"].wait(timeout=60) == -signal.SIGTERM
    assert procs["one"].communicate() == (None, None)


def test_a_served_training_run_equals_a_fresh_one(tmp_path):
    """A tiny train.py run both ways: the same losses at every step bit for bit, the same console but for the
    run's folder, figures and the speed test's line (the first run measures, the second reads what it saved)."""
    tiny = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.batch_size=16",
            "task.max_len=8", "task.val_batches=2", "task.test_batches=2", "trainer.max_steps=12",
            "trainer.val_check_interval=6", "trainer.log_every_n_steps=2", "schedule.warmup_steps=3", "logger=csv"]
    runs = {}
    for name, runner in (("warm", scripts.run), ("fresh", subprocess.run)):
        out = runner([sys.executable, "train.py", *tiny, f"hydra.run.dir={tmp_path / name}"], cwd=ROOT,
                     capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        with open(tmp_path / name / "metrics.csv") as f:
            losses = [(r["step"], r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]
        lines = [line for line in out.stdout.replace(str(tmp_path / name), "RUN").splitlines()
                 if "speed test" not in line and "the machine is busy" not in line]
        console = [re.sub(r"\d[\d,]*(\.\d+)?", "N", line) for line in lines]
        runs[name] = losses, console, out.stderr
    assert len(runs["warm"][0]) == 6
    assert runs["warm"] == runs["fresh"]
