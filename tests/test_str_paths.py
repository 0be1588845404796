"""The public loaders take a `str` as well as a `Path` (issue 15: `load_tokenizer("...")` raised AttributeError)."""

from __future__ import annotations

import json

from archsweep.core.data import cache, read
from archsweep.core.data.tokenizer import load_tokenizer, train_tokenizer
from archsweep.core.model.checkpoint import load_model, read_checkpoint, resolve_checkpoint
from archsweep.core.report.runs import Skipped, find_runs, load_run, read_config, read_metrics, read_results


def test_tokenizers_save_and_load_from_str_paths(tmp_path):
    for kind in ("char", "bpe"):
        tok = train_tokenizer(kind, ["hello world, hello there"] * 20, vocab_size=300)
        path = str(tmp_path / f"{kind}.json")
        tok.save(path)
        again = load_tokenizer(path)
        assert again.encode("hello there") == tok.encode("hello there") and again.vocab_size == tok.vocab_size


def test_readers_take_str_paths(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    (tmp_path / "b.txt").write_text("uno\ndos\n")
    (tmp_path / "ab.tsv").write_text("one\tuno\ntwo\tdos\n")
    folder = str(tmp_path)
    assert [p.name for p in read.text_files(folder, "x", "")] == ["a.txt", "ab.tsv", "b.txt"]
    assert read.read_lines(str(tmp_path / "a.txt"), "x", "") == ["one", "two"]
    assert read.read_text(str(tmp_path / "a.txt"), "x", "") == "one\ntwo\n"
    pair = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert read.read_parallel(pair, "x", "") == read.read_parallel([str(tmp_path / "ab.tsv")], "x", "")
    entry, info = cache.prepared(str(tmp_path / "cache"), "toy", [str(tmp_path / "a.txt")], {},
                                 lambda tmp: {"n": 1})
    assert info["n"] == 1 and entry.is_dir()


def test_checkpoint_and_run_readers_take_str_paths(tmp_path):
    from test_safe_loading import write_checkpoint

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    ckpt = write_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert read_checkpoint(str(ckpt))["archsweep"] and load_model(str(ckpt)).config.d_model == 16
    assert resolve_checkpoint(str(run_dir), "evaluate") == ckpt
    (run_dir / "metrics.csv").write_text("step,train/loss\n1,2.5\n")
    (run_dir / "config.yaml").write_text("seed: 0\n")
    (run_dir / "results.json").write_text(json.dumps({"status": "interrupted", "seed": 0,
                                                      "interrupted": {"signal": "SIGTERM", "step": 7}}))
    assert find_runs(str(tmp_path)) == [run_dir]
    series = read_metrics(str(run_dir / "metrics.csv"))["train/loss"]
    assert series == read_metrics(run_dir / "metrics.csv")["train/loss"] and [v for _, v in series] == [2.5]
    assert read_results(str(run_dir / "results.json")).status == "interrupted"
    assert read_config(str(run_dir)) == {"seed": 0}
    skipped = load_run(str(run_dir))
    assert isinstance(skipped, Skipped) and "interrupted by SIGTERM at step 7: resume it" in skipped.reason
