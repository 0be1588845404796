"""What trainer=fsdp saves and costs against trainer=ddp: the training state each process holds (parameters,
gradients, AdamW moments) and the time of a training step, both processes over gloo on this machine.

    python bench/fsdp.py                         # a 6-layer, d_model=256 decoder, 2 processes, 10 steps
    python bench/fsdp.py --layers 2 --steps 3

DDP keeps a full replica of the state in every process; FSDP (core/train/launch/shard.py) keeps 1/N of each block's and
of the root's parameters, and gathers a block's only while it runs. State bytes are counted from the tensors each
process holds after a step (local shards under FSDP). Step times are medians, DDP and FSDP measured in the same
processes one after the other; the figure that matters is the ratio (FSDP's extra all-gathers on CPU/gloo).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.train.launch.shard import shard_model


def local_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    def size(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = sum(size(p) + (size(p.grad) if p.grad is not None else 0) for p in model.parameters())
    moments = sum(size(v) for state in opt.state.values() for v in state.values() if torch.is_tensor(v) and v.ndim)
    return params + moments


def timed_steps(model: nn.Module, steps: int, seq: int, rank: int) -> tuple[float, int]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(steps + 1):  # the first step (allocations, optimiser state) is not timed
        tokens = torch.randint(0, 1000, (8, seq + 1), generator=gen)
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        dist.barrier()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]), local_bytes(model, opt)


def worker(rank: int, port: int, args: argparse.Namespace, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh

    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return build_model(ModelConfig(kind="decoder_only", vocab_size=1000, d_model=args.d_model, n_heads=4,
                                       n_layers=args.layers, d_ff=4 * args.d_model, dropout=0.0,
                                       max_seq_len=args.seq))

    ddp = nn.parallel.DistributedDataParallel(fresh())
    ddp_s, ddp_bytes = timed_steps(ddp, args.steps, args.seq, rank)
    sharded = fresh()
    shard_model(sharded, init_device_mesh("cpu", (2,)), bf16=False)
    fsdp_s, fsdp_bytes = timed_steps(sharded, args.steps, args.seq, rank)
    if rank == 0:
        out.update(ddp_s=ddp_s, ddp_bytes=ddp_bytes, fsdp_s=fsdp_s, fsdp_bytes=fsdp_bytes,
                   params=sum(p.numel() for p in fresh().parameters()))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"decoder_only, {args.layers} layers, d_model={args.d_model}, batch 8 x {args.seq} tokens per process, "
          f"2 processes over gloo, {args.steps} timed steps", flush=True)
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(worker, args=(port, args, out), nprocs=2, join=True)
        r = dict(out)
    mib = 2**20
    print(f"parameters: {r['params']:,}")
    print(f"{'':6} {'state per process':>18} {'step (median)':>14}")
    print(f"{'ddp':6} {r['ddp_bytes'] / mib:>14.1f} MiB {r['ddp_s'] * 1e3:>11.0f} ms")
    print(f"{'fsdp':6} {r['fsdp_bytes'] / mib:>14.1f} MiB {r['fsdp_s'] * 1e3:>11.0f} ms")
    print(f"fsdp / ddp: state {r['fsdp_bytes'] / r['ddp_bytes']:.2f}x, step time {r['fsdp_s'] / r['ddp_s']:.2f}x")


if __name__ == "__main__":
    main()
