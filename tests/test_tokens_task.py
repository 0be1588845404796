"""`task=tokens` (core/data/tasks/tokens.py, packing.py) on shard folders written by hand (tests/shard_folders.py):
both samplings, resumable batch streams, fixed evaluation windows, document ids, the foreign layouts, and every
refusal before training. Training runs of it are in tests/test_tokens_train.py."""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest
import torch
from shard_folders import EOS, VOCAB, make_modded_nanogpt, make_nanogpt, make_shards

from archsweep.core.data.codec import codec_from_state, codec_state_for
from archsweep.core.data.paths import SHARED_DATA
from archsweep.core.data.tasks.packing import best_fit
from archsweep.core.data.tasks.tokens import TokensTask
from archsweep.core.model.config import ModelConfig


def task(folder, tmp_path, **settings) -> TokensTask:
    values = {"block_size": 32, "batch_size": 4, "val_batches": 3, "test_batches": 2, "eval_seed": 7,
              "cache_dir": str(tmp_path / "cache"), **settings}
    return TokensTask(str(folder), **values)


def batches(t: TokensTask, split: str, n: int, seed: int = 0, start: int = 0, kind: str = "decoder_only"):
    return list(itertools.islice(iter(t.dataloader(split, kind, seed, start=start)), n))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("shards") / "corpus")


@pytest.mark.parametrize("sampling", ["random", "bos_aligned"])
def test_a_batch_is_a_function_of_the_seed_and_its_index_so_a_resumed_stream_continues_it(folder, tmp_path,
                                                                                           sampling):
    t = task(folder, tmp_path, sampling=sampling)
    whole = batches(t, "train", 6)
    assert all(b["tokens"].shape == (4, 32) and torch.equal(b["tokens"][:, 1:], b["labels"][:, :-1]) for b in whole)
    resumed = batches(task(folder, tmp_path, sampling=sampling), "train", 3, start=3)
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(whole[3:], resumed, strict=True))
    other = batches(t, "train", 1, seed=1)[0]
    assert not torch.equal(other["tokens"], whole[0]["tokens"])
    assert int(whole[0]["tokens"].max()) < VOCAB


def test_data_parallel_processes_read_different_batches_that_together_are_the_single_process_stream(folder, tmp_path):
    t = task(folder, tmp_path)
    single = batches(t, "train", 4)
    ranks = [batches_of(t, rank) for rank in (0, 1)]
    assert torch.equal(ranks[0][0]["tokens"], single[0]["tokens"]) and torch.equal(ranks[1][0]["tokens"],
                                                                                   single[1]["tokens"])
    assert torch.equal(ranks[0][1]["tokens"], single[2]["tokens"])


def batches_of(t: TokensTask, rank: int):
    return list(itertools.islice(iter(t.dataloader("train", "decoder_only", 0, rank=rank, world_size=2)), 2))


def test_bos_aligned_rows_start_at_a_document_and_hold_whole_documents_but_the_last(folder, tmp_path):
    t = task(folder, tmp_path, sampling="bos_aligned")
    corpus = np.concatenate([np.load(folder / f) for f in sorted(p.name for p in folder.glob("train_*.npy"))])
    text = " " + " ".join(map(str, corpus)) + " "
    for b in batches(t, "train", 5):
        rows = torch.cat([b["tokens"], b["labels"][:, -1:]], dim=1)  # (B, T + 1)
        for row in rows.tolist():
            assert row[0] == EOS  # the boundary token starts each packed document
            pieces = " ".join(map(str, row)).split(f"{EOS} ")[1:]
            for piece in pieces[:-1]:  # whole documents: boundary, then the document up to the next boundary
                assert f" {EOS} {piece}{EOS} " in text
            assert f" {EOS} {pieces[-1]}" in text  # the last one may be cropped


def test_best_fit_takes_the_longest_document_that_fits_and_crops_only_when_none_does():
    assert best_fit(np.array([5, 3, 8, 2]), rows=2, width=8) == [[(2, 8)], [(0, 5), (1, 3)]]
    # nothing fits the 1 token left: the first unused document in draw order is cropped to it
    assert best_fit(np.array([4, 3, 9]), rows=1, width=8) == [[(0, 4), (1, 3), (2, 1)]]
    assert best_fit(np.array([3, 3]), rows=2, width=8) is None


def test_evaluation_windows_are_fixed_consecutive_and_the_same_for_every_sampling_and_seed(folder, tmp_path):
    val = np.concatenate([np.load(folder / f) for f in sorted(p.name for p in folder.glob("val_*.npy"))])
    a = batches(task(folder, tmp_path), "val", 3)
    b = batches(task(folder, tmp_path, sampling="bos_aligned", doc_mask=True), "val", 3, seed=5)
    assert len(a) == 3 and all(torch.equal(x["tokens"], y["tokens"]) for x, y in zip(a, b, strict=True))
    first = np.load(folder / "val_000000.npy")
    assert a[0]["tokens"][0].tolist() == first[:32].tolist() and a[0]["tokens"][1].tolist() == first[32:64].tolist()
    test = batches(task(folder, tmp_path), "test", 2)  # no test split: windows from the end of the val split
    assert not any(torch.equal(x["tokens"], y["tokens"]) for x in a for y in test)
    assert set(test[0]["tokens"].flatten().tolist()) <= set(val.tolist())


def test_a_prepared_test_split_is_read_for_test(tmp_path):
    folder = make_shards(tmp_path / "corpus", test_docs=40)
    t = task(folder, tmp_path)
    first = np.load(folder / "test_000000.npy")
    assert batches(t, "test", 1)[0]["tokens"][0].tolist() == first[:32].tolist()


def test_doc_ids_count_the_boundaries_so_each_document_starts_at_its_boundary_token(folder, tmp_path):
    t = task(folder, tmp_path, doc_mask=True)
    for b in batches(t, "train", 3) + batches(t, "val", 2):
        tokens, ids = b["tokens"], b["doc_ids"]
        assert ids.shape == tokens.shape and bool((ids.diff(dim=1) >= 0).all())
        starts = ids.diff(dim=1) == 1
        assert torch.equal(starts, tokens[:, 1:] == EOS)
    assert "doc_ids" not in batches(task(folder, tmp_path), "train", 1)[0]


def test_the_encoder_decoder_reads_the_window_as_a_continuation(folder, tmp_path):
    b = batches(task(folder, tmp_path), "train", 1, kind="encoder_decoder")[0]
    assert b["src"].shape == (4, 16) and b["tgt_in"].shape == (4, 16) and b["labels"].shape == (4, 16)
    assert torch.equal(b["tgt_in"][:, 1:], b["labels"][:, :-1])


@pytest.mark.parametrize("make,settings", [
    (make_modded_nanogpt, {"vocab_size": 50257}),
    (make_nanogpt, {"vocab_size": 50257, "dtype": "uint16", "boundary_id": 50256}),
])
def test_foreign_layouts_train_with_bos_aligned_rows(tmp_path, make, settings):
    folder = make(tmp_path / "foreign")
    t = task(folder, tmp_path, sampling="bos_aligned", doc_mask=True, **settings)
    b = batches(t, "train", 2)[1]
    assert bool((b["tokens"][:, 0] == 50256).all()) and t.vocab_size == 50257
    assert codec_from_state(codec_state_for(t)).decode([5, 6]) == "5 6"  # no tokenizer: ids as numbers
    t.check_model(ModelConfig(kind="decoder_only", vocab_size=50257))


def test_the_cached_document_index_is_reused_and_rebuilt_when_a_shard_changes(tmp_path):
    folder = make_shards(tmp_path / "corpus")
    first = task(folder, tmp_path, sampling="bos_aligned").indexes("train")
    again = task(folder, tmp_path, sampling="bos_aligned").indexes("train")
    assert [list(ix.starts) for ix in first] == [list(ix.starts) for ix in again]
    shard = np.load(folder / "train_000000.npy")
    # each end-of-document token starts the next document; the shard's last one starts none
    assert list(first[0].starts) == np.flatnonzero(shard[:-1] == EOS).tolist() and first[0].max_id == shard.max()
    assert first[0].end == len(shard) - 1
    nano = make_nanogpt(tmp_path / "nano")
    settings = {"dtype": "uint16", "vocab_size": 50257, "boundary_id": 50256, "sampling": "bos_aligned"}
    before = task(nano, tmp_path, **settings).indexes("train")[0]
    tokens = np.fromfile(nano / "train.bin", dtype=np.uint16)
    tokens[:101].tofile(nano / "train.bin")  # another file at that path: its index is made again
    after = task(nano, tmp_path, **settings).indexes("train")[0]
    assert before.end > 101 and after.end == 101 - int(tokens[100] == 50256)
    assert list(after.starts) == np.flatnonzero(tokens[:100] == 50256).tolist()


@pytest.mark.parametrize("change,settings,message", [
    (None, {"sampling": "packed"}, r"task.sampling='packed' is not a sampling; choose one of random, bos_aligned"),
    (None, {"block_size": 1}, r"task.block_size=1 must be at least 2"),
    (None, {"batch_size": 40}, r"task.batch_size=40: the validation split of .* holds .* fewer than one batch"),
    (None, {"vocab_size": 10}, r"task.vocab_size=10 is smaller than the vocabulary the shards .* made with \(50\)"),
    ("nanogpt", {"vocab_size": 50257, "dtype": "uint16", "sampling": "bos_aligned"},
     r"task.sampling=bos_aligned needs the token that separates documents.*set task.boundary_id"),
    ("nanogpt", {"dtype": "uint16"}, r"task.vocab_size is not set .* set task.vocab_size to the tokenizer's"),
])
def test_bad_settings_are_refused_naming_the_setting_and_the_fix(tmp_path, change, settings, message):
    folder = make_nanogpt(tmp_path / "n") if change == "nanogpt" else make_shards(tmp_path / "corpus")
    with pytest.raises(ValueError, match=message):
        task(folder, tmp_path, **settings)


def test_a_missing_path_and_a_token_id_beyond_the_model_vocabulary_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"task.path is not set: give the folder of token shards"):
        TokensTask(None, 32, 4, 1, 1, 0)
    with pytest.raises(FileNotFoundError, match=r"task.path=nowhere: nowhere not found .*archsweep-prepare"):
        task("nowhere", tmp_path)
    folder = make_nanogpt(tmp_path / "n")
    t = task(folder, tmp_path, dtype="uint16", vocab_size=1000)
    with pytest.raises(ValueError, match=r"train.bin holds token id 50256, at or above the model's vocabulary "
                                         r"\(model.vocab_size=1000\)"):
        t.check_model(ModelConfig(kind="decoder_only", vocab_size=1000))
    with pytest.raises(ValueError, match=r"cannot feed model kind=encoder_only: .*needs a \[MASK\] id"):
        t.check_model(ModelConfig(kind="encoder_only", vocab_size=60000))


def test_a_tokenizer_other_than_the_shards_one_is_refused_for_the_task_and_for_a_continued_run(tmp_path):
    folder = make_shards(tmp_path / "corpus")
    other = tmp_path / "other.json"
    other.write_text("{}")
    with pytest.raises(ValueError, match=r"task.tokenizer=.*other.json is not the tokenizer the shards in .* were "
                                         r"made with \(random ids, sha256 000000000000"):
        task(folder, tmp_path, tokenizer=str(other))
    meta = json.loads((folder / "meta.json").read_text())
    meta["tokenizer"]["sha256"] = hashlib.sha256(other.read_bytes()).hexdigest()
    (folder / "meta.json").write_text(json.dumps(meta))
    t = task(folder, tmp_path, tokenizer=str(other))
    run = tmp_path / "run"
    run.mkdir()
    (run / "tokenizer.json").write_text('{"another": 1}')
    with pytest.raises(ValueError, match=r"run/tokenizer.json .* is not the tokenizer of the shards"):
        t.save(run)
    assert (run / "tokenizer.json").read_text() == '{"another": 1}'  # nothing overwritten


@pytest.mark.skipif(not (SHARED_DATA / "tinyshakespeare.txt").is_file(), reason="no ../shared/data")
def test_prepared_shards_train_with_their_tokenizer_and_bits_per_byte_add_up_to_the_recorded_bytes(tmp_path):
    """archsweep-prepare's folder read by the task: the bytes per id of its tokenizer, summed over a split's
    tokens, are the UTF-8 bytes meta.json records for it (the denominator of val/bpb), and the codec decodes."""
    from archsweep.core.data import prepare

    folder = tmp_path / "speeches"
    meta = prepare.prepare([str(SHARED_DATA / "tinyshakespeare.txt"), "--split-docs", "paragraph",
                            "--train-tokenizer", "600", "--val-docs", "300", "--test-docs", "300", "--workers", "1",
                            "--out", str(folder)])
    t = task(folder, tmp_path, sampling="bos_aligned", doc_mask=True)
    table = t.token_bytes("decoder_only").numpy()
    for split in ("train", "val", "test"):
        counts = sum(np.bincount(np.load(folder / e["file"]), minlength=len(table)) for e in meta["splits"][split])
        assert int(counts @ table) == sum(e["bytes"] for e in meta["splits"][split])
    assert table[t.eos_id] == 0 and t.vocab_size == 600
    codec = codec_from_state(codec_state_for(t))
    assert codec.decode(codec.encode("To be, or not to be")) == "To be, or not to be"
    b = batches(t, "train", 1)[0]
    assert bool((b["tokens"][:, 0] == t.eos_id).all()) and b["doc_ids"].max() >= 1
