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
import scripts
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
    return scripts.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env, capture_output=True,
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
    out = scripts.run([sys.executable, str(ROOT / "train.py"), "pos=headless", "logger=csv",
                          f"output_root={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "conf/pos/<option>.yaml must begin with the line '# @package model.pos'" in out.stderr


# A model option that is not a leaf of an axis, and a norm type: each one .py (here one module) and one yaml, with no
# edit in src/. The plug-in acts at the attention layer's score hook; the norm type is built wherever a norm is.
OPTION_MODULE = '''
"""Test options that live outside the package."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from archsweep.variants.norm_type import NORM_TYPE
from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import SCORES, AttentionPlugin


@PLUGIN.register("score_temperature")
class ScoreTemperature(AttentionPlugin):
    """A learned temperature per head: scores / t_h, t_h = exp(log_t_h), starting at `start`."""

    requires = frozenset({SCORES})
    cross = True
    label = "learned per-head temperature"

    def __init__(self, n_heads: int, start: float = 1.0) -> None:
        super().__init__()
        self.log_t = nn.Parameter(torch.full((n_heads,), math.log(start)))

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if not options["start"] > 0:
            raise ValueError(f"score_temperature: start={options['start']} must be positive")

    def score_mod(self, scores: Tensor) -> Tensor:
        # (B, H, ..., Tq, Tk): heads on dim 1 (a sliding window's blocks add a dim)
        return scores * torch.exp(-self.log_t).view(1, -1, *[1] * (scores.dim() - 2))

    def roles(self) -> dict[str, str]:
        return {"log_t": "vector"}


@NORM_TYPE.register("scalenorm")
class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019): g x / ||x||, one learned scalar g starting at sqrt(dim)."""

    def __init__(self, dim: int, norm_eps: float) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.tensor(float(dim) ** 0.5))
        self.eps = norm_eps

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if sizes["norm_eps"] > 0.01:
            raise ValueError(f"norm_type=scalenorm divides by the norm clamped at norm_eps, so "
                             f"norm_eps={sizes['norm_eps']} would clamp real norms; set model.norm_eps=1e-5")

    def forward(self, x: Tensor) -> Tensor:
        return self.g * x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps)
'''

TEMPERATURE_YAML = """\
# @package model.plugins.score_temperature
# A learned temperature per head on the attention scores (a test option).
_target_: my_options.ScoreTemperature
start: 1.0
"""

SCALENORM_YAML = """\
# @package model.norm_type
# ScaleNorm (a test norm type).
_target_: my_options.ScaleNorm
"""


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    root = tmp_path_factory.mktemp("options")
    (root / "my_options.py").write_text(textwrap.dedent(OPTION_MODULE))
    for group, name, text in (("score_temperature", "learned", TEMPERATURE_YAML), ("norm_type", "scalenorm",
                                                                                       SCALENORM_YAML)):
        (root / "conf" / group).mkdir(parents=True)
        (root / "conf" / group / f"{name}.yaml").write_text(text)
    return root


LLAMA_LIKE = ("model=decoder_only", "norm=pre", "pos=rotary", "ffn=swiglu", "model.scale_embedding=false",
              "model.bias=false")


def test_help_lists_the_new_option_and_norm_type(options):
    out = run(options, "--help")
    assert out.returncode == 0, out.stderr
    groups = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert groups["score_temperature"].split(", ") == ["learned"]
    assert "scalenorm" in groups["norm_type"].split(", ") and "rmsnorm" in groups["norm_type"].split(", ")


def test_the_new_option_and_norm_type_train_and_come_back_from_the_checkpoint(options, tmp_path):
    run_dir = tmp_path / "run"
    out = run(options, *LLAMA_LIKE, "+score_temperature=learned", "norm_type=scalenorm",
              "experiment=smoke", "trainer.max_steps=6", "trainer.val_check_interval=3", "logger=csv",
              "eval.decode_samples=0", f"hydra.run.dir={run_dir}", f"output_root={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 6
    assert results["choices"]["score_temperature"] == "learned" and results["choices"]["norm_type"] == "scalenorm"
    code = ("from archsweep.core.model.checkpoint import load_model; "
            f"m = load_model({str(run_dir / 'checkpoints' / 'last.ckpt')!r}); a = m.decoder.blocks[0].self_attn; "
            "t = a.plugins['score_temperature']; "
            "print(type(t).__name__, tuple(t.log_t.shape), float(t.log_t.detach().abs().sum()) > 0, "
            "type(m.decoder.final_norm).__name__, a.score_hooks, m.config.plugins)")
    env = {**os.environ, "PYTHONPATH": str(options)}
    loaded = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    words = loaded.stdout.split()
    assert words[:5] == ["ScoreTemperature", "(2,)", "True", "ScaleNorm", "('score_temperature',)"]  # it learned
    assert "'_target_': 'my_options.ScoreTemperature'" in loaded.stdout


def test_the_new_option_is_refused_where_it_cannot_apply(options, tmp_path):
    out = run(options, "model=decoder_only", "attention=linear", "+score_temperature=learned", "logger=csv",
              f"output_root={tmp_path}")
    assert out.returncode != 0
    assert ("score_temperature needs the score matrix Q K^T, which attention=linear never forms; set "
            "score_temperature=none or choose attention=") in out.stderr
    out = run(options, "model=decoder_only", "norm_type=scalenorm", "model.norm_eps=0.5", "logger=csv",
              f"output_root={tmp_path}")
    assert out.returncode != 0
    assert "norm_type=scalenorm divides by the norm clamped at norm_eps, so norm_eps=0.5 would clamp real norms; " \
           "set model.norm_eps=1e-5" in out.stderr
    assert not list(tmp_path.glob("**/checkpoints"))


def test_export_refuses_the_new_option_and_norm_type_naming_them(options, tmp_path):
    code = textwrap.dedent('''
        import my_options  # registers the option and the norm type, as a notebook would
        from archsweep.core.model.build import ModelConfig
        from archsweep.core.model.hf import layout_for
        llama = dict(kind="decoder_only", vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=96, norm="pre",
                     norm_type="rmsnorm", pos="rotary", ffn="swiglu", bias=False, scale_embedding=False)
        print(layout_for(ModelConfig(**llama).validate()).architecture)
        for change in ({"plugins": {"score_temperature": {}}},
                       {"norm_type": "scalenorm"}):
            try:
                layout_for(ModelConfig(**{**llama, **change}).validate())
            except ValueError as e:
                print(e)
    ''')
    env = {**os.environ, "PYTHONPATH": str(options)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "LlamaForCausalLM"  # the same model without them exports
    assert "as LlamaForCausalLM: score_temperature (start=1.0: no Hugging Face equivalent; set " \
           "score_temperature=none)" in lines[1]
    assert "as LlamaForCausalLM: norm_type=scalenorm (LlamaForCausalLM has rmsnorm)" in lines[2]


def test_the_all_pairs_model_test_meets_the_new_option_and_norm_type(options):
    """tests/test_model_product.py, run with the module on the Python path and its yamls on the config path, builds
    the new option and norm type with every other option of the model groups (no edit to the test)."""
    env = {**os.environ, "PYTHONPATH": str(options), "ARCHSWEEP_CONFIG_PATH": str(options / "conf"),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          str(ROOT / "tests" / "test_model_product.py"), "-k", "score_temperature or scalenorm",
                          "--collect-only"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    collected = [line for line in out.stdout.splitlines() if "::" in line]
    assert any("score_temperature=learned" in line for line in collected), out.stdout[-2000:]
    assert any("-scalenorm-" in line for line in collected), out.stdout[-2000:]  # an axis option: shown bare
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          str(ROOT / "tests" / "test_model_product.py"), "-k", "score_temperature or scalenorm"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:]
    assert " passed" in ran.stdout.splitlines()[-1] and " failed" not in ran.stdout.splitlines()[-1]
