"""Hooks through which a variant brings its own losses, parameters and costs, so the framework asks the modules
instead of knowing architectures (a mixture-of-experts FFN is one file). Every hook is optional: a module defines
the method, and the framework finds it by walking `model.modules()`. `ModuleHooks` names every one (the contract;
the methods of a variant's base classes, the plug-ins' hook points among them, are hooks too): a registered
variant or plug-in that defines a method a slip away from a hook name (`aux_loss`) is refused when it registers
(`registry.check_hook_names`).

- `aux_losses(labelled) -> dict[str, AuxLoss]`: the auxiliary losses of the module's last training forward
  (recorded only when `self.training` and gradients are on), then forgotten. `labelled` (the output's positions,
  True where a label counts) is for modules at the output; others ignore it. The training step adds
  `weight * value` to the loss and logs `value` as `train/aux/<name>`; equal names from several modules
  (one balancing loss per layer) are summed. A training-mode forward outside a step (activation checkpointing's
  recomputation) records too; the next step's forward replaces that record before it is read.
- `init_parameters(scheme, n_layers)`: initialises the module's own parameters (not its children's) after the
  default rules (`init.py`), for parameters that are not an nn.Linear or an embedding.
- `init_fused(scheme)`: re-initialises an nn.Linear that fuses several projections per part, right after the
  default rules (Xavier's fans of separate q, k, v projections).
- `roles() -> dict[str, str]`: the role of parameters under the module where the default by type is not it
  (`roles.py`: an attention output writes into the residual stream, an untied head, stacked experts).
- `weight_matrices() -> list[Parameter]`: its weight matrices that are not nn.Linear weights, 2-D or stacked
  (E, out, in): Muon orthogonalises them (each slice on its own), DeepNorm scales them as FFN matrices.
- `active_params() -> int`: how many of the module's parameters (children included) one token uses; default all.
  `flops(shape)` (flops.py) counts the work a token does; with `shape.total` it counts every parameter's work.
- `diagnostics(where) -> dict[str, Tensor]`: figures of the module's training forwards of this step (a router's
  expert load), logged as `diag/<name>` on log steps; `where` is the module's place (`decoder.0.ffn`), for names.
- `scale_forward(scales)`: takes the width-dependent forward constants of a parametrisation (`param/base.py`:
  `ForwardScales`: attention scores, tied logits, the embedding factor) that the module owns; called once after
  the model is built (never stored in a checkpoint: every build recomputes them).
- `step_update()`: called once per optimiser step after its last backward (recomputation included) and before the
  optimiser's step: state changed outside the gradient (a router's load-balancing bias), and per-step records reset.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from torch import Tensor, nn


class AuxLoss(NamedTuple):
    """One auxiliary loss of a step: its configured weight and its unweighted value (a scalar tensor)."""

    weight: float
    value: Tensor


class ModuleHooks(Protocol):
    """Every module hook, with its signature (see the list above). A module implements any of them."""

    def aux_losses(self, labelled: Tensor) -> dict[str, AuxLoss]: ...

    def init_parameters(self, scheme: str, n_layers: int) -> None: ...

    def init_fused(self, scheme: str) -> None: ...

    def weight_matrices(self) -> list[nn.Parameter]: ...

    def active_params(self) -> int: ...

    def flops(self, shape: Any) -> float: ...

    def diagnostics(self, where: str) -> dict[str, Tensor]: ...

    def step_update(self) -> None: ...

    def roles(self) -> dict[str, str]: ...

    def scale_forward(self, scales: Any) -> None: ...


HOOKS = frozenset(n for n in vars(ModuleHooks) if not n.startswith("_"))  # and each base class's methods


def collect_aux_losses(model: nn.Module, labelled: Tensor) -> dict[str, AuxLoss]:
    """Every module's `aux_losses(labelled)`, by name. Equal names are summed: the value, and the weight of the sum
    is the one they share (differing weights for one name are refused)."""
    found: dict[str, AuxLoss] = {}
    for module in model.modules():
        hook = getattr(module, "aux_losses", None)
        if not callable(hook):
            continue
        for name, (weight, value) in hook(labelled).items():
            if name in found and found[name].weight != weight:
                raise ValueError(f"auxiliary loss {name!r} is reported with weights {found[name].weight} and {weight} "
                                 f"by different modules; give each weight its own loss name")
            found[name] = AuxLoss(weight, found[name].value + value if name in found else value)
    return found


def collect_diagnostics(model: nn.Module) -> dict[str, Tensor]:
    """Every module's `diagnostics(where)`, `where` its place in the model (`decoder.blocks.0.ffn` -> `decoder.0.ffn`;
    a compiled model's wrapper left out)."""
    found: dict[str, Tensor] = {}
    for name, module in model.named_modules():
        hook = getattr(module, "diagnostics", None)
        if callable(hook):
            found.update(hook(name.replace("_orig_mod.", "").replace("blocks.", "")))
    return found


# The training events at which the LightningModule calls module hooks that take no argument, and which hooks:
# a new kind of such hook is one more name here (and the method on a module), with no edit to the LightningModule.
EVENTS: dict[str, tuple[str, ...]] = {
    "before_optimizer_step": ("step_update",),  # after every backward of a step, before the optimiser's step
    "train_batch_end": (),  # after the optimiser's step (or a micro-batch of gradient accumulation)
    "validation_epoch_end": (),  # after each validation
}


def call_event(model: nn.Module, event: str) -> None:
    """Every module's hooks of `event` (`EVENTS`), in module order."""
    for name in EVENTS[event]:
        for module in model.modules():
            hook = getattr(module, name, None)
            if callable(hook):
                hook()


def step_updates(model: nn.Module) -> None:
    """Every module's `step_update()`."""
    for module in model.modules():
        hook = getattr(module, "step_update", None)
        if callable(hook):
            hook()


def active_parameters(model: nn.Module) -> int:
    """Trainable parameters one token uses: all of them, less what each module with `active_params()` leaves
    unused (the outermost such module answers for its children). Shared parameters count once."""
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return total - sum(_unused(m) for m in _outermost(model, "active_params"))


def _unused(module: nn.Module) -> int:
    own = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return own - int(module.active_params())


def _outermost(module: nn.Module, hook: str) -> list[nn.Module]:
    if callable(getattr(module, hook, None)):
        return [module]
    return [found for child in module.children() for found in _outermost(child, hook)]


def weight_matrices(module: nn.Module) -> list[nn.Parameter]:
    """The nn.Linear weights under `module` and the matrices its modules declare (`weight_matrices()`), each once."""
    seen: dict[int, nn.Parameter] = {}
    for m in module.modules():
        found = [m.weight] if isinstance(m, nn.Linear) else []
        hook = getattr(m, "weight_matrices", None)
        found += list(hook()) if callable(hook) else []
        seen.update((id(p), p) for p in found)
    return list(seen.values())
