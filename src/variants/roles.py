"""The role of every parameter of a model: what initialisation, DeepNorm and width scaling (`param/`) read instead
of parameter names or a module's layout.

A parameter's role comes from defaults by module type (an nn.Linear's weight is a hidden matrix and its bias a
vector; an embedding table is an embedding; any other parameter of fewer than two dimensions is a vector) and
from what modules declare with the `roles()` hook (`hooks.ModuleHooks`): {parameter name relative to the module:
role}, which overrides the default (the attention output and the FFN's down projection write into the residual
stream; an untied output head; stacked experts; a ViT's patch projection and class token). A parameter of two or
more dimensions that no rule covers and no module declares is refused by name, so a new variant cannot slip
through with a guessed role. A tied output head shares the embedding's Parameter and keeps its role.
"""

from __future__ import annotations

from torch import nn

EMBEDDING = "embedding"  # input: a token or position table, a patch projection, a class token
HIDDEN = "hidden"  # a hidden matrix, width in and width out (attention and FFN projections)
HIDDEN_OUT = "hidden_out"  # a hidden matrix whose output is added to the residual stream (out_proj, down_proj)
HEAD = "head"  # output: width in, vocabulary or classes out
VECTOR = "vector"  # gains, biases, scalars
EXPERT = "expert"  # a stack of expert matrices (E, out, in)
ROUTER = "router"  # width in, a fixed number of choices out, whose scores only select and weight (an MoE router)
ROLES = (EMBEDDING, HIDDEN, HIDDEN_OUT, HEAD, VECTOR, EXPERT, ROUTER)


def default_role(module: nn.Module, name: str, param: nn.Parameter) -> str | None:
    """The role by module type, None where only a declaration can say."""
    if isinstance(module, nn.Linear):
        return HIDDEN if name == "weight" else VECTOR
    if isinstance(module, nn.Embedding) or (name == "weight" and type(module).__name__ == "TokenEmbedding"):
        return EMBEDDING
    return VECTOR if param.ndim < 2 else None


def parameter_roles(model: nn.Module, strict: bool = True) -> dict[str, str | None]:
    """{parameter name: role} for every parameter of `model` (a shared one once, under its first name). `strict`:
    a parameter without a role is refused by name; otherwise its role is None (initialisation asks only which
    matrices write into the residual stream, so a variant that declares nothing still builds)."""
    first: dict[int, str] = {}
    for name, param in model.named_parameters():
        first.setdefault(id(param), name)
    roles: dict[int, str | None] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            roles.setdefault(id(param), default_role(module, name, param))
    for module in model.modules():
        hook = getattr(module, "roles", None)
        if not callable(hook):
            continue
        for name, role in hook().items():
            if role not in ROLES:
                raise ValueError(f"{type(module).__name__}.roles() gives {name!r} the role {role!r}; valid roles: "
                                 f"{', '.join(ROLES)}")
            roles[id(module.get_parameter(name))] = role
    missing = [first[i] for i, role in roles.items() if role is None]
    if missing and strict:
        raise ValueError(f"no role for {', '.join(missing)}: the modules that own them must declare one with "
                         f"roles() ({', '.join(ROLES)}); see archsweep.variants.roles")
    return {first[i]: role for i, role in roles.items() if i in first}
