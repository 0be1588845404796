"""A shape trace: every stage's tensor shape for one real training batch, laid out like a hand derivation of the
tensor flow in "Attention Is All You Need" (embedding, each attention's Q, K, V, scores and context, the FFN,
Add & Norm, logits), for whatever variant the config builds.

    python train.py model=decoder_only pos=rotary trace_shapes=true

The shapes are read from the tensors themselves: forward hooks on the modules, and a torch function mode that
sees each `scaled_dot_product_attention` call, so what is printed is what ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from archsweep.core.data.tasks.base import Task
from archsweep.core.model.build import build_model, count_parameters
from archsweep.core.model.config import ModelConfig
from archsweep.variants.attention.base import AttentionKernel
from archsweep.variants.attention.layers import Attention, CrossAttention, SelfAttention
from archsweep.variants.blocks import Block, Stack
from archsweep.variants.embedding import LMHead, TokenEmbedding
from archsweep.variants.ffn.base import GatedFeedForward
from archsweep.variants.model import IMAGE, form_of
from archsweep.variants.norm.base import Residual
from archsweep.variants.patches import PatchEmbedding

Row = tuple[int, str, tuple[int, ...], str]  # indent, stage, shape, dimension names


class _AttentionCalls(TorchFunctionMode):
    """Records Q, K, V, scores and per-head context of each SDPA call, under the attention module running it."""

    def __init__(self, rows: list[Row], current: list[tuple[str, str, str]], rotated: bool) -> None:
        super().__init__()
        self.rows, self.current = rows, current
        self.rotated = "; Q and K rotated" if rotated else ""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is F.scaled_dot_product_attention and self.current:
            q, k, v = args[:3]
            qn, kn, shared = self.current[-1]  # query / key length names, key/value head sharing
            self.rows += [
                (3, f"Q  (split into heads{self.rotated})", tuple(q.shape), f"B H {qn} Dh"),
                (3, f"K{shared}", tuple(k.shape), f"B H {kn} Dh"),
                (3, f"V{shared}", tuple(v.shape), f"B H {kn} Dh"),
                (3, "scores = Q K^T / sqrt(Dh), masked", (*q.shape[:-1], k.shape[-2]), f"B H {qn} {kn}"),
                (3, "softmax(scores) V", tuple(out.shape), f"B H {qn} Dh"),
            ]
        return out


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if isinstance(x, Tensor) else ()


def _enter_attention(rows: list[Row], current: list[tuple[str, str, str]], kind: str, q: str, k: str) -> Callable:
    def hook(module: Attention, args: tuple) -> None:  # a pre-hook returning a value would replace the inputs
        shared = "" if module.n_kv_heads == module.n_heads else \
            f"  ({module.n_kv_heads} key/value heads, each shared by {module.n_heads // module.n_kv_heads})"
        current.append((q, k, shared))
        label = f", {module.kernel.label}" if isinstance(module, SelfAttention) and module.kernel.label else ""
        rows.append((2, f"{kind}, {module.n_heads} heads{label}", _shape(args[0]), f"B {q} D"))

    return hook


def _leave_attention(rows: list[Row], current: list[tuple[str, str, str]], q: str) -> Callable:
    def hook(module: Attention, args: tuple, out: Tensor) -> None:
        current.pop()
        rows.append((3, "concat heads, out_proj", _shape(out), f"B {q} D"))

    return hook


def _kernel_rows(rows: list[Row], q_name: str, rotated: bool) -> Callable:
    """Rows of an attention kind that forms no score matrix (kernel attention): its features and state."""
    def hook(module: AttentionKernel, args: tuple, out: Tensor) -> None:
        q, k = args[0], args[1]
        f = module.n_features(q.shape[-1])
        shape = lambda x: (*x.shape[:-1], f)
        rows.extend([
            (3, f"Q  (split into heads{'; Q and K rotated' if rotated else ''})", tuple(q.shape), f"B H {q_name} Dh"),
            (3, "K, V", tuple(k.shape), f"B Hkv {q_name} Dh"),
            (3, "phi(Q), phi(K)  (feature maps)", shape(q), f"B H {q_name} Fm"),
            (3, "S = sum phi(K)^T V, z = sum phi(K)  (no T x T scores)", (q.shape[0], q.shape[1], f, q.shape[-1]),
             "B H Fm Dh"),
            (3, "phi(Q) S / (phi(Q) z + eps)", tuple(out.shape), f"B H {q_name} Dh"),
        ])

    return hook


def module_is_causal(model: nn.Module, stack: str) -> bool:
    module = getattr(model, stack, None)
    return bool(getattr(module, "causal", False))


def _hooks(model: nn.Module, cfg: ModelConfig, rows: list[Row], current: list[tuple[str, str, str]]) -> list[Any]:
    """Forward hooks that append one row per stage; returns their handles."""
    image = form_of(cfg.kind) == IMAGE
    length = {"encoder": "N" if image else "S"}  # the source (or an image's patches); other stacks: the target
    placement = cfg.variant("norm").formula
    gated = any(isinstance(m, GatedFeedForward) for m in model.modules())
    handles = []

    def on(module: nn.Module, fn: Callable, pre: bool = False) -> None:
        register = module.register_forward_pre_hook if pre else module.register_forward_hook
        handles.append(register(fn))

    for name, module in model.named_modules():
        stack = name.split(".")[0]
        t = length.get(stack, "T")
        if isinstance(module, PatchEmbedding):
            _patch_rows(module, on, rows)
        elif name in ("pre_logits", "classifier") and image:
            label = "MLP head: dense + tanh (pre-logits)" if name == "pre_logits" else "class logits"
            on(module, lambda m, a, o, label=label: rows.append((0, label, _shape(o), "B Dm" if "MLP" in label
                                                                else "B K")))
        elif isinstance(module, Stack):
            what = "patch tokens (embedded above)" if image else "tokens"
            names = f"B {t} D" if image else f"B {t}"
            on(module, lambda m, a, n=name, w=what, d=names: rows.append((0, f"{n}: {w}", _shape(a[0]), d)), pre=True)
            last = "final norm" if cfg.variant("norm").final_norm else "stack output (no final norm)"
            on(module, lambda m, a, o, t=t, last=last: rows.append((1, last, _shape(o), f"B {t} D")))
        elif isinstance(module, TokenEmbedding):
            label = f"token embedding x sqrt(D) = x {module.scale:.2f}" if module.scale != 1.0 else "token embedding"
            on(module, lambda m, a, o, label=label, t=t: rows.append((1, label, _shape(o), f"B {t} D")))
        elif isinstance(module, Block):
            pos = cfg.variant("pos").trace_label or f"(positions act inside attention: {cfg.choice('pos')})"
            if name.endswith(".0"):
                on(module, lambda m, a, pos=pos, t=t: rows.append((1, f"block input: embedding {pos}", _shape(a[0]),
                                                                  f"B {t} D")), pre=True)
            on(module, lambda m, a, n=name: rows.append((1, f"block {n.split('.')[-1]}", (), "")), pre=True)
        elif isinstance(module, Attention):
            keys = "S" if isinstance(module, CrossAttention) else t
            kind = "cross-attention over the encoder output" if isinstance(module, CrossAttention) \
                else ("masked " if module_is_causal(model, stack) else "") + "self-attention"
            on(module, _enter_attention(rows, current, kind, t, keys), pre=True)
            on(module, _leave_attention(rows, current, t))
        elif isinstance(module, AttentionKernel) and not module.forms_scores:
            on(module, _kernel_rows(rows, t, cfg.variant("pos").rotates()))
        elif isinstance(module, Residual):
            on(module, lambda m, a, o, q=t: rows.append((2, placement, _shape(o), f"B {q} D")))
        elif name.endswith(("ffn.up_proj", "ffn.gate_proj")):
            then = f", then {cfg.choice('ffn')}" if name.endswith("up_proj") else ""
            f = "Fg" if gated else "F"
            on(module, lambda m, a, o, n=name, q=t, then=then, f=f: rows.append((2, f"FFN {n.split('.')[-1]}{then}",
                                                                                 _shape(o), f"B {q} {f}")))
        elif name.endswith("ffn.down_proj"):
            on(module, lambda m, a, o, q=t: rows.append((2, "FFN down_proj", _shape(o), f"B {q} D")))
        elif isinstance(module, LMHead):
            tied = "tied to the embedding" if cfg.tie_embeddings else "untied"
            on(module, lambda m, a, o, tied=tied: rows.append((0, f"logits (output projection, {tied})", _shape(o),
                                                               "B T V")))
    return handles


def _patch_rows(module: PatchEmbedding, on: Callable, rows: list[Row]) -> None:
    """Rows of the ViT's patch embedding: image -> conv patches -> sequence (+ class token)."""
    p = module.patch_size
    on(module, lambda m, a: rows.append((0, "image", _shape(a[0]), "B C Hi Wi")), pre=True)
    on(module.proj, lambda m, a, o: rows.append((1, f"patch embedding: conv {p}x{p}, stride {p} (= flatten + linear)",
                                                 _shape(o), "B D Hi/P Wi/P")))
    cls = ", class token prepended" if module.cls_token is not None else " (no class token: mean pooling)"
    on(module, lambda m, a, o: rows.append((1, f"flatten to a sequence{cls}", _shape(o), "B N D")))


def _image_legend(cfg: ModelConfig, batch: dict[str, Any]) -> list[str]:
    _, c, h, w = batch["images"].shape
    gh, gw = h // cfg.patch_size, w // cfg.patch_size
    extra = " + 1 class token" if cfg.pooling == "cls" else ""
    head = [f"Dm={cfg.head_hidden} MLP head width"] if cfg.head_hidden else []
    return [f"C={c} channels", f"Hi={h} Wi={w} image height and width", f"P={cfg.patch_size} patch size",
            f"N={cfg.variant('kind').n_tokens(cfg.sizes())} tokens = (Hi/P)(Wi/P){extra} = {gh}x{gw}{extra}", *head]


def _legend(model: nn.Module, cfg: ModelConfig, batch: dict[str, Any]) -> str:
    if "images" in batch:
        dims = [f"B={batch['images'].shape[0]} batch", *_image_legend(cfg, batch), f"D={cfg.d_model} d_model",
                f"H={cfg.n_heads} heads", f"Dh={cfg.head_dim} head_dim", f"F={cfg.d_ff} d_ff",
                f"K={cfg.n_classes} classes"]
        return ", ".join(dims)
    dims = [f"B={next(v for v in batch.values() if isinstance(v, Tensor)).shape[0]} batch"]
    if "src" in batch:
        dims.append(f"S={batch['src'].shape[1]} source length")
    labels = batch["labels"]
    dims += [f"T={labels.shape[1] if labels.dim() > 1 else 1} target length", f"D={cfg.d_model} d_model",
             f"H={cfg.n_heads} heads", f"Dh={cfg.head_dim} head_dim", f"F={cfg.d_ff} d_ff",
             f"V={cfg.vocab_size} vocabulary"]
    gated = [m for m in model.modules() if isinstance(m, GatedFeedForward)]
    if gated:
        dims.insert(-1, f"Fg={gated[0].hidden_size} gated hidden size")
    kernels = [m for m in model.modules() if isinstance(m, AttentionKernel) and not m.forms_scores]
    if kernels:
        dims.insert(-1, f"Fm={kernels[0].n_features(cfg.head_dim)} features per head")
    return ", ".join(dims)


def trace_rows(model: nn.Module, batch: dict[str, Any], forward: Callable[[nn.Module, dict], Tensor]) -> list[Row]:
    """Run `forward(model, batch)` once (eval mode, no grad) and return the stages it went through, in order."""
    rows: list[Row] = []
    current: list[tuple[str, str, str]] = []
    handles = _hooks(model, model.config, rows, current)
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad(), _AttentionCalls(rows, current, model.config.variant("pos").rotates()):
            forward(model, batch)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return rows


def format_rows(rows: list[Row]) -> str:
    lines = []
    for indent, stage, shape, names in rows:
        left = "  " * indent + stage
        lines.append(f"{left:<62} {str(shape) if shape else '':<22} {names}".rstrip())
    return "\n".join(lines)


def parameters_text(model: nn.Module) -> str:
    """"N parameters", with the active count per token where it differs (a mixture of experts)."""
    total, active = count_parameters(model), count_parameters(model, count="active")
    return f"{total:,} parameters" + (f" ({active:,} active per token)" if active != total else "")


def trace_shapes(cfg: ModelConfig, task: Task, seed: int) -> str:
    """The shape trace of the model `cfg` on the first training batch of `task`, as printable text."""
    torch.manual_seed(seed)
    model = build_model(cfg)
    batch = next(iter(task.dataloader("train", cfg.kind, seed)))
    rows = trace_rows(model, batch, task.forward_fn(cfg.kind))
    head = (f"shape trace: {cfg.kind}, norm={cfg.choice('norm')}, pos={cfg.choice('pos')}, ffn={cfg.choice('ffn')}, "
            f"attention={cfg.choice('attention')}, "
            f"{parameters_text(model)}, one training batch\n{_legend(model, cfg, batch)}\n")
    inputs = "\n".join(f"batch[{k!r}]".ljust(63) + str(tuple(v.shape))
                       for k, v in batch.items() if isinstance(v, Tensor))
    return head + inputs + "\n" + format_rows(rows)
