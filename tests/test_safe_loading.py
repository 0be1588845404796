"""Safe loading: checkpoints load with torch.load(weights_only=True) only, a crafted one is refused before its
payload runs, a file that is not a checkpoint is refused naming the file, and a checkpoint's stored task config
can name only the framework's own tasks (issue 15)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from archsweep.core.data.codec import codec_state_for
from archsweep.core.data.tasks.synthetic import ReverseTask
from archsweep.core.eval import inference
from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.model.checkpoint import CheckpointError, load_model, read_checkpoint
from archsweep.core.train.monitoring.callbacks import AtomicCheckpointIO

ROOT = Path(__file__).resolve().parents[1]
TASK = {"_target_": "archsweep.core.data.tasks.synthetic.ReverseTask", "n_symbols": 6, "min_len": 2, "max_len": 4,
        "long_max_len": None, "batch_size": 4, "val_batches": 1, "test_batches": 1, "eval_seed": 1}


class Payload:
    """Unpickling this runs os.makedirs(marker): the harmless stand-in for code a crafted checkpoint runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (str(self.marker),)


def write_checkpoint(path: Path, task_cfg: dict | None = None, codec: bool = True, **extra) -> Path:
    """A checkpoint shaped like train.py's (state_dict with `model.` keys, the `archsweep` entry), without
    Lightning."""
    task_cfg = task_cfg or TASK
    task = ReverseTask(**{k: v for k, v in TASK.items() if k != "_target_"})
    cfg = ModelConfig(kind="encoder_decoder", vocab_size=task.vocab_size, d_model=16, n_heads=2, n_layers=1,
                      d_ff=32, dropout=0.0)
    model = build_model(cfg)
    meta = {"model_config": model.config.to_dict(), "config": {"task": task_cfg},
            "codec": codec_state_for(task) if codec else None}
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "archsweep": meta, **extra},
               path)
    return path


def test_a_train_py_checkpoint_loads_with_weights_only(tmp_path):
    path = write_checkpoint(tmp_path / "good.ckpt")
    assert torch.load(path, weights_only=True)["archsweep"]["model_config"]["d_model"] == 16
    assert load_model(path).config.d_model == 16
    assert read_checkpoint(ROOT / "tests" / "fixtures" / "pre_rename" / "last.ckpt")["archsweep"]


def test_no_weights_only_false_or_checkpoint_instantiate_left_in_the_package():
    for path in (ROOT / "src").rglob("*.py"):
        text = path.read_text()
        assert "weights_only=False" not in text, path
    assert "check_task_target(task_cfg" in (ROOT / "src/core/eval/inference.py").read_text()


@pytest.mark.parametrize("reader", ["read_checkpoint", "load_model", "lightning"])
def test_a_crafted_checkpoint_is_refused_and_its_payload_never_runs(tmp_path, reader):
    marker = tmp_path / "payload-ran"
    path = write_checkpoint(tmp_path / "crafted.ckpt", payload=Payload(marker))
    load = {"read_checkpoint": read_checkpoint, "load_model": load_model,
            "lightning": lambda p: AtomicCheckpointIO().load_checkpoint(p, weights_only=False)}[reader]
    with pytest.raises(CheckpointError, match=r"crafted\.ckpt holds objects that do not load safely"):
        load(path)
    assert not marker.exists()


@pytest.mark.parametrize("content", ["truncated", "text", "list"])
def test_a_file_that_is_not_a_checkpoint_is_refused_naming_it(tmp_path, content):
    path = tmp_path / "bad.ckpt"
    if content == "truncated":
        good = write_checkpoint(tmp_path / "good.ckpt").read_bytes()
        path.write_bytes(good[: len(good) // 2])
        match = r"bad\.ckpt is not a readable checkpoint .*truncated"
    elif content == "text":
        path.write_text("this is not a checkpoint\n")
        match = r"bad\.ckpt is not a readable checkpoint"
    else:
        torch.save([1, 2, 3], path)
        match = r"bad\.ckpt holds a list, not a train.py checkpoint"
    with pytest.raises(CheckpointError, match=match):
        read_checkpoint(path)


def test_a_dict_without_the_archsweep_entry_is_refused(tmp_path):
    path = tmp_path / "plain.ckpt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(CheckpointError, match=r"plain\.ckpt is not a train.py checkpoint"):
        load_model(path)


def evaluate_cfg(path: Path, tmp_path: Path):
    """evaluate.py's config as its command line composes it."""
    from hydra import compose, initialize_config_dir

    from archsweep import conf_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("evaluate", overrides=[f"ckpt={path}", "splits=[test]", "decode_limit=2", "buckets=1",
                                             "device=cpu", f"output={tmp_path / 'eval.json'}"])
    OmegaConf.set_struct(cfg, False)
    return cfg


def test_a_checkpoint_naming_a_foreign_task_target_is_refused_unrun(tmp_path):
    marker = tmp_path / "target-ran"
    crafted = {"_target_": "os.makedirs", "name": str(marker)}
    path = write_checkpoint(tmp_path / "crafted.ckpt", task_cfg=crafted, codec=False)
    with pytest.raises(ValueError, match=r"task._target_='os.makedirs' is not one of the framework's tasks"):
        inference.load(path, torch.device("cpu"))
    path = write_checkpoint(tmp_path / "crafted2.ckpt", task_cfg=crafted)  # the codec is stored; evaluate builds it
    with pytest.raises(ValueError, match=r"crafted2\.ckpt: task._target_='os.makedirs' is not one of"):
        inference.run_evaluate(evaluate_cfg(path, tmp_path))
    assert not marker.exists()


def test_a_nested_target_in_a_stored_task_config_is_not_built(tmp_path):
    marker = tmp_path / "nested-ran"
    task = {**TASK, "n_symbols": {"_target_": "os.makedirs", "name": str(marker)}}
    with pytest.raises(Exception):  # noqa: B017  (whatever the task's constructor says of a dict)
        inference.task_from_config(task, where="test")
    assert not marker.exists()


def test_a_framework_task_from_a_checkpoint_still_evaluates(tmp_path):
    path = write_checkpoint(tmp_path / "good.ckpt")
    report = inference.run_evaluate(evaluate_cfg(path, tmp_path))
    assert report["splits"]["test"]["n"] == 4


@pytest.mark.parametrize("member", ["data.pkl", "data/0"])
def test_a_checkpoint_whose_bytes_changed_in_place_is_refused_naming_the_file_and_member(tmp_path, member):
    import zipfile

    from archsweep.core.model.checkpoint import check_checkpoint_file

    path = tmp_path / "last.ckpt"
    torch.save({"weights": torch.arange(4096, dtype=torch.float32), "step": 3}, path)
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(f"/{member}"))
    data = bytearray(path.read_bytes())
    local = info.header_offset  # the member's local header: 30 bytes, then its name and extra field (torch's padding)
    start = local + 30 + int.from_bytes(data[local + 26:local + 28], "little") \
        + int.from_bytes(data[local + 28:local + 30], "little") + 40  # inside the member's bytes
    data[start:start + 8] = bytes(b ^ 0x5A for b in data[start:start + 8])  # a bad sector, the size unchanged
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{path} is damaged: last/{member} does not match the checksum"):
        check_checkpoint_file(path)
    if member == "data/0":  # what the check is for: torch reads the changed weights without a word
        assert not torch.equal(torch.load(path, weights_only=True)["weights"], torch.arange(4096, dtype=torch.float32))
