"""`task=tokens` through train.py (real subprocesses, tiny sizes): both samplings with the decoder-only and the
encoder-decoder kinds, a run stopped by SIGTERM and resumed that takes the batches of the uninterrupted run, and
`experiment=gpt2_124m` at a reduced size for two steps on the CPU."""

from __future__ import annotations

import json
import math
import signal

import pytest
from shard_folders import make_shards
from test_run_safety import ROOT, finish, launch, results, signal_when, train, train_losses

pytestmark = pytest.mark.slow  # train.py subprocesses
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.block_size=32",
        "task.batch_size=4", "task.val_batches=2", "task.test_batches=2", "trainer.log_every_n_steps=2",
        "schedule.warmup_steps=2", "logger=csv", "diagnostics.attention_maps=false", "eval.decode_samples=0",
        "threads=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("tokens") / "corpus")


def test_both_samplings_train_the_decoder_only_and_the_encoder_decoder(tmp_path, corpus):
    sweep = tmp_path / "sweep"
    code, out = train(tmp_path, "-m", "task=tokens", f"task.path={corpus}", f"task.cache_dir={tmp_path / 'cache'}",
                      "model=decoder_only,encoder_decoder", "task.sampling=random,bos_aligned", *TINY,
                      "trainer.max_steps=4", "trainer.val_check_interval=2", f"hydra.sweep.dir={sweep}")
    assert code == 0, out[-3000:]
    jobs = [json.loads((d / "results.json").read_text()) for d in sorted(sweep.glob("[0-9]*"))]
    def sampling(job: dict) -> str:
        return next(o.split("=", 1)[1] for o in job["overrides"] if o.startswith("task.sampling="))

    assert {(j["choices"]["model"], sampling(j)) for j in jobs} == {
        (m, s) for m in ("decoder_only", "encoder_decoder") for s in ("random", "bos_aligned")}
    for j in jobs:
        assert j["status"] == "completed" and j["steps"] == 4, j.get("error")
        assert 0 < j["val"]["loss"] < 10 and j["test"]["loss"] > 0


def words_corpus(path, n_docs: int = 240, seed: int = 0):
    """Paragraphs of words drawn at random (a few with accents, so a BPE token can hold part of a character)."""
    import random

    rng = random.Random(seed)
    words = ["the", "king", "queen", "speaks", "of", "war", "and", "peace", "café", "naïve", "élan", "to", "night"]
    path.write_text("\n\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(8, 40)))
                                 for _ in range(n_docs)) + "\n")
    return path


def test_a_tokens_run_reports_a_language_models_loss_perplexity_and_bits_per_byte_everywhere(tmp_path):
    """results.json, the console's summary and compare.py's row: the metrics of a language model (the task
    declares its family), not exact match."""
    from archsweep.core.data import prepare
    from archsweep.core.report import compare, terminal

    shards = tmp_path / "shards"
    prepare.prepare([str(words_corpus(tmp_path / "words.txt")), "--out", str(shards), "--train-tokenizer", "300",
                     "--val-docs", "40", "--test-docs", "40", "--split-docs", "paragraph", "--workers", "1"])
    run_dir = tmp_path / "run"
    code, out = train(tmp_path, "model=decoder_only", "task=tokens", f"task.path={shards}",
                      f"task.cache_dir={tmp_path / 'cache'}", *TINY, "trainer.max_steps=4",
                      f"hydra.run.dir={run_dir}")
    assert code == 0, out[-3000:]
    job = results(run_dir)
    assert job["task_family"] == "lm"
    for split in ("val", "test"):
        assert {"loss", "ppl", "bpb"} <= set(job[split]), job[split]
        assert job[split]["ppl"] == pytest.approx(math.exp(job[split]["loss"]), rel=1e-4)
    summary = next(line for line in out.splitlines() if "done in" in line)
    for shown in ("test loss", "test perplexity", "test bits per byte", "val perplexity", "val bits per byte"):
        assert shown in summary, summary
    assert "exact match" not in summary and "steps to target" not in out
    table = terminal(compare([run_dir]))
    header = next(line for line in table.splitlines() if line.startswith("best"))
    assert all(column in header for column in ("val/ppl", "val/bpb", "test/ppl", "test/bpb")), table
    assert "exact_match" not in table and "never" not in table, table


def test_document_masking_trains_the_decoder_and_is_refused_for_the_encoder_decoder_before_training(tmp_path,
                                                                                                    corpus):
    common = [*TINY, "task=tokens", f"task.path={corpus}", f"task.cache_dir={tmp_path / 'cache'}",
              "task.doc_mask=true", "trainer.max_steps=4", "trainer.val_check_interval=2"]
    code, out = train(tmp_path, *common, "model=decoder_only", "task.sampling=bos_aligned",
                      f"hydra.run.dir={tmp_path / 'masked'}")
    assert code == 0, out[-3000:]
    assert results(tmp_path / "masked")["status"] == "completed"
    code, out = train(tmp_path, *common, "model=encoder_decoder", f"hydra.run.dir={tmp_path / 'refused'}")
    assert code == 1 and "task.doc_mask=true cannot be used with model=encoder_decoder" in out, out[-3000:]
    assert not (tmp_path / "refused" / "results.json").exists()


def test_a_run_stopped_and_resumed_trains_on_the_batches_of_the_uninterrupted_run(tmp_path, corpus):
    run = [*TINY, "task=tokens", f"task.path={corpus}", f"task.cache_dir={tmp_path / 'cache'}", "model=decoder_only",
           "task.sampling=bos_aligned", "trainer.max_steps=40", "trainer.val_check_interval=10"]
    reference = tmp_path / "reference"
    code, out = train(tmp_path, *run, f"hydra.run.dir={reference}")
    assert code == 0, out[-3000:]
    run_dir = tmp_path / "run"
    proc = launch(tmp_path, *run, f"hydra.run.dir={run_dir}", "+callbacks.slow._target_=slowdown.Slow")
    signal_when(proc, run_dir / "train.log", "step 14/40", signal.SIGTERM)
    code, out = finish(proc)
    assert code == 128 + signal.SIGTERM and results(run_dir)["status"] == "interrupted", out[-3000:]
    code, out = train(tmp_path, *run, f"hydra.run.dir={run_dir}", f"ckpt_path={run_dir}")
    assert code == 0, out[-3000:]
    assert results(run_dir)["steps"] == 40
    assert train_losses(run_dir) == train_losses(reference)  # every step's loss, bit for bit: the same batches
    assert results(run_dir)["val"] == results(reference)["val"]


def test_the_gpt2_124m_preset_runs_two_steps_at_a_reduced_size_on_the_cpu(tmp_path, corpus):
    run_dir = tmp_path / "run"
    code, out = train(tmp_path, "experiment=gpt2_124m", f"task.path={corpus}", f"task.cache_dir={tmp_path / 'c'}",
                      "trainer=cpu", "compile=false", "model.n_layers=2", "model.d_model=64", "model.n_heads=2",
                      "model.d_ff=256", "task.block_size=64", "task.batch_size=2", "task.val_batches=1",
                      "task.test_batches=1", "trainer.accumulate_grad_batches=2", "trainer.max_steps=2",
                      "trainer.val_check_interval=4", "schedule.warmup_steps=1", "logger=csv", "eval.decode_samples=0",
                      "threads=1",
                      f"hydra.run.dir={run_dir}")
    assert code == 0, out[-3000:]
    res = results(run_dir)
    assert res["status"] == "completed" and res["steps"] == 2
    config = (run_dir / "config.yaml").read_text()
    assert "vocab_size: 50304" in config and "lr: 0.0006" in config and "weight_decay: 0.1" in config
    assert res["total_flops"] == pytest.approx(2 * 2 * 2 * 64 * res["flops_per_token"])  # steps x accum x rows x T


def test_the_gpt2_124m_preset_builds_gpt2_small_with_its_parameter_and_flop_counts(tmp_path):
    """124,475,904 parameters (llm.c's count for GPT-2 small with the vocabulary padded to 50304); forward FLOPs
    per token at context 1024: 2 per weight of every matrix (12 L d^2 in the blocks, V d in the tied head) plus the
    causal attention's 4 L d (T + 1) / 2."""
    from hydra import compose, initialize_config_dir

    from archsweep.core.model.build import build_model
    from archsweep.core.train.lifecycle.checks import build_task, model_config
    from archsweep.variants.flops import Shape, forward_flops

    folder = make_shards(tmp_path / "corpus", train_docs=600, val_docs=1600, shard_tokens=10**6)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=gpt2_124m", f"task.path={folder}", "task.val_batches=1",
                                          "task.test_batches=1", f"task.cache_dir={tmp_path / 'cache'}"])
    model = build_model(model_config(cfg, build_task(cfg)))
    assert sum(p.numel() for p in model.parameters()) == 124_475_904
    n_layers, d, vocab, t = 12, 768, 50304, 1024
    expected = 2 * (12 * n_layers * d * d + vocab * d) + 4 * n_layers * d * (t + 1) / 2
    assert forward_flops(model, Shape(1, t)) / t == pytest.approx(expected, rel=1e-12)
