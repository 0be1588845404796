"""The experts of `ffn=moe` (`moe.py`): n_experts FFNs of one shape held as stacked (E, out, in) matrices, run on
tokens already sorted by expert.

Each matrix product is one grouped matmul (`torch.nn.functional.grouped_mm`, jagged token counts per expert, no
host sync) where its kernels accept the operands: bfloat16 with rows of whole 16-byte multiples (torch's grouped
kernels and their compile-time checks take only bfloat16). Otherwise, and on every device alike, it falls back to a
loop over the experts' slices of the sorted tokens, one `F.linear` each: correct for every dtype and size (left
out of `torch.compile`'s graphs, which would otherwise be rebuilt for every new set of token counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archsweep.variants.dropout import apply_dropout
from archsweep.variants.roles import EXPERT, VECTOR


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype a matmul runs in here: autocast's when it is on, else the input's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def groupable(x: Tensor, weight: Tensor) -> bool:
    """Whether `F.grouped_mm` takes x (N, in) against weight (E, out, in) as they are (see the module docstring)."""
    aligned = 16 // x.element_size()
    return (x.dtype == weight.dtype == torch.bfloat16 and weight.shape[-1] % aligned == 0
            and weight.shape[-2] % aligned == 0)


def grouped_linear(x: Tensor, weight: Tensor, bias: Tensor | None, counts: Tensor, grouped: bool = True) -> Tensor:
    """x (N, in), rows sorted by expert with `counts` (E,) rows each -> (N, out): row i of expert e is
    F.linear(x[i], weight[e], bias[e]). `grouped=False` forces the per-expert loop (for the benchmark)."""
    dtype = compute_dtype(x)
    x, weight = x.to(dtype), weight.to(dtype)
    if grouped and groupable(x, weight):
        offsets = counts.cumsum(0).to(torch.int32)  # (E,) end of each expert's rows
        out = F.grouped_mm(x, weight.mT, offs=offsets)  # (N, out)
        return out if bias is None else out + bias.to(dtype).repeat_interleave(counts, dim=0, output_size=len(x))
    return loop_linear(x, weight, None if bias is None else bias.to(dtype), counts)


@torch.compiler.disable  # the split sizes are data: compiled, each new set of counts would be a new graph
def loop_linear(x: Tensor, weight: Tensor, bias: Tensor | None, counts: Tensor) -> Tensor:
    """`grouped_linear` as a loop of one F.linear per expert."""
    chunks = x.split(counts.tolist())
    biases = [None] * len(chunks) if bias is None else bias
    return torch.cat([F.linear(chunk, w, b) for chunk, w, b in zip(chunks, weight, biases, strict=True)])


class Experts(nn.Module):
    """n_experts FFNs down(act(up(x))) or, gated, down(act(gate(x)) * up(x)), of hidden size `hidden_size`."""

    def __init__(self, n_experts: int, d_model: int, hidden_size: int, activation: Callable[[Tensor], Tensor],
                 gated: bool, dropout: float, bias: bool) -> None:
        super().__init__()
        stacked = lambda *shape: nn.Parameter(torch.empty(n_experts, *shape))  # noqa: E731
        self.gate_proj = stacked(hidden_size, d_model) if gated else None
        self.up_proj = stacked(hidden_size, d_model)
        self.down_proj = stacked(d_model, hidden_size)
        self.gate_bias = stacked(hidden_size) if gated and bias else None
        self.up_bias = stacked(hidden_size) if bias else None
        self.down_bias = stacked(d_model) if bias else None
        self.activation, self.p, self.hidden_size, self.grouped = activation, dropout, hidden_size, True
        self.init_parameters("gpt2", 1)

    def forward(self, x: Tensor, counts: Tensor) -> Tensor:
        """x (N, d_model) sorted by expert, counts (E,) -> (N, d_model)."""
        up = grouped_linear(x, self.up_proj, self.up_bias, counts, self.grouped)  # (N, hidden)
        if self.gate_proj is not None:
            hidden = self.activation(grouped_linear(x, self.gate_proj, self.gate_bias, counts, self.grouped)) * up
        else:
            hidden = self.activation(up)
        if self.p and self.training:
            hidden = apply_dropout(hidden, self.p, True)
        return grouped_linear(hidden, self.down_proj, self.down_bias, counts, self.grouped)

    def expert_params(self) -> int:
        """Parameters of one expert."""
        return sum(p.numel() for p in self.parameters()) // self.up_proj.shape[0]

    def expert_flops(self) -> float:
        """Forward FLOPs of one expert on one token."""
        return 2.0 * sum(m.shape[1] * m.shape[2] for m in self.weight_matrices())

    def weight_matrices(self) -> list[nn.Parameter]:
        return [m for m in (self.gate_proj, self.up_proj, self.down_proj) if m is not None]

    def roles(self) -> dict[str, str]:
        """The stacked matrices are expert stacks; the stacked biases (E, out) vectors."""
        return {name: EXPERT if name.endswith("_proj") else VECTOR for name, _ in self.named_parameters()}

    @torch.no_grad()
    def init_parameters(self, scheme: str, n_layers: int) -> None:
        """As `init.py` initialises an FFN's nn.Linear weights, each expert on its own: Xavier-uniform, or
        normal(0, 0.02) with down_proj scaled by 1/sqrt(2 n_layers) (gpt2); zero biases."""
        for matrix in self.weight_matrices():
            for one in matrix:
                if scheme == "xavier":
                    nn.init.xavier_uniform_(one)
                else:
                    std = 0.02 / math.sqrt(2 * n_layers) if matrix is self.down_proj else 0.02
                    nn.init.normal_(one, mean=0.0, std=std)
        for b in (self.gate_bias, self.up_bias, self.down_bias):
            if b is not None:
                b.zero_()
