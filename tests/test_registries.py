"""The registries and conf/ agree: every option yaml of an axis names a class registered under the yaml's name,
every registered variant has its yaml, constructors name their options, and a registry refuses what it should."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from archsweep.core.model.config import AXES, ModelConfig
from archsweep.variants.model import ALL_FORMS, KIND, form_of
from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding
from archsweep.variants.registry import Registry
from archsweep.variants.rules import Choices, check_rules

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
                    "beta_fast": 32.0, "beta_slow": 1.0, "yarn_ramp": "code"}
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
    (docstrings aside; `none` is also an option of other things: logger=none, reduction="none"; and `linear` is
    a decay shape of schedule=wsd in wsd.py, where it names no attention kind). The Hugging Face layouts
    (src/core/model/hf/) are exempt: each is a table from one set of our options to another library's class, so
    naming them is what it is for; nothing else in core branches on them. So is legacy.py, the frozen record of the
    old spellings it reads (the attn_sink field's old value `learned` is no pos option there)."""
    import ast

    from archsweep.variants.model import KIND

    names = {n for registry in [*AXES.values(), KIND] for n in registry.names()} - {"none"}
    found = []
    core = Path(__file__).parent.parent / "src" / "core"
    for path in sorted(p for p in core.rglob("*.py") if core / "model" / "hf" not in p.parents
                       and p.name != "legacy.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                    and node.value in names and (path.name, node.value) != ("wsd.py", "linear"):
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not found, found


def test_the_score_bias_flag_tells_the_truth():
    """The rules read `score_bias`: it is set exactly where an encoding adds to the scores."""
    for name in POS.names():
        cls = POS.get(name)
        hooks = (cls.attn_bias is not PositionalEncoding.attn_bias
                 or cls.content_bias is not PositionalEncoding.content_bias)
        assert cls.score_bias == hooks, name


def test_a_rule_reads_what_a_class_declares_not_its_name():
    """A variant from outside the package is held to the rules by its class attributes: no edit in rules.py."""

    class OwnBias(PositionalEncoding):
        score_bias = True

    names = {"kind": "decoder_only", "norm": "pre", "pos": "own_bias", "ffn": "relu", "attention": "performer"}
    classes = {axis: OwnBias if axis == "pos" else {"kind": KIND, **AXES}[axis].get(name)
               for axis, name in names.items()}
    fields = ModelConfig(kind="decoder_only").sizes()
    with pytest.raises(ValueError, match=r"attention=performer never forms the score matrix Q K\^T, so pos=own_bias"):
        check_rules(Choices(names, classes, fields))
    scoring = {**classes, "attention": AXES["attention"].get("full")}
    check_rules(Choices({**names, "attention": "full"}, scoring, fields))  # the same encoding with full attention
