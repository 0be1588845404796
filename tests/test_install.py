"""A non-editable install works: `pip install --no-deps .` from a copy of the repository into a fresh venv, then,
from a directory outside the repository, the package imports from that venv's site-packages, the console scripts
answer, `archsweep-train --help` lists every config group of conf/, and a tiny run trains and writes results.json.

Offline: the fresh venv has no pip and no dependencies of its own; a .pth file puts this environment's
site-packages (torch, Lightning, pip, setuptools, ...) after its own on sys.path. pip installs into the fresh venv
and leaves this environment's (editable) archsweep alone: it is outside the environment being installed into.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
IGNORED = (".git", ".venv", "venv", "outputs", "multirun", "build", "dist", "*.egg-info", "__pycache__",
           ".pytest_cache", ".ruff_cache", "wandb")
GROUPS = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "hydra")


def run(*cmd: str | Path, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(WANDB_MODE="disabled", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(venv, its site-packages, a working directory outside the repository)."""
    tmp = tmp_path_factory.mktemp("install")
    repo, venv, elsewhere = tmp / "repo", tmp / "venv", tmp / "elsewhere"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(*IGNORED), symlinks=True)
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(run(python, "-c", where, cwd=tmp).stdout.strip())
    ours = [p for p in (*site.getsitepackages(), sysconfig.get_paths()["purelib"]) if Path(p).is_dir()]
    (purelib / "_archsweep_test_deps.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(repo), cwd=tmp)
    elsewhere.mkdir()
    return venv, purelib, elsewhere


def test_package_imports_from_the_new_venv(installed):
    venv, purelib, elsewhere = installed
    out = run(venv / "bin" / "python", "-c", "import archsweep; print(archsweep.__file__); print(archsweep.conf_dir())",
              cwd=elsewhere)
    file, conf = (Path(line) for line in out.stdout.split())
    assert file == purelib / "archsweep" / "__init__.py"
    assert conf == purelib / "archsweep" / "conf"
    assert sorted(p.name for p in conf.iterdir() if p.is_dir() and p.name != "hydra") == GROUPS
    assert not (purelib / "src").exists() and not (purelib / "conf").exists() and not (purelib / "tests").exists()


def test_console_scripts_answer(installed):
    venv, _, elsewhere = installed
    out = run(venv / "bin" / "archsweep-train", "--help", cwd=elsewhere)
    for group in GROUPS:
        options = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
        assert f"{group}: {', '.join(options)}" in out.stdout
    assert "sweeps" in run(venv / "bin" / "archsweep-compare", "--help", cwd=elsewhere).stdout
    for name in ("evaluate", "generate"):
        out = run(venv / "bin" / f"archsweep-{name}", "--help", cwd=elsewhere)
        assert "decoding: beam, greedy, sample" in out.stdout
    assert "--train-tokenizer" in run(venv / "bin" / "archsweep-prepare", "--help", cwd=elsewhere).stdout
    assert "ckpt=<run dir or checkpoint> out=<folder>" in run(venv / "bin" / "archsweep-export", "--help",
                                                              cwd=elsewhere).stdout


def test_train_runs_from_outside_the_repository(installed):
    venv, _, elsewhere = installed
    run(venv / "bin" / "archsweep-train", "experiment=smoke", "trainer.max_steps=20", "logger=csv",
        "eval.decode_samples=0", cwd=elsewhere)
    (results,) = elsewhere.glob("outputs/runs/*/results.json")  # output_root is relative to the working directory
    res = json.loads(results.read_text())
    assert res["status"] == "completed" and res["steps"] == 20
    assert (results.parent / "checkpoints" / "last.ckpt").is_file()
