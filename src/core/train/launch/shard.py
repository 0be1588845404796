"""trainer=fsdp: sharded data parallelism with FSDP2 (`torch.distributed.fsdp.fully_shard`; Zhao et al. 2023,
"PyTorch FSDP", and torch's FSDP2 redesign on DTensor) through Lightning's ModelParallelStrategy.

Each Transformer block is one FSDP unit (its parameters are gathered for its forward and backward and freed after),
the rest of the model (embeddings, head) the root unit. Why FSDP2 rather than Lightning's FSDPStrategy (FSDP1): it is
the sharding torch develops now (FSDP1 is deprecated), it runs on CPU processes over gloo here (so the same code path
is tested without a GPU), and it needs no wrap policy object: the blocks are sharded where the model is built.
Checkpoints are consolidated on rank 0 into one ordinary .ckpt file (`save_distributed_checkpoint=False`), so
evaluate.py, generate.py, init_from and resume read them as any other run's.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

import torch
from torch import nn

from archsweep.variants.blocks import Block

if TYPE_CHECKING:
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.device_mesh import DeviceMesh


def sharded_strategy(processes: int, timeout_s: float | None) -> ModelParallelStrategy:
    """Lightning's ModelParallelStrategy over `processes` devices, all data parallel (no tensor parallelism), saving
    one consolidated checkpoint file on rank 0."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    timeout = datetime.timedelta(seconds=float(timeout_s)) if timeout_s else datetime.timedelta(minutes=30)
    return ModelParallelStrategy(data_parallel_size=processes, tensor_parallel_size=1,
                                 save_distributed_checkpoint=False, timeout=timeout)


def shard_model(model: nn.Module, mesh: DeviceMesh, bf16: bool) -> int:
    """fully_shard each Block of `model`, then `model` itself, over the 1-D device `mesh`; with `bf16`, parameters
    are gathered and computed in bfloat16 and gradients reduced in float32. Returns the number of blocks sharded.
    Idempotent: an already sharded model is left as it is (Lightning calls configure_model for each stage)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if isinstance(model, FSDPModule):
        return sum(isinstance(m, Block) for m in model.modules())
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return len(blocks)
