"""Token shard readers (archsweep.core.data.shards): every layout read from files written here by hand with numpy,
and every refusal."""

from __future__ import annotations

import json

import numpy as np
import pytest

from archsweep.core.data.paths import file_sha256
from archsweep.core.data.shards import MODDED_MAGIC, open_shards


def modded(path, tokens, magic=MODDED_MAGIC, version=1, count=None):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def ours(folder, splits, dtype="uint16", vocab=100, **meta_extra):
    """A folder in our format: `splits` maps split -> list of shard token lists."""
    folder.mkdir(exist_ok=True)
    meta = {"format": "archsweep-tokens", "version": 1, "dtype": dtype, "vocab_size": vocab, "eos_id": 0,
            "tokenizer": {"name": "t", "sha256": "x"}, "shard_tokens": 4, "settings": {}, "splits": {},
            "complete": True}
    for split, shards in splits.items():
        meta["splits"][split] = []
        for i, tokens in enumerate(shards):
            name = f"{split}_{i:06d}.npy"
            np.save(folder / name, np.asarray(tokens, dtype=dtype))
            meta["splits"][split].append({"file": name, "tokens": len(tokens), "documents": tokens.count(0),
                                          "bytes": 3 * len(tokens)})
    meta.update(meta_extra)
    (folder / "meta.json").write_text(json.dumps(meta))
    return meta


def test_ours(tmp_path):
    ours(tmp_path, {"train": [[5, 6, 0, 7, 0], [8, 0]], "val": [[9, 9, 0]]})
    (tmp_path / "tokenizer.json").write_text("{}")
    s = open_shards(tmp_path)
    assert (s.layout, s.dtype, s.vocab_size, s.boundary_id, s.boundary) == ("archsweep", np.uint16, 100, 0, "end")
    assert s.tokens == {"train": 7, "val": 3} and s.documents == {"train": 3, "val": 1}
    assert s.bytes == {"train": 21, "val": 9} and s.tokenizer_path == tmp_path / "tokenizer.json"
    arrays = s.arrays("train")
    assert [a.tolist() for a in arrays] == [[5, 6, 0, 7, 0], [8, 0]]
    assert s.arrays("train") is arrays and not arrays[0].flags.writeable
    with pytest.raises(KeyError, match="'test' is not in"):
        s.arrays("test")


def test_modded_nanogpt(tmp_path):
    modded(tmp_path / "fineweb_train_000001.bin", [50256, 1, 2, 50256, 3])
    modded(tmp_path / "fineweb_train_000002.bin", [50256, 4])
    modded(tmp_path / "fineweb_val_000000.bin", [50256, 7, 8])
    s = open_shards(tmp_path)
    assert (s.layout, s.dtype, s.boundary_id, s.boundary, s.vocab_size) == ("modded-nanogpt", np.uint16, 50256,
                                                                            "start", None)
    assert s.tokens == {"train": 7, "val": 3} and s.documents is None
    assert [a.tolist() for a in s.arrays("train")] == [[50256, 1, 2, 50256, 3], [50256, 4]]
    assert open_shards(tmp_path, boundary_id=7).boundary_id == 7


def test_nanogpt_raw(tmp_path):
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.array([3, 4], dtype=np.uint16).tofile(tmp_path / "val.bin")
    with pytest.raises(ValueError, match="task.dtype=uint16 for nanoGPT"):
        open_shards(tmp_path)
    s = open_shards(tmp_path, dtype="uint16", boundary_id=50256)
    assert (s.layout, s.boundary, s.boundary_id, s.tokens) == ("nanogpt", "end", 50256, {"train": 10, "val": 2})
    assert s.arrays("val")[0].tolist() == [3, 4]


def test_npy_with_and_without_header(tmp_path):
    np.save(tmp_path / "train_0.npy", np.array([1, 2, 3], dtype=np.uint32))
    np.save(tmp_path / "val_0.npy", np.array([4], dtype=np.uint32))
    s = open_shards(tmp_path)
    assert (s.layout, s.dtype, s.tokens) == ("npy", np.uint32, {"train": 3, "val": 1})
    raw = tmp_path / "raw"
    raw.mkdir()
    np.array([1, 2, 3, 4], dtype=np.uint32).tofile(raw / "part-train-0.npy")  # OLMo-core: a raw memmap named .npy
    np.array([5], dtype=np.uint32).tofile(raw / "part-val-0.npy")
    with pytest.raises(ValueError, match="headerless.*pass task.dtype"):
        open_shards(raw)
    s = open_shards(raw, dtype="uint32")
    assert s.arrays("train")[0].tolist() == [1, 2, 3, 4] and s.tokens["val"] == 1


def test_sha(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    assert file_sha256(tmp_path / "f") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_refusals_of_foreign_layouts(tmp_path):
    with pytest.raises(FileNotFoundError, match="task.path=.*nope: no such folder"):
        open_shards(tmp_path / "nope")
    with pytest.raises(ValueError, match="empty: no meta.json"):
        open_shards(tmp_path)
    modded(tmp_path / "fineweb_train_000001.bin", [1, 2], magic=12345)
    modded(tmp_path / "fineweb_val_000000.bin", [1])
    with pytest.raises(ValueError, match="fineweb_train_000001.bin: wrong magic 12345"):
        open_shards(tmp_path)
    modded(tmp_path / "fineweb_train_000001.bin", [1, 2], version=2)
    with pytest.raises(ValueError, match="unknown modded-nanogpt version 2"):
        open_shards(tmp_path)
    modded(tmp_path / "fineweb_train_000001.bin", [1, 2], count=5)
    with pytest.raises(ValueError, match="000001.bin: truncated.*5 uint16 tokens"):
        open_shards(tmp_path)
    modded(tmp_path / "fineweb_train_000001.bin", [1, 2])
    with pytest.raises(ValueError, match="task.dtype=uint32 but modded-nanogpt shards hold uint16"):
        open_shards(tmp_path, dtype="uint32")
    with pytest.raises(ValueError, match="task.dtype=int8 is not a token dtype"):
        open_shards(tmp_path, dtype="int8")
    (tmp_path / "fineweb_val_000000.bin").unlink()
    with pytest.raises(ValueError, match="no val split"):
        open_shards(tmp_path)


def test_refusals_of_raw_and_npy(tmp_path):
    (tmp_path / "train.bin").write_bytes(b"\x01\x00\x02")
    (tmp_path / "val.bin").write_bytes(b"\x01\x00")
    with pytest.raises(ValueError, match="train.bin: truncated: 3 bytes is not a whole number of uint16"):
        open_shards(tmp_path, dtype="uint16")
    npy = tmp_path / "npy"
    npy.mkdir()
    np.save(npy / "train.npy", np.arange(5, dtype=np.uint16))
    np.save(npy / "val.npy", np.arange(5, dtype=np.uint32))
    with pytest.raises(ValueError, match="dtype mismatch"):
        open_shards(npy)
    with pytest.raises(ValueError, match="val.npy: dtype mismatch: the file holds uint32, uint16 was expected"):
        open_shards(npy, dtype="uint16")
    np.save(npy / "val.npy", np.arange(5, dtype=np.uint16))
    (npy / "train.npy").write_bytes((npy / "train.npy").read_bytes()[:-4])
    with pytest.raises(ValueError, match="train.npy: truncated .npy file"):
        open_shards(npy)
    np.save(npy / "train.npy", np.arange(5, dtype=np.uint16))
    np.save(npy / "shard.npy", np.arange(5, dtype=np.uint16))
    with pytest.raises(ValueError, match="shard.npy: no single split in its name"):
        open_shards(npy)


def test_refusals_of_our_format(tmp_path):
    good = {"train": [[1, 0]], "val": [[2, 0]]}
    ours(tmp_path, good, version=2)
    with pytest.raises(ValueError, match="unknown format 'archsweep-tokens' version 2"):
        open_shards(tmp_path)
    ours(tmp_path, good, format="other")
    with pytest.raises(ValueError, match="unknown format 'other'"):
        open_shards(tmp_path)
    ours(tmp_path, good, vocab=70000)
    with pytest.raises(ValueError, match="vocab_size=70000 does not fit dtype uint16"):
        open_shards(tmp_path)
    meta = ours(tmp_path, good)
    np.save(tmp_path / "train_000000.npy", np.array([1, 0], dtype=np.uint32))
    with pytest.raises(ValueError, match="train_000000.npy: dtype mismatch: the file holds uint32, uint16"):
        open_shards(tmp_path)
    np.save(tmp_path / "train_000000.npy", np.array([1], dtype=np.uint16))
    with pytest.raises(ValueError, match="train_000000.npy: truncated: 1 tokens, .*says 2"):
        open_shards(tmp_path)
    (tmp_path / "train_000000.npy").unlink()
    with pytest.raises(FileNotFoundError, match="train_000000.npy: listed in .*meta.json but missing"):
        open_shards(tmp_path)
    ours(tmp_path, good, complete=False)
    with pytest.raises(ValueError, match="unfinished archsweep-prepare"):
        open_shards(tmp_path)
    ours(tmp_path, {"val": [[2, 0]]})
    with pytest.raises(ValueError, match="no train split"):
        open_shards(tmp_path)
    ours(tmp_path, good)
    with pytest.raises(ValueError, match="task.dtype=uint32 but .*meta.json says uint16"):
        open_shards(tmp_path, dtype="uint32")
    assert open_shards(tmp_path).splits["train"][0].name == meta["splits"]["train"][0]["file"]
