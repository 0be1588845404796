"""The plug-in contract: the model schema in the ConfigStore, hooks refused when misspelt, rules read what a plug-in
requires, export refuses what it cannot map (a plug-in without a Hugging Face equivalent, any weight its layout
leaves unmapped), no option name listed outside its registry, and the old spellings read as today's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import scripts
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from torch import Tensor, nn

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.model.config import AXES
from archsweep.core.model.hf import layout_for
from archsweep.core.model.hf.layouts import to_hf
from archsweep.core.model.legacy import upgrade_model_fields, upgrade_overrides
from archsweep.variants.hooks import AuxLoss
from archsweep.variants.model import KIND
from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import AttentionPlugin, OutputPlugin
from archsweep.variants.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
LLAMA = dict(kind="decoder_only", vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=96,
             max_seq_len=64, norm="pre", norm_type="rmsnorm", norm_eps=1e-6, pos="rotary", ffn="swiglu", bias=False,
             scale_embedding=False, tie_embeddings=False)
GPT2 = dict(kind="decoder_only", vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=128, max_seq_len=32,
            norm="pre", pos="learned", ffn={"name": "gelu", "approximate": "tanh"}, scale_embedding=False)


def test_model_config_is_the_model_groups_schema_in_the_config_store():
    import archsweep.core.train.config.schemas  # noqa: F401  (registers the schemas)

    node = ConfigStore.instance().load("schema_model.yaml").node
    assert OmegaConf.get_type(node) is ModelConfig
    assert set(node.keys()) == set(ModelConfig.__dataclass_fields__)


def test_config_py_holds_no_hand_type_checks():
    """The schema types the fields when the config is composed; config.py checks ranges and rules across fields
    only: no isinstance against a number type (a variant spec is a name or a mapping: that `str` test is logic)."""
    tree = ast.parse((ROOT / "src" / "core" / "model" / "config.py").read_text())
    scalar = {"int", "float", "bool"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(getattr(k, "id", None) in scalar for k in kinds):
                found.append(node.lineno)
    assert not found, f"isinstance type checks at lines {found}"


def make_registry() -> Registry:
    return Registry("demo", "archsweep.variants.plugins", default="")


@pytest.mark.parametrize(("method", "hook"), [("aux_loss", "aux_losses"), ("step_updates", "step_update"),
                                              ("score_mods", "score_mod"), ("outputs", "output")])
def test_a_method_a_slip_away_from_a_hook_is_refused_at_registration(method, hook):
    attrs = {method: lambda self, *a: {}}
    cls = type("Sloppy", (AttentionPlugin,), attrs)
    with pytest.raises(TypeError, match=rf"demo=sloppy: Sloppy\.{method} is one slip away from the hook '{hook}', "
                                        rf"so it would never be called; rename it to {hook}"):
        make_registry().register("sloppy")(cls)


def test_hooks_spelt_right_and_methods_of_other_names_register():
    class Fine(OutputPlugin):
        def transform_logits(self, logits: Tensor) -> Tensor:
            return logits

        def aux_losses(self, labelled: Tensor) -> dict[str, AuxLoss]:
            return {}

        def temperature_of_head(self, head: int) -> float:  # far from every hook
            return 1.0

    assert make_registry().register("fine")(Fine) is Fine


def test_a_plugin_is_refused_where_the_model_lacks_what_it_requires():
    with pytest.raises(ValueError, match=r"attn_sink needs the score matrix Q K\^T, which attention=performer never "
                                         r"forms; set attn_sink=none or choose attention="):
        ModelConfig(vocab_size=20, attention="performer", plugins={"attn_sink": {}}).validate()
    with pytest.raises(ValueError, match=r"attn_gate needs the layer's own q, k, v and output projections, which "
                                         r"attention=mla replaces with its own; set attn_gate=none"):
        ModelConfig(vocab_size=20, kind="decoder_only", attention="mla", plugins={"attn_gate": {}}).validate()
    with pytest.raises(ValueError, match=r"mtp needs one causal stack over one sequence, which kind=encoder_only is "
                                         r"not; set mtp=none or choose model=decoder_only"):
        ModelConfig(vocab_size=20, kind="encoder_only", plugins={"mtp": {}}).validate()


def test_a_misspelt_plugin_or_option_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"plugin='attn_gat' is not a known option; valid options: .*attn_gate.*"
                                         r"did you mean 'attn_gate'"):
        ModelConfig(vocab_size=20, plugins={"attn_gat": {}}).validate()
    with pytest.raises(ValueError, match=r"plugin=attn_gate has no option 'pr'"):
        ModelConfig(vocab_size=20, plugins={"attn_gate": {"pr": "head"}}).validate()
    with pytest.raises(ValueError, match=r"attn_gate: per='row' must be one of head, channel"):
        ModelConfig(vocab_size=20, plugins={"attn_gate": {"per": "row"}}).validate()


def test_plugins_set_to_none_are_off_and_the_canonical_form_is_sorted_with_defaults():
    cfg = ModelConfig(vocab_size=20, plugins={"z_loss": {}, "attn_gate": None, "attn_sink": {"learned": False}})
    cfg.validate()
    assert cfg.plugins == {"attn_sink": {"learned": False}, "z_loss": {"weight": 1e-4}}
    assert list(cfg.plugins) == sorted(cfg.plugins)


@pytest.mark.parametrize("plugin", [{"attn_gate": {"per": "head"}}, {"attn_gate": {"per": "channel"}},
                                    {"attn_sink": {"learned": True}}, {"attn_sink": {"learned": False}}])
def test_a_gated_or_sinked_llama_is_refused_by_export_naming_the_option(plugin):
    cfg = ModelConfig(**LLAMA, plugins=plugin).validate()
    [name] = plugin
    with pytest.raises(ValueError, match=rf"as LlamaForCausalLM: {name} \(.*no Hugging Face equivalent; set "
                                         rf"{name}=none\)"):
        layout_for(cfg)
    layout_for(ModelConfig(**LLAMA).validate())  # the same model without it exports


def test_a_training_only_plugin_exports():
    cfg = ModelConfig(**LLAMA, plugins={"z_loss": {"weight": 1e-3}}).validate()
    assert layout_for(cfg).architecture == "LlamaForCausalLM"


VIT = dict(kind="vit", vocab_size=3, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=17, image_size=[4, 4],
           patch_size=2, in_channels=3, n_classes=3, norm="pre", pos="learned", ffn="gelu")


@pytest.mark.parametrize("fields", [LLAMA, GPT2, VIT], ids=["llama", "gpt2", "vit"])
def test_a_weight_the_layout_does_not_map_is_refused_naming_the_key(fields):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**fields))
    state = dict(model.state_dict())
    layout = layout_for(model.config)
    assert len(to_hf(layout, model.config, state)) > 0  # the model as built maps completely
    where, attention = [(n, m) for n, m in model.named_modules() if n.endswith("blocks.1.self_attn")][0]
    attention.register_parameter("temperature", nn.Parameter(torch.ones(4)))
    key = re.escape(f"{where}.temperature")
    with pytest.raises(ValueError, match=rf"{layout.architecture} has no place for {key} \(of the module "
                                         rf"{re.escape(where)}\)"):
        to_hf(layout, model.config, dict(model.state_dict()))
    stack = where.split(".")[0]
    plugged = {**state, f"{stack}.blocks.0.self_attn.plugins.my_gate.gate_proj.weight": torch.ones(2, 2)}
    with pytest.raises(ValueError, match=rf"no place for {stack}\.blocks\.0\.self_attn\.plugins\.my_gate\."
                                         r"gate_proj\.weight \(of the option my_gate\)"):
        to_hf(layout, model.config, plugged)


def test_export_writes_nothing_for_a_gated_model(tmp_path):
    from archsweep.core.eval.export import export

    torch.manual_seed(0)
    model = build_model(ModelConfig(**LLAMA, plugins={"attn_gate": {}}))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "archsweep": {"model_config": model.config.to_dict(), "codec": None}},
               run / "checkpoints" / "best.ckpt")
    with pytest.raises(ValueError, match=r"attn_gate \(per=channel: no Hugging Face equivalent; set attn_gate=none\)"):
        export(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_old_flat_fields_become_plugins():
    old = {"d_model": 8, "qk_norm": "layernorm", "attn_gate": "elementwise", "attn_sink": "none", "z_loss": 0.0,
           "value_residual": "fixed", "value_residual_lambda": 0.25, "mtp": 2, "mtp_weight": 0.1,
           "logit_softcap": None, "attn_softcap": 50.0}
    assert upgrade_model_fields(old) == {"d_model": 8, "plugins": {
        "qk_norm": {"type": "layernorm"}, "attn_gate": {"per": "channel"}, "attn_softcap": {"cap": 50.0},
        "value_residual": {"learnable": False, "weight": 0.25}, "mtp": {"depths": 2, "weight": 0.1}}}


def test_old_command_line_spellings_are_read_as_todays_and_say_so():
    new, notes = upgrade_overrides(["model.attn_gate=headwise", "model.logit_softcap=30", "model.qk_norm=null",
                                    "model.mtp=2", "model.d_model=64", "-m", "model.attn_sink=none,learned",
                                    "model.attn_softcap=null,50"])
    assert new == ["attn_gate=headwise", "logit_softcap=gemma2", "model.plugins.logit_softcap.cap=30", "qk_norm=none",
                   "mtp=deepseek_v3", "model.plugins.mtp.depths=2", "model.d_model=64", "-m",
                   "attn_sink=none,learned", "model.attn_softcap=null,50"]  # a sweep of numbers is left alone
    assert notes[0] == "model.attn_gate=headwise is now attn_gate=headwise" and len(notes) == 5


def option_families() -> dict[str, set[str]]:
    """Each registry's option names (the registry is where they are listed), and each model group's yaml names."""
    families = {f"registry {r.axis}": set(r.names()) for r in [*AXES.values(), KIND, PLUGIN]}
    for group in (*AXES, "model", *PLUGIN.names()):
        folder = ROOT / "conf" / group
        families[f"conf/{group}"] = {p.stem for p in folder.glob("*.yaml")} - {"none"}
    return families


def test_no_option_name_is_listed_outside_its_registry():
    """No list, tuple, set or dict literal in src/ names two options of one registry or one model group (a list
    kept beside the registry falls behind it: export once dropped weights because of one). Exempt: legacy.py, the
    frozen record of old spellings (the flat fields that the plug-ins replaced keep the names they had)."""
    families = option_families()
    found = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        if path.name == "legacy.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                items = node.elts
            elif isinstance(node, ast.Dict):
                items = [k for k in node.keys if k is not None]
            else:
                continue
            strings = {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {family}: {sorted(strings & names)}"
                      for family, names in families.items() if len(strings & names) >= 2]
    assert not found, "\n".join(found)


def test_the_scan_catches_a_list_of_option_names(tmp_path):
    """The scan above is not blind: the list the norm types had before they were a registry is caught."""
    families = option_families()
    old = ast.parse('NORM_TYPES = ("layernorm", "rmsnorm", "dyt")')
    strings = {e.value for node in ast.walk(old) if isinstance(node, ast.Tuple) for e in node.elts}
    assert strings <= families["registry norm_type"]


def test_export_hf_refuses_a_run_before_its_first_step_naming_each_option(tmp_path):
    import os
    import sys

    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = scripts.run([sys.executable, str(ROOT / "train.py"), "model=decoder_only", "norm=pre", "pos=rotary",
                          "ffn=swiglu", "norm_type=rmsnorm", "attn_gate=elementwise", "export=hf", "logger=csv",
                          f"output_root={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0
    assert "error: export=hf: this model has no exact Hugging Face equivalent" in out.stderr
    assert "as LlamaForCausalLM: attn_gate (per=channel: no Hugging Face equivalent; set attn_gate=none), " \
           "scale_embedding=true (set model.scale_embedding=false)" in out.stderr
    assert not list(tmp_path.glob("**/checkpoints"))


def test_export_hf_accepts_a_model_a_layout_maps():
    from archsweep.core.train.lifecycle.checks import check_exportable

    check_exportable(ModelConfig(**LLAMA).validate())
    check_exportable(ModelConfig(**GPT2, plugins={"z_loss": {}}).validate())


def all_option_configs() -> list[ModelConfig]:
    """Every option of every axis and every plug-in, each in a small model of a kind that takes it."""
    base = dict(vocab_size=20, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=16)
    image = dict(kind="vit", image_size=[4, 4], patch_size=2, in_channels=3, n_classes=3)
    out = []
    for axis, registry in AXES.items():
        for name in registry.names():
            for kind in ({"kind": "decoder_only", "norm": "pre"}, {"kind": "encoder_decoder"}, image):
                try:
                    out.append(ModelConfig(**{**base, **kind, axis: name}).validate())
                    break
                except ValueError:
                    continue
    for name in PLUGIN.names():
        out.append(ModelConfig(**base, kind="decoder_only", norm="pre", tie_embeddings=False,
                               plugins={name: {}}).validate())
    out.append(ModelConfig(**base, kind="encoder_only").validate())
    return out


def test_every_parameter_of_every_option_has_a_role():
    from archsweep.variants.roles import ROLES, parameter_roles

    seen = set()
    for cfg in all_option_configs():
        model = build_model(cfg)
        roles = parameter_roles(model)
        assert set(roles) == {n for n, _ in model.named_parameters()}, cfg
        assert set(roles.values()) <= set(ROLES)
        seen |= set(roles.values())
    assert seen == set(ROLES)  # every role is met somewhere


def test_roles_say_what_each_parameter_is():
    from archsweep.variants.roles import parameter_roles

    torch.manual_seed(0)
    roles = parameter_roles(build_model(ModelConfig(**{**LLAMA, "ffn": "moe"}, plugins={"attn_sink": {}})))
    block = "decoder.blocks.0."
    assert roles["decoder.embed.weight"] == "embedding" and roles["head.weight"] == "head"
    assert roles[f"{block}self_attn.qkv_proj.weight"] == "hidden"
    assert roles[f"{block}self_attn.out_proj.weight"] == "hidden_out"
    assert roles[f"{block}ffn.experts.down_proj"] == roles[f"{block}ffn.experts.up_proj"] == "expert"
    assert roles[f"{block}self_attn.plugins.attn_sink.logits"] == "vector"
    assert roles[f"{block}attn_res.norm.weight"] == "vector"
    tied = parameter_roles(build_model(ModelConfig(**{**LLAMA, "tie_embeddings": True})))
    assert "head.weight" not in tied and tied["decoder.embed.weight"] == "embedding"  # one Parameter, one role
    mla = parameter_roles(build_model(ModelConfig(**{**LLAMA, "n_kv_heads": None, "attention": "mla"})))
    # the latent's down projection compresses the input; it is no residual output (the old suffix rule said it was)
    assert mla[f"{block}self_attn.kernel.kv_down_proj.weight"] == "hidden"
    assert mla[f"{block}self_attn.kernel.out_proj.weight"] == "hidden_out"
    vit = parameter_roles(build_model(ModelConfig(kind="vit", vocab_size=3, d_model=16, n_heads=2, n_layers=1,
                                                  d_ff=32, max_seq_len=17, image_size=[4, 4], patch_size=2,
                                                  in_channels=3, n_classes=3, norm="pre", pos="learned")))
    assert vit["embed.proj.weight"] == vit["embed.cls_token"] == "embedding" and vit["classifier.weight"] == "head"


def test_a_parameter_nobody_gave_a_role_is_refused_by_name():
    from archsweep.variants.roles import parameter_roles

    model = build_model(ModelConfig(**LLAMA))
    model.decoder.blocks[0].self_attn.register_parameter("table", nn.Parameter(torch.zeros(3, 4)))
    with pytest.raises(ValueError, match=r"no role for decoder\.blocks\.0\.self_attn\.table: the modules that own "
                                         r"them must declare one with roles\(\)"):
        parameter_roles(model)


def test_a_new_kind_of_hook_needs_no_edit_to_the_lightning_module(monkeypatch):
    """A module hook at a training event is one more name in `hooks.EVENTS`: the LightningModule calls the event."""
    from archsweep.core.train.lit import LitModel
    from archsweep.variants import hooks

    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def after_batch(self) -> None:
            self.calls += 1

    model = build_model(ModelConfig(**LLAMA))
    counter = Counting()
    model.decoder.blocks[0].add_module("counter", counter)
    monkeypatch.setitem(hooks.EVENTS, "train_batch_end", ("after_batch",))
    lit = LitModel(model, lambda m, b: m(b["tokens"]), {}, {}, 0.0, 0, {})
    lit.on_train_batch_end(None, {}, 0)
    lit.on_train_batch_end(None, {}, 1)
    assert counter.calls == 2
