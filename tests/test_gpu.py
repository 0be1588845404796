"""The GPU check's tests (`-m gpu`; bench/gpu.py runs them first). Each takes its device from the `device` fixture:
CUDA when there is one, else the CPU, where the same tests run in tiny form. Checked:

- forward parity of every model kind with every attention kind, fp32 and bf16 autocast (as trainer=gpu trains),
  against the same weights in float64 on the CPU, within the tolerances of TOLERANCES;
- FlexAttention, compiled, with a block mask built from a mask_mod (a causal sliding window, and the window joined
  with document masking from document ids) equals SDPA with the dense boolean mask; and the model's
  sliding_window attention with backend=flex equals backend=sdpa on the device;
- decoding with the KV cache through torch.compile gives the eager tokens;
- train.py for two steps with compile=true (trainer=gpu on a GPU, trainer=cpu otherwise).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from archsweep.core.eval.generation import DecodingConfig, generate
from archsweep.core.model.build import ModelConfig, build_model

# compilation takes minutes on a CPU: there the suite runs these tests once, inside bench/gpu.py --tiny
# (tests/test_gpu_bench.py, which sets ARCHSWEEP_GPU_CHECK), not a second time on their own
pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("ARCHSWEEP_GPU_CHECK") != "1",
                                 reason="on a CPU these run inside bench/gpu.py --tiny (tests/test_gpu_bench.py)")]
ROOT = Path(__file__).resolve().parents[1]
KINDS = {"encoder_decoder": {}, "decoder_only": {}, "encoder_only": {"n_classes": 3},
         "vit": {"image_size": 8, "patch_size": 4, "in_channels": 1, "n_classes": 3, "pos": "learned"}}
ATTENTION = {"full": "full", "sliding_window": {"name": "sliding_window", "window": 4},
             "linear": "linear", "performer": "performer"}
# (atol, rtol) of logits against float64 on the CPU, per device and dtype: fp32 differs by summation order only
# (TF32 is off in these tests); bf16 autocast rounds every matmul input to 8 bits of mantissa (relative 2^-8)
TOLERANCES = {("cpu", torch.float32): (1e-5, 1e-5), ("cuda", torch.float32): (1e-4, 1e-4),
              ("cpu", torch.bfloat16): (6e-2, 5e-2), ("cuda", torch.bfloat16): (6e-2, 5e-2)}
# compiled FlexAttention against SDPA, both fp32: the CPU's kernels agree to rounding; on a GPU the Triton kernel
# may take TF32 paths of its own, so 1e-3
FLEX_TOLERANCE = {"cpu": 2e-5, "cuda": 1e-3}


@pytest.fixture(scope="module")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def no_tf32():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def model_of(kind: str, attention: str | dict) -> torch.nn.Module:
    torch.manual_seed(0)
    sizes = dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, norm="pre")
    if kind != "vit":
        sizes["vocab_size"] = 17
    return build_model(ModelConfig(kind=kind, attention=attention, **sizes, **KINDS[kind])).eval()


def inputs(kind: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    if kind == "vit":
        return (torch.randn(2, 1, 8, 8, generator=gen),)
    tokens = torch.randint(0, 17, (2, 12), generator=gen)
    return (tokens, tokens) if kind == "encoder_decoder" else (tokens,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_kind_and_attention_matches_float64_on_the_cpu(device, dtype):
    atol, rtol = TOLERANCES[(device.type, dtype)]
    worst = {}
    for kind in KINDS:
        for name, attention in ATTENTION.items():
            model = model_of(kind, attention)
            batch = inputs(kind)
            with torch.no_grad():
                expected = copy.deepcopy(model).double()(*(x.double() if x.is_floating_point() else x
                                                           for x in batch))
                with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                    got = model.to(device)(*(x.to(device) for x in batch))
            error = (got.double().cpu() - expected).abs()
            worst[f"{kind}/{name}"] = float((error - rtol * expected.abs()).max())
            assert got.dtype in (torch.float32, dtype) and torch.isfinite(got).all(), f"{kind}/{name}"
    beyond = {combo: e for combo, e in worst.items() if e > atol}
    assert not beyond, f"beyond atol={atol} + rtol={rtol} x |float64| on {device.type} {dtype}: {beyond}"


def dense_sdpa(q, k, v, keep):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None])  # (B, 1, T, T) broadcast over heads


@pytest.mark.parametrize("documents", [False, True], ids=["window", "window+documents"])
def test_compiled_flex_attention_equals_the_dense_mask(device, documents):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    b, h, t, d, window = 2, 2, 256, 16, 32  # 256 tokens: two of FlexAttention's 128-token blocks per side
    q, k, v = (torch.randn(b, h, t, d, device=device) for _ in range(3))
    doc_ids = torch.randint(0, 4, (b, t), device=device).sort(dim=1).values  # packed documents, in order
    if not documents:
        doc_ids = torch.zeros_like(doc_ids)

    def mask_mod(bi, hi, qi, ki):
        return (ki <= qi) & (qi - ki < window) & (doc_ids[bi, qi] == doc_ids[bi, ki])

    block_mask = create_block_mask(mask_mod, b, None, t, t, device=device)
    out = torch.compile(flex_attention, dynamic=False)(q, k, v, block_mask=block_mask)
    i = torch.arange(t, device=device)
    keep = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window))[None] \
        & (doc_ids[:, :, None] == doc_ids[:, None, :])  # (B, T, T)
    tol = FLEX_TOLERANCE[device.type]
    torch.testing.assert_close(out, dense_sdpa(q, k, v, keep), atol=tol, rtol=tol)


def test_the_models_flex_sliding_window_equals_its_sdpa(device):
    tokens = inputs("decoder_only")[0].to(device)
    outs = {}
    for backend in ("flex", "sdpa"):
        model = model_of("decoder_only", {"name": "sliding_window", "window": 4, "backend": backend}).to(device)
        with torch.no_grad():
            outs[backend] = model(tokens)
    tol = FLEX_TOLERANCE[device.type]
    torch.testing.assert_close(outs["flex"], outs["sdpa"], atol=tol, rtol=tol)


def test_cached_decoding_under_compile_gives_the_eager_tokens(device):
    model = model_of("decoder_only", "full").to(device)
    prompt = torch.randint(3, 17, (2, 5), generator=torch.Generator().manual_seed(2)).to(device)
    cfg = DecodingConfig(max_new_tokens=8)
    with torch.no_grad():
        eager = generate(model, prompt, None, cfg, eos_id=1, pad_id=0)
        compiled = generate(torch.compile(model, dynamic=True), prompt, None, cfg, eos_id=1, pad_id=0)
    assert torch.equal(compiled.tokens, eager.tokens)
    torch.testing.assert_close(compiled.scores, eager.scores, atol=1e-4, rtol=1e-4)


def test_train_py_runs_two_compiled_steps(device, tmp_path):
    trainer = "trainer=gpu" if device.type == "cuda" else "trainer=cpu"
    run_dir = tmp_path / "run"
    args = [trainer, "compile=true", "model=decoder_only", "model.d_model=32", "model.n_heads=2", "model.n_layers=1",
            "model.d_ff=64", "task.batch_size=8", "task.max_len=8", "task.val_batches=1", "task.test_batches=1",
            "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.log_every_n_steps=1",
            "schedule.warmup_steps=1", "logger=csv", "diagnostics.attention_maps=false", "eval.decode_samples=0",
            f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 2
    assert results["val"]["loss"] == results["val"]["loss"]  # finite, not NaN
