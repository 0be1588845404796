"""A damaged file names itself: a truncated or overwritten archive, compressed table, tokenizer or data-cache file
gives one error naming the file and what to do (or, for a cache entry, is rebuilt), not only what the library
raised. Each test damages its own copy in tmp_path. (Checkpoints: tests/test_safe_loading.py.)"""

from __future__ import annotations

import gzip
import io
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from archsweep.core.data import cache, fetch
from archsweep.core.data.tasks.digits import read_digits
from archsweep.core.data.tasks.images import read_npz
from archsweep.core.data.tasks.text import TextTask
from archsweep.core.data.tokenizer import CharTokenizer, load_tokenizer, train_tokenizer

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40


def truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def overwrite_start(path: Path, n: int = 16) -> Path:
    """Other bytes at the file's start, the size unchanged (what a size check cannot see)."""
    data = path.read_bytes()
    path.write_bytes(b"\xff" * n + data[n:])
    return path


def test_a_truncated_npz_names_the_file_and_what_to_do(tmp_path):
    path = tmp_path / "images.npz"
    np.savez(path, x=np.zeros((10, 8, 8), np.float32), y=np.zeros(10, np.int64))
    truncate(path)
    with pytest.raises(ValueError, match=rf"task.path={path} is not a readable .npz file \(BadZipFile: .*\): "
                                         r"truncated or damaged \(an interrupted copy\?\); copy or save it again"):
        read_npz(path)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_truncated_tokenizer_names_the_file(tmp_path, kind):
    path = tmp_path / "tokenizer.json"
    tok = CharTokenizer.train([TEXT]) if kind == "char" else train_tokenizer("bpe", [TEXT], 300)
    tok.save(path)
    assert load_tokenizer(path).encode("Speak") == tok.encode("Speak")  # intact, it loads
    truncate(path)
    with pytest.raises(ValueError, match=rf"{path} is not a readable tokenizer file \(.*\): truncated or damaged; "
                                         r"replace it with an intact copy"):
        load_tokenizer(path)
    with pytest.raises(ValueError, match="; delete it$"):
        load_tokenizer(path, "delete it")


def test_a_truncated_gzip_table_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "digits.csv.gz"
    path.write_bytes(gzip.compress(("\n".join(",".join(["1"] * 65) for _ in range(200)) + "\n").encode()))
    assert read_digits(path).shape == (200, 65)
    truncate(path, 0.6)
    with pytest.raises(ValueError, match=rf"task=digits: {path} does not read \(.*\): the installed file is "
                                         r"damaged; reinstall scikit-learn"):
        read_digits(path)


def test_a_truncated_tar_archive_names_itself_when_unpacked(tmp_path):
    archive = tmp_path / "training.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("train.en", "train.de"):
            data = (TEXT * 20).encode()
            member = tarfile.TarInfo(f"data/{name}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    out = fetch.unpack(archive, {"train.en": "m/train.en"}, tmp_path / "dest")
    assert out == [tmp_path / "dest" / "m" / "train.en"]
    truncate(archive, 0.3)
    with pytest.raises(fetch.FetchError, match=rf"{archive} is not a readable archive \(.*\): truncated or damaged; "
                                               r"delete it and fetch again"):
        fetch.unpack(archive, {"train.en": "m/train.en"}, tmp_path / "again")


def text_task(path: Path, cache_dir: Path) -> TextTask:
    return TextTask(path=str(path), data_dir=None, tokenizer="char", bpe_vocab_size=300, block_size=16, batch_size=4,
                    val_fraction=0.1, val_batches=2, test_batches=2, eval_seed=0, cache_dir=str(cache_dir))


def test_a_cache_file_damaged_at_its_size_names_itself_and_the_entry_to_delete(tmp_path):
    (tmp_path / "t.txt").write_text(TEXT)
    task = text_task(tmp_path / "t.txt", tmp_path / "cache")
    expected = np.asarray(task.array("train")).copy()
    overwrite_start(task.dir / "train.npy")  # the .npy header: same size, so the size marker does not see it
    overwrite_start(task.dir / "tokenizer.json")
    again = text_task(tmp_path / "t.txt", tmp_path / "cache")
    with pytest.raises(ValueError, match=rf"{task.dir / 'train.npy'} in the data cache does not read \(.*\); delete "
                                         rf"the cache entry {task.dir} and the next run prepares it again"):
        again.array("train")
    with pytest.raises(ValueError, match=rf"{task.dir / 'tokenizer.json'} is not a readable tokenizer file .*; "
                                         rf"delete the cache entry {task.dir} and the next run prepares it again"):
        _ = again.tokenizer
    shutil.rmtree(task.dir)  # as the message says
    assert np.array_equal(np.asarray(text_task(tmp_path / "t.txt", tmp_path / "cache").array("train")), expected)


@pytest.mark.parametrize("damaged", [cache.MARKER, "info.json"])
def test_a_cache_entry_whose_marker_or_info_does_not_parse_is_rebuilt(tmp_path, capsys, damaged):
    data = tmp_path / "data.txt"
    data.write_text("abc")
    builds = []

    def build(tmp: Path) -> dict:
        builds.append(tmp)
        (tmp / "tokens.bin").write_bytes(bytes(range(100)))
        return {"n": 100}

    entry, _ = cache.prepared(tmp_path / "cache", "toy", [data], {"k": 1}, build)
    overwrite_start(entry / damaged, 4)
    again, info = cache.prepared(tmp_path / "cache", "toy", [data], {"k": 1}, build)
    assert again == entry and info["n"] == 100 and len(builds) == 2
    assert f"{entry} is damaged ({damaged} does not parse); rebuilding it" in capsys.readouterr().err
