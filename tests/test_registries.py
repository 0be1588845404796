"""The registries and conf/ agree: every option yaml of an axis names a class registered under the yaml's name,
every registered variant has its yaml, constructors name their options, and a registry refuses what it should."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from archsweep.core.model.config import AXES, ModelConfig
from archsweep.variants.model import ALL_FORMS, KIND, form_of
from archsweep.variants.pos import POS
from archsweep.variants.registry import Registry

CONF = Path(__file__).resolve().parents[1] / "conf"
YAMLS = [(axis, p) for axis in AXES for p in sorted((CONF / axis).glob("*.yaml"))]


@pytest.mark.parametrize("axis,path", YAMLS, ids=[f"{a}/{p.stem}" for a, p in YAMLS])
def test_each_option_yaml_names_the_class_registered_under_its_file_name(axis, path):
    assert path.read_text().startswith(f"# @package model.{axis}\n")  # Hydra reads the package from line one
    spec = OmegaConf.to_container(OmegaConf.load(path))
    registry = AXES[axis]
    name, cls, options = registry.resolve(spec)
    assert name == path.stem and cls.option_name == path.stem
    assert set(spec) - {"_target_"} == set(options), "the yaml lists every option, with its default"


@pytest.mark.parametrize("axis", list(AXES))
def test_every_registered_variant_has_its_yaml(axis):
    assert AXES[axis].names() == sorted(p.stem for p in (CONF / axis).glob("*.yaml"))


def test_every_kind_has_a_model_yaml_and_a_data_form():
    assert KIND.names() == sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
    for kind in KIND.names():
        spec = OmegaConf.load(CONF / "model" / f"{kind}.yaml")
        assert spec.get("model", spec).kind == kind  # a kind choosing its own axis defaults is a _global_ yaml
        assert form_of(kind) in ALL_FORMS


def test_canonical_spec_fills_defaults_and_round_trips():
    spec = POS.spec("rotary")
    assert spec == {"name": "rotary", "base": 10000.0, "scaling": "none", "factor": 1.0, "original_length": None,
                    "beta_fast": 32.0, "beta_slow": 1.0}
    assert POS.spec(spec) == spec and POS.spec({"_target_": "archsweep.variants.pos.rotary.Rotary"}) == spec
    assert ModelConfig(pos={"name": "rotary", "base": 500}).validate().pos == {**spec, "base": 500}


def test_a_registry_refuses_kwargs_constructors_and_a_second_class_under_one_name():
    registry = Registry("demo", "archsweep.variants.pos", default="x")

    @registry.register("loose")
    class Loose:
        def __init__(self, d_model: int, **options) -> None: ...

    with pytest.raises(TypeError, match=r"takes \*args/\*\*kwargs; a variant's constructor must name each option"):
        registry.resolve("loose")
    with pytest.raises(ValueError, match=r"demo='loose' is registered twice"):
        @registry.register("loose")
        class Other:
            pass


def test_a_name_and_a_target_that_disagree_are_refused():
    with pytest.raises(ValueError, match=r"name='alibi' but _target_=archsweep.variants.pos.rotary.Rotary is "
                                         r"registered as 'rotary'"):
        POS.resolve({"name": "alibi", "_target_": "archsweep.variants.pos.rotary.Rotary"})


def test_core_never_names_a_variant():
    """The framework asks the registries; no option name of a variant axis is a string literal in src/core
    (docstrings aside; `none` is also an option of other things: logger=none, reduction="none")."""
    import ast

    from archsweep.variants.model import KIND

    names = {n for registry in [*AXES.values(), KIND] for n in registry.names()} - {"none"}
    found = []
    for path in sorted((Path(__file__).parent.parent / "src" / "core").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                    and node.value in names:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not found, found


def test_what_the_sources_declare_matches_the_imported_classes():
    from archsweep.variants.attention import ATTENTION
    from archsweep.variants.pos.base import PositionalEncoding

    for name in POS.names():
        cls = POS.get(name)
        hooks = (cls.attn_bias is not PositionalEncoding.attn_bias
                 or cls.content_bias is not PositionalEncoding.content_bias)
        assert cls.score_bias == hooks, name  # the flag tells the truth
        fresh = Registry("pos", "archsweep.variants.pos", "sinusoidal")  # reads sources, imports nothing
        assert fresh.declared(name, "score_bias") == cls.score_bias, name
    for name in ATTENTION.names():
        fresh = Registry("attention", "archsweep.variants.attention", "full")
        assert fresh.declared(name, "forms_scores") == ATTENTION.get(name).forms_scores, name
        target = {"_target_": f"{ATTENTION.get(name).__module__}.{ATTENTION.get(name).__qualname__}"}
        assert fresh.static_name(target) == name
    assert sorted(Registry("pos", "archsweep.variants.pos", "x").declared_names()) == POS.names()


def test_a_cross_axis_refusal_comes_before_torch_is_imported():
    import subprocess
    import sys

    code = ("import sys\nfrom archsweep.core.model.config import ModelConfig\n"
            "from archsweep.variants.model import form_of\n"
            "print(form_of('decoder_only'), form_of('encoder_decoder'))\n"
            "try:\n    ModelConfig(vocab_size=9, attention='performer', pos='alibi').validate()\n"
            "except ValueError as e:\n    print(e)\nprint('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "attention=performer never forms the score matrix" in out and out.strip().endswith("False"), out
    assert out.startswith("causal source_target"), out  # a kind's form, read from its source
