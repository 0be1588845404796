"""What a parametrisation answers, and the width ratios it answers from.

The framework (`archsweep.core.model.build`) builds the model, then, for a parametrisation that `transfers_width`,
the same model at the base sizes the parametrisation names (`base_sizes`). Each parameter is compared with its
namesake there: `Widths` holds how much its fan-in and fan-out grew (1 where a dimension does not scale). From the
role (`roles.py`) and those ratios the parametrisation gives

- `init_scale`: a factor on the parameter's initial standard deviation at the base shape (the init scheme's, as the
  base model drew it);
- `adam_lr`: a factor on the learning rate of an Adam-type update (elementwise, sign-like);
- `spectral_lr`: a factor on the spectral norm of an orthogonalised update (Muon), whose own shape factor the
  optimiser divides out;

and `forward_scales`: the width-dependent constants in the forward pass (`ForwardScales`), which the modules that own
them take through their `scale_forward` hook. Nothing is stored on tensors: a checkpoint holds the config, and every
build recomputes the roles and ratios, so resume, sharding and export see the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from archsweep.variants.roles import EXPERT

WIDTH_FIELDS = ("d_ff", "head_hidden")  # model fields that grow with d_model (a width ladder scales them alike)


def scaled_widths(sizes: Mapping[str, Any], width: int) -> dict[str, Any]:
    """d_model = `width` and every field of `WIDTH_FIELDS` that is set, in proportion (at least 1)."""
    ratio = width / sizes["d_model"]
    out: dict[str, Any] = {"d_model": width}
    for name in WIDTH_FIELDS:
        if sizes.get(name) is not None:
            out[name] = max(1, round(sizes[name] * ratio))
    return out


@dataclass(frozen=True)
class Widths:
    """A parameter's fan-in and fan-out over those of the same parameter in the base model."""

    fan_in: float = 1.0
    fan_out: float = 1.0

    @property
    def scales(self) -> bool:
        return self.fan_in != 1.0 or self.fan_out != 1.0


def fans(role: str | None, shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight: (out, in...) for a matrix or a convolution, (E, out, in) for an expert stack;
    a vector is its own fan-out."""
    if len(shape) < 2:
        return 1, shape[0] if shape else 1
    if role == EXPERT:
        return shape[-1], shape[-2]
    fan_in = 1
    for d in shape[1:]:
        fan_in *= d
    return fan_in, shape[0]


@dataclass(frozen=True)
class ForwardScales:
    """Width-dependent constants of the forward pass, each 1.0 where nothing changes: `scores` multiplies the
    attention scores (on the queries, after any QK-norm), `logits` the output of a head tied to the input embedding
    (an untied head's scale is in its initialisation and learning rate), `embedding` the token embedding's
    sqrt(d_model) factor where the model has one."""

    scores: float = 1.0
    logits: float = 1.0
    embedding: float = 1.0


class Parametrisation:
    """The standard behaviour: every factor 1 (subclasses override what they change)."""

    transfers_width: ClassVar[bool] = False  # True: the builder compares with a base model and applies the factors
    label: ClassVar[str] = ""

    def base_sizes(self, sizes: Mapping[str, Any]) -> dict[str, Any]:
        """The model fields of the base model (only those that differ)."""
        return {}

    def init_scale(self, role: str | None, widths: Widths) -> float:
        return 1.0

    def adam_lr(self, role: str | None, widths: Widths) -> float:
        return 1.0

    def spectral_lr(self, role: str | None, widths: Widths) -> float:
        return 1.0

    def forward_scales(self, sizes: Mapping[str, Any], base: Mapping[str, Any]) -> ForwardScales:
        return ForwardScales()

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        """Raise ValueError if the parametrisation cannot be applied with these sizes."""
