"""Adding a variant is one .py and one yaml, and nothing else names it: a positional encoding and an FFN that live
only in a temporary directory (a module on the Python path, yamls on Hydra's search path) train, show in --help,
W&B tags, results.json and the saved config, and come back from the checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from wandb_reader import read_run

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

MODULE = '''
"""Test variants that live outside the package."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from archsweep.variants.ffn import FFN
from archsweep.variants.ffn.base import FeedForward
from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding
from archsweep.variants.pos.sinusoidal import sinusoidal_table


@POS.register("scaled_sinusoidal")
class ScaledSinusoidal(PositionalEncoding):
    trace_label = "+ scaled sinusoidal positions"

    def __init__(self, d_model: int, scale: float = 1.0) -> None:
        super().__init__()
        self.d_model, self.scale = d_model, scale

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.scale * sinusoidal_table(positions, self.d_model).to(x.dtype)


@FFN.register("softplus")
class SoftplusFFN(FeedForward):
    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool) -> None:
        super().__init__(d_model, d_ff, F.softplus, dropout, bias)
'''

POS_YAML = """\
# @package model.pos
# Sinusoidal positions scaled by a constant (a test variant).
_target_: my_variants.ScaledSinusoidal
scale: 0.5
"""

FFN_YAML = """\
# @package model.ffn
# down(softplus(up(x))) (a test variant).
_target_: my_variants.SoftplusFFN
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    (root / "my_variants.py").write_text(textwrap.dedent(MODULE))
    for axis, text in (("pos", POS_YAML), ("ffn", FFN_YAML)):
        (root / "conf" / axis).mkdir(parents=True)
        name = "scaled_sinusoidal" if axis == "pos" else "softplus"
        (root / "conf" / axis / f"{name}.yaml").write_text(text)
    return root


def run(plugin: Path, *args: str, cwd: Path = ROOT, searchpath_override: bool = False) -> subprocess.CompletedProcess:
    """train.py with the module on the Python path and its yamls on Hydra's search path: by the environment
    variable, or by Hydra's `hydra.searchpath` override."""
    env = {**os.environ, "PYTHONPATH": str(plugin), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    if searchpath_override:
        args = (f"hydra.searchpath=[file://{plugin / 'conf'}]", *args)
    else:
        env["ARCHSWEEP_CONFIG_PATH"] = str(plugin / "conf")
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)



def test_help_lists_the_new_options(plugin):
    out = run(plugin, "--help")
    assert out.returncode == 0, out.stderr
    groups = dict(line.split(": ", 1) for line in out.stdout.splitlines() if line.startswith(("pos: ", "ffn: ")))
    assert "scaled_sinusoidal" in groups["pos"].split(", ") and "sinusoidal" in groups["pos"].split(", ")
    assert "softplus" in groups["ffn"].split(", ")


def test_new_variants_train_and_are_recorded(plugin, tmp_path):
    run_dir = tmp_path / "run"
    out = run(plugin, "pos=scaled_sinusoidal", "ffn=softplus", "experiment=smoke", "trainer.max_steps=6",
              "trainer.val_check_interval=3", "logger=wandb", "eval.decode_samples=0", f"hydra.run.dir={run_dir}",
              f"output_root={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 6
    assert results["choices"]["pos"] == "scaled_sinusoidal" and results["choices"]["ffn"] == "softplus"
    config = (run_dir / "config.yaml").read_text()
    assert "_target_: my_variants.ScaledSinusoidal" in config and "scale: 0.5" in config
    [path] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    recorded = read_run(str(path))
    assert "pos=scaled_sinusoidal" in recorded["tags"] and "ffn=softplus" in recorded["tags"]
    assert recorded["config"]["pos"] == "scaled_sinusoidal"
    assert recorded["config"]["cfg"]["model"]["pos"]["scale"] == 0.5

    # the checkpoint names the class, so a process with the module on its path rebuilds the model
    code = ("from archsweep.core.model.checkpoint import load_model; import sys; "
            f"m = load_model({str(run_dir / 'checkpoints' / 'last.ckpt')!r}); "
            "print(type(m.encoder.pos).__name__, m.encoder.pos.scale, type(m.encoder.blocks[0].ffn).__name__, "
            "m.config.pos)")
    env = {**os.environ, "PYTHONPATH": str(plugin)}
    loaded = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split()[:3] == ["ScaledSinusoidal", "0.5", "SoftplusFFN"]
    assert "'_target_': 'my_variants.ScaledSinusoidal'" in loaded.stdout


@pytest.mark.parametrize("searchpath_override", [False, True])
def test_a_misspelt_option_of_the_new_variant_is_refused(plugin, tmp_path, searchpath_override):
    out = run(plugin, "pos=scaled_sinusoidal", "+model.pos.scael=2.0", "logger=csv", f"output_root={tmp_path}",
              searchpath_override=searchpath_override)
    assert out.returncode != 0
    assert "pos=scaled_sinusoidal has no option 'scael'; did you mean 'scale'? (its options: scale)" in out.stderr
    assert not list(tmp_path.glob("**/checkpoints"))


def test_a_variant_yaml_without_its_package_line_is_refused(plugin, tmp_path):
    bad = tmp_path / "conf" / "pos"
    bad.mkdir(parents=True)
    (bad / "headless.yaml").write_text("# a comment first, so Hydra does not see the package line\n" + POS_YAML)
    env = {**os.environ, "PYTHONPATH": str(plugin), "WANDB_MODE": "disabled",
           "ARCHSWEEP_CONFIG_PATH": str(tmp_path / "conf")}
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), "pos=headless", "logger=csv",
                          f"output_root={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "conf/pos/<option>.yaml must begin with the line '# @package model.pos'" in out.stderr
