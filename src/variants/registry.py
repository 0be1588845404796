"""One registry per axis (`kind`, `norm`, `pos`, `ffn`, `attention`), kept next to the family's base class.

A variant registers itself where it is defined, under the name its yaml file carries:

    @POS.register("alibi")
    class ALiBi(PositionalEncoding):
        def __init__(self, n_heads: int, causal: bool) -> None: ...

Its constructor is typed and takes no **kwargs. Parameters named like a structural size (`d_model`, `n_heads`,
`head_dim`, ...; see `STRUCTURAL`) or like something the builder knows about the place being built (`causal`,
`role`, ...) are filled in by the builder; every other parameter is one of the variant's own options, given in
its yaml or as a mapping: `{"name": "rotary", "base": 500.0}`. An unknown option fails with the valid ones.

Every module in a family's package is imported when the registry is first asked (`discover`), so a new variant is
one file and one yaml: nothing else names it. A family's package holds only its registry (importing it imports no
torch); a class or function of the family is imported from the module that defines it
(`from archsweep.variants.attention.layers import SelfAttention`). A yaml may name its class instead, with Hydra's
`_target_` (`_target_: my_module.XPos`): the module is imported, which registers the class, so variants can also
live outside this package.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
import types
import typing
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Sizes of the architecture a variant may ask for by parameter name (ModelConfig fields and properties), and
# what the builder knows about the place it builds a part for.
STRUCTURAL = frozenset({
    "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len", "dropout", "attn_dropout", "bias",
    "n_layers", "n_decoder_layers", "vocab_size", "norm_eps", "norm_bias", "image_size", "patch_size",
    "causal", "role", "make_norm", "layer", "dim", "parts",
})


def discover(package: str) -> None:
    """Import every module of a family's package, so that each variant file registers itself."""
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{info.name}")


def close_match(value: str, valid: list[str]) -> str:
    text = str(value).lower()
    close = [v for v in valid if text.startswith(v) or v.startswith(text)]
    close = close or difflib.get_close_matches(text, valid, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions that turn `a` into `b`."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def check_hook_names(cls: type, what: str) -> None:
    """Refuse a class that defines a method a slip away from a hook name (`aux_loss` for `aux_losses`): the hook
    would never be called and nothing would say so. The hooks are `archsweep.variants.hooks.HOOKS` and the methods
    of the archsweep base classes the class derives from."""
    from archsweep.variants.hooks import HOOKS

    own = [k for k in cls.__mro__ if k.__module__.split(".")[0] not in ("torch", "builtins", "typing", "abc")
           and not k.__module__.startswith("archsweep.variants.") or k is cls]
    bases = [k for k in cls.__mro__ if k not in own and k.__module__.startswith("archsweep.")]
    hooks = set(HOOKS) | {n for k in bases for n, v in vars(k).items() if callable(v) or isinstance(v, classmethod)}
    hooks = {h for h in hooks if not h.startswith("_")}
    for klass in own:
        for method, value in vars(klass).items():
            if method.startswith("_") or method in hooks or not (callable(value) or isinstance(value, classmethod)):
                continue
            near = [h for h in sorted(hooks) if edit_distance(method, h) <= (1 if len(h) <= 6 else 2)]
            if near:
                raise TypeError(f"{what}: {klass.__qualname__}.{method} is one slip away from the hook {near[0]!r}, "
                                f"so it would never be called; rename it to {near[0]} (or to a name no hook is "
                                f"near, if it is not meant as that hook)")


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("NoneType", "None")


def _accepts(annotation: Any, value: Any) -> bool:
    """Light type check of an option value against its annotation (int, float, str, bool, Optional of those)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in args)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation in (str, bool):
        return isinstance(value, annotation)
    return True


def _own_init(cls: type) -> bool:
    """Whether the class (or a variant base) defines __init__, rather than inheriting nn.Module's."""
    return cls.__init__ is not object.__init__ and not cls.__init__.__module__.startswith("torch.")


def _parameters(cls: type) -> list[inspect.Parameter]:
    return list(inspect.signature(cls.__init__).parameters.values())[1:] if _own_init(cls) else []


class Registry(Generic[T]):
    """Option name -> class, for one axis. `package` is the family's package, imported on first use (the rules
    across axes are in `archsweep.variants.rules`)."""

    def __init__(self, axis: str, package: str, default: str) -> None:
        self.axis, self.package, self.default = axis, package, default
        self._classes: dict[str, type[T]] = {}
        self._discovered = False

    def register(self, name: str):
        def add(cls: type[T]) -> type[T]:
            check_hook_names(cls, f"{self.axis}={name}")
            known = self._classes.get(name)
            if known is not None and known.__qualname__ != cls.__qualname__:
                raise ValueError(f"{self.axis}={name!r} is registered twice: {known.__module__}.{known.__qualname__} "
                                 f"and {cls.__module__}.{cls.__qualname__}; rename one (and its yaml)")
            cls.option_name = name
            self._classes[name] = cls
            return cls

        return add

    def classes(self) -> dict[str, type[T]]:
        if not self._discovered:  # imports the variants (and torch): only once a variant is asked for
            self._discovered = True
            discover(self.package)
        return self._classes

    def names(self) -> list[str]:
        return sorted(self.classes())

    def get(self, name: str) -> type[T]:
        known = self.classes().get(name)
        if known is None:
            names = self.names()
            raise ValueError(f"{self.axis}={name!r} is not a known option; valid options: {', '.join(names)}"
                             f"{close_match(name, names)}")
        return known

    def name_of(self, cls: type) -> str:
        for name, known in self._classes.items():
            if known is cls:
                return name
        raise ValueError(f"{self.axis}: {cls.__module__}.{cls.__qualname__} is not registered; decorate it with "
                         f"@{self.axis.upper()}.register(\"<name of its yaml file>\")")

    def options(self, cls: type) -> dict[str, inspect.Parameter]:
        """The variant's own options: constructor parameters that are not structural."""
        hints = typing.get_type_hints(cls.__init__) if _own_init(cls) else {}
        params = {}
        for p in _parameters(cls):
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                raise TypeError(f"{cls.__qualname__}.__init__ takes *args/**kwargs; a variant's constructor must "
                                f"name each option (a misspelt key must fail loudly)")
            if p.name not in STRUCTURAL:
                params[p.name] = p.replace(annotation=hints.get(p.name, p.annotation))
        return params

    def resolve(self, value: Any) -> tuple[str, type[T], dict[str, Any]]:
        """(name, class, options with defaults filled) for an option name or a mapping {name | _target_, ...}."""
        if isinstance(value, str):
            name, target, given = value, None, {}
        elif isinstance(value, Mapping):
            given = dict(value)
            name, target = given.pop("name", None), given.pop("_target_", None)
        else:
            raise ValueError(f"{self.axis}={value!r} must be an option name ({', '.join(self.names())}) or a "
                             f"mapping of `name` (or `_target_`) and the variant's options")
        if target is not None:
            cls = self._import(str(target))
            if name is not None and name != self.name_of(cls):
                raise ValueError(f"{self.axis}: name={name!r} but _target_={target} is registered as "
                                 f"{self.name_of(cls)!r}; give one of them")
            name = self.name_of(cls)
        elif name is None:
            raise ValueError(f"{self.axis}={value!r} names no variant; give `name` (one of "
                             f"{', '.join(self.names())}) or `_target_`")
        else:
            cls = self.get(str(name))
        params = self.options(cls)
        unknown = sorted(set(given) - set(params))
        if unknown:
            valid = ", ".join(params) or "none"
            raise ValueError(f"{self.axis}={name} has no option {', '.join(map(repr, unknown))}"
                             f"{close_match(unknown[0], list(params))} (its options: {valid})")
        options = {}
        for key, p in params.items():
            if key not in given and p.default is inspect.Parameter.empty:
                raise ValueError(f"{self.axis}={name} needs its option {key!r}")
            options[key] = given.get(key, p.default)
            if not _accepts(p.annotation, options[key]):
                raise ValueError(f"{self.axis}={name}: option {key}={options[key]!r} must be "
                                 f"{_type_name(p.annotation)}")
        return str(name), cls, options

    def spec(self, value: Any) -> dict[str, Any]:
        """The canonical form kept in a config and a checkpoint: {"name", options...}, plus `_target_` for a
        class outside this package (so loading a checkpoint imports it)."""
        name, cls, options = self.resolve(value)
        out: dict[str, Any] = {"name": name, **options}
        if not cls.__module__.startswith("archsweep."):
            out["_target_"] = f"{cls.__module__}.{cls.__qualname__}"
        return out

    def build(self, value: Any, context: Mapping[str, Any]) -> T:
        """Construct the variant: structural parameters from `context`, options from `value`."""
        _, cls, options = self.resolve(value)
        structural = [p.name for p in _parameters(cls) if p.name in STRUCTURAL]
        missing = [p for p in structural if p not in context]
        if missing:
            raise TypeError(f"{cls.__qualname__} asks for {', '.join(missing)}, which the {self.axis} builder does "
                            f"not provide here (it provides {', '.join(sorted(context))})")
        return cls(**{p: context[p] for p in structural}, **options)

    def _import(self, target: str) -> type[T]:
        module, _, attr = target.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as e:
            raise ValueError(f"{self.axis}: cannot import _target_={target} ({e}); is its module on the Python "
                             f"path?") from None
        self.names()  # the built-in variants too, so name_of sees every class
        return cls
