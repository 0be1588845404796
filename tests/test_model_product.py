"""Every option of every axis (kind, norm, norm_type, pos, ffn, attention, param: the yamls in conf/) and of the
attention plug-ins with a parameter on the layer's output or softmax (`FIELDS`: attn_gate, attn_sink, their yamls in
conf/)
builds, runs forward and backward with finite values, and every parameter that should learn gets a gradient, over a
set of combinations in which every allowed pair of options of two axes or fields meets at least once (all-pairs),
not over the full product. Each rule across axes (`archsweep.variants.rules.RULES`) is refused at least once (the
plug-ins' rule once per capability a plug-in requires), with a message naming the fields and a fix that works."""

from __future__ import annotations

import functools
import importlib
import itertools
import os
import re
from pathlib import Path

import pytest
import torch
import yaml

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.model.config import AXES
from archsweep.variants.model import BIDIRECTIONAL, CAUSAL, IMAGE, KIND, SOURCE_TARGET, form_of
from archsweep.variants.plugins import PLUGIN
from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding
from archsweep.variants.rules import RULES, Choices, check_rules

CONF = Path(__file__).resolve().parents[1] / "conf"
# more config folders, as train.py reads them ($ARCHSWEEP_CONFIG_PATH): a user's variants and plug-ins join the test
EXTRA = [Path(f) for f in os.environ.get("ARCHSWEEP_CONFIG_PATH", "").split(os.pathsep) if f]


def yamls(group: str) -> dict[str, Path]:
    """The options of a group, conf/ and the extra folders together (conf/ wins a name in both)."""
    return {p.stem: p for folder in reversed([CONF, *EXTRA]) for p in sorted((folder / group).glob("*.yaml"))}


def plugin_groups(folder: Path) -> list[str]:
    """The groups of a config folder whose options are plug-ins (`# @package model.plugins...`)."""
    return sorted(d.name for d in folder.iterdir() if d.is_dir() and any(
        p.read_text().startswith("# @package model.plugins") for p in d.glob("*.yaml")))


for _path in (p for folder in EXTRA for p in folder.rglob("*.yaml")):  # register the extra folders' classes
    _target = (yaml.safe_load(_path.read_text()) or {}).get("_target_")
    if _target:
        importlib.import_module(_target.rpartition(".")[0])

GROUPS = {"kind": "model", "norm": "norm", "norm_type": "norm_type", "pos": "pos", "ffn": "ffn",
          "attention": "attention", "param": "param"}  # field: conf group
AXIS_OPTIONS = {axis: sorted(yamls(group)) for axis, group in GROUPS.items()}
# plug-ins: the options of their groups (`none`: off, the default; a group from an extra folder gets it too)
FIELDS = {name: sorted({*yamls(name), "none"}) for name in ("attn_gate", "attn_sink",
                                                             *(g for f in EXTRA for g in plugin_groups(f)))}
OPTIONS = {**AXIS_OPTIONS, **FIELDS}
REGISTRIES = {"kind": KIND, **AXES}
FIELD_DEFAULTS = ("none",) * len(FIELDS)
# the plug-in's options each yaml conf/<name>/<option>.yaml sets; None for `none` (off)
PLUGIN_OPTIONS = {name: {option: None if option == "none" else yaml.safe_load(yamls(name)[option].read_text())
                         for option in options} for name, options in FIELDS.items()}
# options small enough to act on a 7-token input: a window that excludes keys, a global layer in the pattern
ATTENTION_OPTIONS = {"sliding_window": {"window": 3, "layer_pattern": "LG"}, "performer": {"n_features": 8},
                     "linear": {"chunk_size": 4}}
# muP's zeroed untied head passes no gradient upstream on the first backward (by design); every parameter is asked
# for one here, so the head starts as the base model drew it
PARAM_OPTIONS = {"mup": {"zero_readout": False}}
IMAGE_SIZES = {"image_size": [4, 6], "patch_size": 2, "in_channels": 3}  # 2 x 3 patches + a class token: 7 tokens

Combination = tuple[str, ...]  # one option per axis and field, in the order of OPTIONS
Pair = tuple[tuple[str, str], tuple[str, str]]  # ((axis, option), (axis, option)) of two different axes


def named(combination: Combination) -> dict[str, str]:
    return dict(zip(OPTIONS, combination, strict=True))


def chosen_plugins(combination: Combination, plugins: dict | None = None) -> dict[str, dict]:
    """The plug-ins a combination turns on (its fields' options), and `plugins` besides."""
    chosen = {name: PLUGIN_OPTIONS[name][option] for name, option in named(combination).items() if name in FIELDS}
    return {name: options for name, options in {**chosen, **(plugins or {})}.items() if options is not None}


def config(combination: Combination, plugins: dict | None = None, **fields) -> ModelConfig:
    """A small model of these options (and `plugins` besides), not yet validated."""
    chosen = {axis: option for axis, option in named(combination).items() if axis not in FIELDS}
    kind, attention, param = chosen.pop("kind"), chosen.pop("attention"), chosen.pop("param")
    values = dict(kind=kind, **chosen, param={"name": param, **PARAM_OPTIONS.get(param, {})},
                  plugins=chosen_plugins(combination, plugins), vocab_size=13, d_model=16,
                  n_heads=2, n_layers=2, d_ff=32, max_seq_len=16,
                  dropout=0.1, n_classes=3,
                  attention={"name": attention, **ATTENTION_OPTIONS.get(attention, {})},
                  **(IMAGE_SIZES if form_of(kind) == IMAGE else {}))
    return ModelConfig(**{**values, **fields})


def choices(combination: Combination, plugins: dict | None = None, **fields) -> Choices:
    """What the rules across axes see of this combination: the option names, their classes, the fields and the
    plug-ins' classes."""
    names = {axis: name for axis, name in named(combination).items() if axis in REGISTRIES}
    classes = {axis: REGISTRIES[axis].get(name) for axis, name in names.items()}
    return Choices(names, classes, config(combination, plugins, **fields).sizes(),
                   plugins={name: PLUGIN.get(name) for name in chosen_plugins(combination, plugins)})


@functools.cache
def allowed(combination: Combination) -> bool:
    """Whether the rules across axes accept the combination (read from the classes: no model is validated)."""
    try:
        check_rules(choices(combination))
    except ValueError:
        return False
    return True


@functools.cache
def pairs(combination: Combination) -> frozenset[Pair]:
    return frozenset(itertools.combinations(named(combination).items(), 2))


def all_pairs(candidates: list[Combination]) -> list[Combination]:
    """Greedy covering: take the candidate that covers the most pairs not yet covered (the first such, so the result
    is the same on every run) until every pair of some candidate is covered."""
    uncovered = set().union(*map(pairs, candidates))
    chosen = []
    while uncovered:
        best = max(candidates, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def field_pairs(combination: Combination) -> set[Pair]:
    """The pairs of a combination in which a field is one side (the fields come after the axes)."""
    return {pair for pair in pairs(combination) if pair[1][0] in FIELDS}


def field_universe(axis_combinations: list[Combination]) -> set[Pair]:
    """Every pair with a field's option that some allowed combination holds: for each such pair, the first allowed
    combination of the axis combinations, each with every choice of the fields, that holds it."""
    index = {name: i for i, name in enumerate(OPTIONS)}
    full = [c + f for c in axis_combinations for f in itertools.product(*FIELDS.values())]
    candidates = {((a, o), (f, v)) for a in OPTIONS for o in OPTIONS[a] for f in FIELDS for v in FIELDS[f]
                  if index[a] < index[f]}
    universe: set[Pair] = set()
    for (a, o), (f, v) in sorted(candidates - universe):
        if ((a, o), (f, v)) in universe:
            continue
        hit = next((c for c in full if c[index[a]] == o and c[index[f]] == v and allowed(c)), None)
        if hit is not None:
            universe |= field_pairs(hit)
    return universe


def with_fields(axis_combinations: list[Combination], candidates: list[Combination]) -> list[Combination]:
    """Each axis combination with the (allowed) fields' options that cover the most field pairs not yet covered;
    then more candidates, each with every choice of the fields, until every field pair is covered."""
    field_choices = list(itertools.product(*FIELDS.values()))
    uncovered = field_universe(candidates)
    chosen = []
    for c in axis_combinations:
        best = max((c + f for f in field_choices if allowed(c + f)), key=lambda full: len(pairs(full) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    while uncovered:
        first, second = sorted(uncovered)[0]
        holding = [c + f for c in candidates for f in field_choices if {first, second} <= set(named(c + f).items())]
        best = max((full for full in holding if allowed(full)), key=lambda full: len(pairs(full) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


ALLOWED = [c for c in itertools.product(*AXIS_OPTIONS.values()) if allowed(c + FIELD_DEFAULTS)]  # axes only
COMBINATIONS = with_fields([c[:len(AXIS_OPTIONS)] for c in all_pairs([c + FIELD_DEFAULTS for c in ALLOWED])],
                           ALLOWED)


def run(model, kind, x, mask):
    """Outputs and a loss of the kind's forward, by the data form it reads; image kinds read images of
    IMAGE_SIZES, which make as many tokens as the 7-token input of the others."""
    form = form_of(kind)
    if form == SOURCE_TARGET:
        out = model(x, x[:, :6], src_mask=mask, tgt_mask=mask[:, :6])
    elif form == IMAGE:
        out = model(torch.randn(2, 3, 4, 6))  # (B, n_classes)
        return out, out.logsumexp(-1).mean()
    else:
        out = model(x, pad_mask=mask)
    loss = out.logsumexp(-1).mean()
    if form == BIDIRECTIONAL:
        loss = loss + model.classify(x, pad_mask=mask).logsumexp(-1).mean()
    return out, loss


def label(combination: Combination) -> str:
    """A combination's test id: the axes' options, then each plug-in that is on as name=option."""
    return "-".join(o if a not in FIELDS else f"{a}={o}" for a, o in named(combination).items()
                    if a not in FIELDS or o != "none")


@pytest.mark.parametrize("combination", COMBINATIONS, ids=[label(c) for c in COMBINATIONS])
def test_combination_trains(combination):
    torch.manual_seed(0)
    kind = combination[0]
    image = form_of(kind) == IMAGE
    model = build_model(config(combination).validate())
    x = torch.randint(1, 13, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    out, loss = run(model, kind, x, mask)
    loss.backward()
    assert out.shape[-1] == (3 if image else 13) and torch.isfinite(out).all() and torch.isfinite(loss)
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(param.grad).all(), f"{name} has a non-finite gradient"
        if "pos.table" not in name:  # learned rows for positions never used stay zero, the rest must move
            assert param.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


def test_the_combinations_cover_every_allowed_pair_and_every_option():
    assert list(AXIS_OPTIONS) == ["kind", *AXES] and all(OPTIONS.values())  # every axis, each with its yamls
    axis_pairs = {pair for c in ALLOWED for pair in pairs(c + FIELD_DEFAULTS) if pair[1][0] not in FIELDS}
    universe = axis_pairs | field_universe(ALLOWED)
    covered = set().union(*map(pairs, COMBINATIONS))
    assert covered == universe, sorted(universe - covered)[:5]
    assert all(allowed(c) for c in COMBINATIONS) and len(set(COMBINATIONS)) == len(COMBINATIONS)
    for i, axis in enumerate(OPTIONS):
        assert {c[i] for c in COMBINATIONS} == set(OPTIONS[axis]), axis
    # all-pairs, not the product: no more than twice the pairs of the two axes with the most allowed pairs
    most = max(len({p for p in universe if (p[0][0], p[1][0]) == axes}) for axes in itertools.combinations(OPTIONS, 2))
    assert len(COMBINATIONS) <= 2 * most < len(ALLOWED)


def first(axis: str, test) -> str:
    """The first option of `axis` whose class passes `test`."""
    return next(n for n in REGISTRIES[axis].names() if test(REGISTRIES[axis].get(n)))


def combination(**chosen: str) -> Combination:
    """These options, and each other axis' default (each field's: none)."""
    defaults = {**{axis: registry.default for axis, registry in REGISTRIES.items()},
                **dict(zip(FIELDS, FIELD_DEFAULTS, strict=True))}
    return tuple(chosen.get(axis, defaults[axis]) for axis in OPTIONS)


KERNEL = first("attention", lambda c: not c.forms_scores)  # an attention kind without a score matrix
SINK = next(s for s in FIELDS["attn_sink"] if s != "none")  # a sink
BIASED = first("pos", lambda c: c.score_bias)  # an encoding that adds to the scores
PATCHES = first("pos", lambda c: c.image_only)  # an encoding of an image's patch grid
SEQUENCE = first("kind", lambda c: c.form != IMAGE)  # a kind that reads token sequences
PICKY = first("attention", lambda c: any(c.pos_refusal(POS.get(p), {}) for p in POS.names()))  # refuses an encoding
REFUSED_POS = first("pos", lambda c: REGISTRIES["attention"].get(PICKY).pos_refusal(c, {}) is not None)
CAUSAL_KIND = first("kind", lambda c: c.form == CAUSAL)  # the kind multi-token prediction extends
NOT_CAUSAL = first("kind", lambda c: c.form != CAUSAL)  # one it cannot extend
PER_LAYER = first("pos", lambda c: c.content_bias is not PositionalEncoding.content_bias)  # tables per layer
PROJECTING = first("attention", lambda c: c.projects)  # a kind that projects its input and output itself
GATE = next(g for g in FIELDS["attn_gate"] if g != "none")  # a gate
UNSCALED = first("attention", lambda c: getattr(c, "width_refusal", None))  # a kind muP cannot parametrise yet
OR = r"(?:\w+)(?: or \w+)*"
# per case: the rule, a combination and plug-ins besides it that it refuses, and its message; the named groups are
# the fixes it offers
REFUSED = {
    "score_bias_needs_scores": (
        "score_bias_needs_scores", combination(kind=SEQUENCE, attention=KERNEL, pos=BIASED), {},
        rf"attention={KERNEL} never forms the score matrix Q K\^T, so pos={BIASED} \(an additive bias on the "
        rf"scores\) has nothing to act on; choose pos=(?P<pos>{OR}), or attention=(?P<attention>{OR})$"),
    "softcap_needs_scores": (
        "plugins_get_what_they_require", combination(attention=KERNEL), {"attn_softcap": {"cap": 30.0}},
        rf"attn_softcap needs the score matrix Q K\^T, which attention={KERNEL} never forms; set attn_softcap=none "
        rf"or choose attention=(?P<attention>{OR})$"),
    "sink_needs_scores": (
        "plugins_get_what_they_require", combination(attention=KERNEL, attn_sink=SINK), {},
        rf"attn_sink needs the score matrix Q K\^T, which attention={KERNEL} never forms; set attn_sink=none or "
        rf"choose attention=(?P<attention>{OR})$"),
    "gate_needs_the_layers_projections": (
        "plugins_get_what_they_require", combination(kind=CAUSAL_KIND, attention=PROJECTING, attn_gate=GATE), {},
        rf"attn_gate needs the layer's own q, k, v and output projections, which attention={PROJECTING} replaces "
        rf"with its own; set attn_gate=none or choose attention=(?P<attention>{OR})$"),
    "mtp_needs_a_causal_stack": (
        "plugins_get_what_they_require", combination(kind=NOT_CAUSAL), {"mtp": {"depths": 1}},
        rf"mtp needs one causal stack over one sequence, which kind={NOT_CAUSAL} is not; set mtp=none or choose "
        rf"model=(?P<kind>{OR})$"),
    "patch_positions_need_images": (
        "patch_positions_need_images", combination(kind=SEQUENCE, pos=PATCHES), {},
        rf"pos={PATCHES} places positions on an image's 2D patch grid and needs an image input: model "
        rf"kind=(?P<kind>{OR}), not kind={SEQUENCE}; choose another pos for a token sequence$"),
    "attention_takes_the_encoding": (
        "attention_takes_the_encoding", combination(kind=SEQUENCE, attention=PICKY, pos=REFUSED_POS), {},
        rf"attention={PICKY} cannot take pos={REFUSED_POS}: [^;]+; choose pos=(?P<pos>{OR}), or another attention "
        rf"kind$"),
    "mtp_shares_the_encoding": (
        "plugins_get_what_they_require", combination(kind=CAUSAL_KIND, pos=PER_LAYER), {"mtp": {"depths": 1}},
        rf"mtp cannot be used with pos={PER_LAYER}: its score terms are learned per layer of the stack, and the "
        rf"prediction modules' blocks are not among those layers; choose pos=(?P<pos>{OR}), or set mtp=none$"),
    "width_refusal_is_heard": (
        "width_transfer_covers_the_choices", combination(attention=UNSCALED, param="mup"), {},
        rf"param=mup cannot parametrise attention={UNSCALED} yet: [^;]+; use param=(?P<param>sp), or another "
        rf"attention$"),
}
RULE = {rule.__name__: rule for rule in RULES}


def test_every_rule_has_a_refused_case():
    assert {rule for rule, *_ in REFUSED.values()} == set(RULE), "REFUSED holds a refused combination per rule"


@pytest.mark.parametrize("case", REFUSED)
def test_each_rule_refuses_naming_the_fields_and_a_fix_that_works(case):
    rule, refused, plugins, message = REFUSED[case]
    with pytest.raises(ValueError, match=message) as error:
        config(refused, plugins).validate()
    with pytest.raises(ValueError, match=message):  # this rule itself, called on the classes
        RULE[rule](choices(refused, plugins))
    fixes = re.search(message, str(error.value)).groupdict()
    assert fixes
    for axis, options in fixes.items():
        for option in options.split(" or "):  # each option the message offers is accepted
            fixed = tuple({**named(refused), axis: option}.values())
            config(fixed, plugins).validate()
