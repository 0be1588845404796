"""The numeric coordinate check (`archsweep-coordcheck`, core/report/coordcheck.py): under param=mup every option of
every model axis and plug-in keeps each module's change within 1.5x over 4 widths (d_model 64 to 512), and under
param=sp modules change more the wider the model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import archsweep
from archsweep.cli import coordcheck_main
from archsweep.core.model.config import AXES
from archsweep.core.report.coordcheck import coordcheck
from archsweep.core.train.config import schemas  # noqa: F401  (registers the groups' schemas)
from archsweep.core.train.lifecycle.checks import ConfigError, build_task, model_config
from archsweep.variants.model import KIND
from archsweep.variants.plugins import PLUGIN

CONF = Path(archsweep.conf_dir())
WIDTHS = [64, 128, 256, 512]
TINY = ["model=decoder_only", "task=copy", "task.batch_size=16", "model.n_layers=2", "model.d_model=64",
        "model.n_heads=4", "model.d_ff=256"]
MUP = ["param=mup", "model.param.base_width=64"]
# encoder_only as a masked LM (its token head): on is_sorted, one label per sequence, four steps' updates are too
# incoherent to judge (the first layer's change shrank 1.6x from d_model 64 to 512, as a random matrix's would)
KIND_TASKS = {"decoder_only": "copy", "encoder_decoder": "reverse", "encoder_only": "shakespeare_char",
              "vit": "digits"}
GROUPS = [axis for axis in AXES if axis != "param"] + PLUGIN.names()


def options() -> list[list[str]]:
    """Every option users pick (each yaml of each model axis, and of each plug-in group but `none`, which is off),
    and every kind."""
    out = []
    for group in GROUPS:
        for yaml in sorted((CONF / group).glob("*.yaml")):
            if yaml.stem != "none" or group in AXES:
                image = group == "pos" and yaml.stem == "sincos2d"
                out.append([f"{group}={yaml.stem}", *(["model=vit", "task=digits"] if image else [])])
    out += [[f"model={kind}", f"task={task}"] for kind, task in KIND_TASKS.items()]
    return out + [["optim=muon"], ["model.init=gpt2"], ["model.n_kv_heads=1"]]


def run(overrides: list[str], param: list[str], widths=WIDTHS, seeds: int = 3):
    torch.manual_seed(0)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[*TINY, *param, *overrides])
    task = build_task(cfg)
    return coordcheck(model_config(cfg, task), task, OmegaConf.to_container(cfg.optim, resolve=True), widths,
                      steps=4, seeds=seeds)


def test_the_options_cover_every_registered_variant():
    picked = {o.split("=")[1] for case in options() for o in case if o.split("=")[0] in (*GROUPS, "model")}
    for group in AXES:
        if group != "param":
            assert set(AXES[group].names()) <= picked, group
    assert set(KIND.names()) <= picked


@pytest.mark.slow
@pytest.mark.parametrize("overrides", options(), ids=" ".join)
def test_every_option_holds_its_coordinates_under_mup(overrides):
    group, _, option = overrides[0].partition("=")
    reason = getattr(AXES[group].get(option), "width_refusal", None) if group in AXES else None
    if reason:  # a variant that declares it cannot be parametrised yet is refused by name instead
        with pytest.raises(ConfigError, match=f"param=mup cannot parametrise {group}={option} yet"):
            run(overrides, MUP)
        return
    check = run(overrides, MUP)
    assert len(check.judged()) >= 8
    worst = max(check.judged().items(), key=lambda kv: kv[1].spread)
    assert check.passed(), f"{check.failures()} (widest {worst[0]}: {worst[1].change})"


@pytest.mark.slow
def test_under_sp_modules_grow_with_width_and_the_same_check_fails_under_the_mup_threshold():
    check = run([], ["param=sp"])
    growing = check.growing()
    assert len(growing) >= len(check.judged()) // 3, growing  # a third or more grow
    block = check.modules["decoder.blocks.0.self_attn.qkv_proj"]
    assert block.change[-1] > 4 * block.change[0]  # Adam's update of a hidden matrix moves its output ~ the width
    assert max(rec.spread for rec in check.judged().values()) > 4


def test_the_command_prints_the_table_and_exits_by_the_verdict(tmp_path, capsys):
    args = [*TINY, *MUP, "--widths", "64,128", "--steps", "1", "--seeds", "1", "--plot", str(tmp_path / "c.png")]
    code = coordcheck_main(args)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "change since init (RMS)" in out and "d=128" in out and "passed:" in out
    assert (tmp_path / "c.png").stat().st_size > 1000
    code = coordcheck_main([*args[:-2], "--plot", "none", "--threshold", "1.000001"])  # nothing is that flat
    assert code == 1 and "FAILED:" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["pos=alibbi"], "pos has no option 'alibbi'"),
    (["--widths", "64"], "compares at least two widths"),
    (["--steps", "0"], "--steps=0"),
])
def test_bad_input_is_refused_with_exit_2(args, message, capsys):
    assert coordcheck_main([*TINY, *args, "--plot", "none"]) == 2
    assert message in capsys.readouterr().err
