"""File-based tasks: reading, tokenizers, the prepared-data cache (reuse, keys, interrupted preparation) and a
clear error for every bad input a user can give."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from archsweep.core.data import cache, tokenizer
from archsweep.core.data.paths import data_dir
from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.data.tasks.text import TextTask
from archsweep.core.data.tasks.translation import TranslationTask

SHAKESPEARE = data_dir() / "tinyshakespeare.txt"
MULTI30K = data_dir() / "multi30k"
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40


def text_task(path, cache_dir, **over):
    args = dict(path=str(path), data_dir=None, tokenizer="char", bpe_vocab_size=300, block_size=16, batch_size=4,
                val_fraction=0.1, val_batches=2, test_batches=2, eval_seed=0, cache_dir=str(cache_dir))
    return TextTask(**{**args, **over})


def translation_task(train, val, cache_dir, **over):
    args = dict(train=train, val=val, test=None, data_dir=None, vocab="joint", bpe_vocab_size=300, max_len=32,
                batch_size=4, cache_dir=str(cache_dir))
    return TranslationTask(**{**args, **over})


def write_pair(folder, name, src_lines, tgt_lines):
    (folder / f"{name}.en").write_text("".join(x + "\n" for x in src_lines))
    (folder / f"{name}.de").write_text("".join(x + "\n" for x in tgt_lines))
    return [str(folder / f"{name}.en"), str(folder / f"{name}.de")]


EN = ["a dog runs", "two men sit on a bench", "a girl in red", "the cat sleeps", "people walk in the street"] * 6
DE = ["ein hund rennt", "zwei männer sitzen auf einer bank", "ein mädchen in rot", "die katze schläft",
      "leute gehen auf der straße"] * 6


# ---- tokenizers -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_tokenizers_round_trip_with_shared_special_ids(kind, tmp_path):
    tok = tokenizer.train_tokenizer(kind, [TEXT], 300)
    ids = tok.encode("Speak, speak.\nhear me")
    assert min(ids) >= len(tokenizer.SPECIALS) and tok.decode(ids) == "Speak, speak.\nhear me"
    tok.save(tmp_path / "tok.json")
    again = tokenizer.load_tokenizer(tmp_path / "tok.json")
    assert again.encode("hear me") == tok.encode("hear me") and again.vocab_size == tok.vocab_size
    assert again.decode([tokenizer.BOS, *ids, tokenizer.PAD]) == "Speak, speak.\nhear me"  # specials dropped


def test_char_tokenizer_maps_unseen_characters_to_unk():
    tok = tokenizer.CharTokenizer.train(["abc"])
    assert tok.encode("abz") == [6, 7, tokenizer.UNK]
    if kind_bpe := tokenizer.BpeTokenizer.train(["abc abc"], 300):
        assert tokenizer.UNK not in kind_bpe.encode("zürich ∑")  # byte-level: nothing is unknown


# ---- text LM ----------------------------------------------------------------------------------------------------

def test_shakespeare_char_matches_nanogpt_split_and_vocabulary(tmp_path):
    task = text_task("tinyshakespeare.txt", tmp_path, block_size=64, batch_size=12)
    assert task.vocab_size == len(tokenizer.SPECIALS) + 65
    assert task.sizes == {"train": 1_003_854, "val": 111_540}  # nanoGPT's 90% / 10% character split
    raw = SHAKESPEARE.read_text()
    val = np.load(task.dir / "val.npy")
    assert task.decode(val[:200]) == raw[1_003_854:1_003_854 + 200]
    batch = next(iter(task.dataloader("train", "decoder_only", seed=0)))
    assert batch["tokens"].shape == (12, 64) and torch.equal(batch["tokens"][:, 1:], batch["labels"][:, :-1])
    assert task.decode(batch["tokens"][0].tolist() + batch["labels"][0, -1:].tolist()) in raw  # a contiguous window


def test_text_kinds_continuation_and_masked_tokens(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TEXT)
    task = text_task(path, tmp_path / "cache", mask_prob=0.3)
    ed = task.make_batch(task.array("train"), 5, "encoder_decoder")
    do = task.make_batch(task.array("train"), 5, "decoder_only")
    window = torch.cat([do["tokens"], do["labels"][:, -1:]], dim=1)  # (B, T + 1)
    assert torch.equal(ed["src"], window[:, :8]) and torch.equal(ed["labels"], window[:, 9:])
    assert torch.equal(ed["tgt_in"], window[:, 8:16])
    mlm = task.make_batch(task.array("train"), 5, "encoder_only")
    chosen = mlm["labels"] != IGNORE_INDEX
    assert chosen.any(1).all() and torch.equal(mlm["labels"][chosen], window[:, :16][chosen])
    assert (mlm["tokens"][chosen] == tokenizer.MASK).float().mean() > 0.5
    assert torch.equal(mlm["tokens"][~chosen], window[:, :16][~chosen])  # unchosen positions untouched


def test_text_folder_is_read_in_order(tmp_path):
    (tmp_path / "b.txt").write_text("second file\n" * 50)
    (tmp_path / "a.txt").write_text("first file\n" * 50)
    task = text_task(tmp_path, tmp_path / ".cache", val_fraction=0.5)
    assert task.decode(np.load(task.dir / "train.npy")[:11]) == "first file\n"


# ---- the cache --------------------------------------------------------------------------------------------------

def test_second_run_reuses_the_cache_and_new_data_or_settings_do_not(tmp_path, monkeypatch, capsys):
    path = tmp_path / "t.txt"
    path.write_text(TEXT)
    first = text_task(path, tmp_path / "cache")
    assert "preparing text-char" in capsys.readouterr().err  # progress is printed

    def no_training(*args, **kwargs):
        raise AssertionError("re-tokenised")

    monkeypatch.setattr("archsweep.core.data.tasks.text.train_tokenizer", no_training)
    again = text_task(path, tmp_path / "cache", block_size=8, batch_size=2)  # batching settings: same entry
    assert again.dir == first.dir and capsys.readouterr().err == ""
    monkeypatch.undo()
    bpe = text_task(path, tmp_path / "cache", tokenizer="bpe")
    path.write_text(TEXT + "new text\n")
    changed = text_task(path, tmp_path / "cache")
    assert len({first.dir, bpe.dir, changed.dir}) == 3


def test_interrupted_preparation_leaves_nothing_a_later_run_trusts(tmp_path, monkeypatch):
    path = tmp_path / "t.txt"
    path.write_text(TEXT)
    real_save = np.save

    def dies_on_val(file, arr, *args, **kwargs):
        if str(file).endswith("val.npy"):
            raise KeyboardInterrupt  # the user presses Ctrl-C half-way through
        return real_save(file, arr, *args, **kwargs)

    monkeypatch.setattr(np, "save", dies_on_val)
    with pytest.raises(KeyboardInterrupt):
        text_task(path, tmp_path / "cache")
    monkeypatch.undo()
    assert list((tmp_path / "cache").iterdir()) == []
    # A folder left by a process killed outright (no cleanup) is not trusted either: no marker, rebuilt.
    key = cache.cache_key([path], {"tokenizer": "char", "bpe_vocab_size": None, "val_fraction": 0.1, "n_files": 1})
    stale = tmp_path / "cache" / f"text-char-{key}"
    stale.mkdir()
    (stale / "train.npy").write_bytes(b"garbage")
    task = text_task(path, tmp_path / "cache")
    assert task.dir == stale and (stale / cache.MARKER).is_file()
    assert len(np.load(stale / "train.npy")) == task.sizes["train"]


# ---- translation ------------------------------------------------------------------------------------------------

@pytest.mark.slow  # builds BPE vocabularies of the real corpus
def test_multi30k_splits_references_and_bucketing(tmp_path):
    files = {s: [str(MULTI30K / f"{s}.en"), str(MULTI30K / f"{s}.de")] for s in ("train", "val", "test2016")}
    task = translation_task(files["train"], files["val"], tmp_path, test=files["test2016"], bpe_vocab_size=2000,
                            max_len=128, batch_size=32)
    assert task.sizes == {"train": 29_000, "val": 1_014, "test": 1_000}
    refs = task.references("val")
    assert refs[0] == (MULTI30K / "val.de").read_text().split("\n")[0]
    seen = set()
    for batch in task.dataloader("val", "encoder_decoder", 0):
        for row, i in zip(batch["labels"].tolist(), batch["ids"].tolist(), strict=True):
            assert task.decode([t for t in row if t != IGNORE_INDEX]) == refs[i]  # byte-level BPE is lossless
            seen.add(i)
    assert seen == set(range(1_014))  # every validation pair, once

    def padding(stream, n=50):
        real = total = 0
        for _, b in zip(range(n), stream, strict=False):
            real += b["n_tokens"]
            total += b["src"].numel() + b["labels"].numel()
        return 1 - real / total

    bucketed = padding(task.dataloader("train", "encoder_decoder", 0))
    task.pool = 1  # batches of random sentences
    unbucketed = padding(task.dataloader("train", "encoder_decoder", 0))
    assert bucketed < 0.6 * unbucketed


def test_tab_separated_corpus_separate_vocabularies_and_kinds(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{e}\t{d}\n" for e, d in zip(EN, DE, strict=True)))
    task = translation_task(str(tsv), str(tsv), tmp_path / "cache", vocab="separate")
    assert task.src_vocab_size is not None and task.kinds() == ["encoder_decoder"]
    batch = next(iter(task.dataloader("val", "encoder_decoder", 0)))
    assert task.decode(batch["src"][0].tolist(), side="src") == EN[int(batch["ids"][0])]
    cfg = dict(vocab_size=task.vocab_size, d_model=32, n_heads=2, n_layers=1, d_ff=64)
    from archsweep.core.model.config import ModelConfig

    with pytest.raises(ValueError, match="cannot feed model kind=decoder_only: task.vocab=separate.*task.vocab=joint"):
        task.check_model(ModelConfig(kind="decoder_only", **cfg))


def test_decoder_only_packs_source_separator_target(tmp_path):
    files = write_pair(tmp_path, "train", EN, DE)
    task = translation_task(files, files, tmp_path / "cache")
    batch = next(iter(task.dataloader("val", "decoder_only", 0)))
    row, labels = batch["tokens"][0].tolist(), batch["labels"][0].tolist()
    sep = row.index(task.sep_id)
    i = int(batch["ids"][0])
    assert task.decode(row[:sep], side="src") == EN[i]
    assert task.decode([t for t in labels if t != IGNORE_INDEX]) == DE[i]  # loss on the target only


# ---- bad input --------------------------------------------------------------------------------------------------

def test_missing_file_names_the_paths_tried_and_how_to_get_the_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"task.path=nope.txt: nope.txt not found \(tried .*nope.txt, "
                                                r".*shared/data/nope.txt.*\).*char-rnn"):
        text_task("nope.txt", tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match="task.val: .*missing.de not found.*github.com/multi30k"):
        translation_task(write_pair(tmp_path, "train", EN, DE), ["train.en", "missing.de"], tmp_path / "cache")


def test_empty_file(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="task.path=.*empty.txt is empty"):
        text_task(tmp_path / "empty.txt", tmp_path / "cache")
    train = write_pair(tmp_path, "train", EN, DE)
    (tmp_path / "val.de").write_text("")
    with pytest.raises(ValueError, match="task.val: .*val.de is empty"):
        translation_task(train, [train[0], str(tmp_path / "val.de")], tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_parallel_files_with_different_line_counts(tmp_path):
    files = write_pair(tmp_path, "train", EN, DE[:-3])
    with pytest.raises(ValueError, match=r"different line counts: .*train.en has 30 lines, .*train.de has 27"):
        translation_task(files, files, tmp_path / "cache")
    (tmp_path / "bad.tsv").write_text("a dog\tein hund\nno tab here\n")
    with pytest.raises(ValueError, match="line 2 of .*bad.tsv has 1 tab-separated fields"):
        translation_task(str(tmp_path / "bad.tsv"), str(tmp_path / "bad.tsv"), tmp_path / "cache")
    assert not any((tmp_path / "cache").iterdir())  # nothing half-written


def test_text_that_is_not_utf8(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("line one\nZürich\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt is not UTF-8 text: byte 10 \(line 2\) is b'\\xfc'.*iconv"):
        text_task(tmp_path / "latin1.txt", tmp_path / "cache")
    assert not any((tmp_path / "cache").iterdir())


def test_block_size_larger_than_the_data(tmp_path):
    (tmp_path / "short.txt").write_text("To be, or not to be: that is the question.\n" * 5)
    with pytest.raises(ValueError, match=r"task.block_size=64 is larger than the data: the val split of .*short.txt "
                                         r"has 22 tokens.*lower task.block_size"):
        text_task(tmp_path / "short.txt", tmp_path / "cache", block_size=64)


@pytest.mark.parametrize("over, message", [
    ({"tokenizer": "word"}, "task.tokenizer='word' is not a known tokenizer; valid options: char, bpe"),
    ({"tokenizer": "bpe", "bpe_vocab_size": 100}, "task.bpe_vocab_size=100 is too small"),
    ({"val_fraction": 1.5}, r"task.val_fraction=1.5 must be in \(0, 1\)"),
    ({"block_size": 0}, "task.block_size=0 must be a positive integer"),
])
def test_bad_text_settings(over, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        text_task(SHAKESPEARE, tmp_path, **over)
