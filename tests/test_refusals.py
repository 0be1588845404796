"""Bad input refused before training, naming the field (or file) and the fix (issue 15): seeds, optimiser and
trainer settings (a value of the wrong type by Hydra while composing, against the groups' schemas), a machine
without the asked-for GPU, output directories that cannot be written, files that are not checkpoints,
data-parallel validation with too few batches; evaluate.py's model and task overrides; a full disk while writing
a checkpoint. bench/refusals.py prints how long each refusal takes."""

from __future__ import annotations

import builtins
import errno
import io
import os
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import scripts
import torch
from test_safe_loading import write_checkpoint

from archsweep.core.model import checkpoint

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, extra_env: dict[str, str] | None = None, cwd: Path = ROOT):
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0", **(extra_env or {})}
    return scripts.run([sys.executable, str(ROOT / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


REFUSED = [
    (["seed=abc"], r"seed: Value 'abc' of type 'str' could not be converted to Integer"),
    (["seed=-1"], r"seed=-1 must be a whole number from 0 to 4294967295"),
    (["seed=1.5"], r"seed: Value '1.5' of type 'float' could not be converted to Integer"),
    (["trainer.accumulate_grad_batches=0"], r"trainer.accumulate_grad_batches=0 must be a positive whole number"),
    (["optim.betas=[0.9]"], r"optim.betas=\[0.9\] must be two numbers in \[0, 1\), e.g. optim.betas=\[0.9,0.98\]"),
    (["optim.weight_decay=-1"], r"optim.weight_decay=-1.0 must be a number >= 0"),
    (["trainer.gradient_clip_val=-1"], r"trainer.gradient_clip_val=-1.0 must be a number >= 0, or null to disable"),
    (["trainer.devices=0"], r"trainer.devices=0 must be a positive number of devices, -1 \(all\), auto"),
    (["trainer=ddp", "trainer.devices=4", "task.val_batches=2"],
     r"task.val_batches=2 is fewer than the 4 data-parallel processes .* set task.val_batches>=4"),
    (["schedule.warmup_steps=-1"], r"schedule.warmup_steps=-1 must be a number of optimiser steps >= 0"),
    (["optim.lr=-0.1"], r"optim.lr=-0.1 must be a positive learning rate"),
    (["schedule=cosine", "trainer.max_steps=100", "schedule.warmup_steps=100"],
     r"schedule.total_steps=100 must exceed schedule.warmup_steps=100 for the cosine schedule"),
    (["budget.flops=1e12", "budget.tokens=1e6"], r"budget.flops and budget.tokens both set: give one of them"),
]
# A value of the wrong type, or a key the group's schema lacks, is refused by Hydra while composing: one line naming
# the argument (src/composition.py)
COMPOSE_REFUSED = [
    (["optim.lr=abc"], "optim.lr=abc: Value 'abc' of type 'str' could not be converted to Float"),
    (["decoding.beam_size=x"], "decoding.beam_size=x: Value 'x' of type 'str' could not be converted to Integer"),
    (["schedule.warmup_steps=soon"], "schedule.warmup_steps=soon: Value 'soon' of type 'str' could not be converted"),
    (["trainer.max_steps=1e3x"], "trainer.max_steps=1e3x: Value '1e3x' of type 'str' could not be converted"),
    (["diagnostics.spike_factor=high"], "diagnostics.spike_factor=high: Value 'high' of type 'str' could not be"),
    (["optim.lrr=0.1"], "optim.lrr=0.1: optim has no setting 'lrr' (did you mean lr?); the settings of optim: "),
]


@pytest.mark.parametrize("args,message", COMPOSE_REFUSED, ids=[" ".join(a) for a, _ in COMPOSE_REFUSED])
def test_a_value_of_the_wrong_type_is_refused_when_composing(tmp_path, args, message):
    out = run("train.py", *args, f"output_root={tmp_path}")
    assert out.returncode == 1, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith(f"error: {message}"), out.stderr[-2000:]
    assert not (tmp_path / "runs").exists(), "refused before the run directory is made"


@pytest.mark.parametrize("args,message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_bad_training_setting_is_refused_naming_the_field(tmp_path, args, message):
    out = run("train.py", *args, f"output_root={tmp_path}")
    assert out.returncode == 1, out.stderr[-2000:]
    assert re.search(message, out.stderr), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert not list(tmp_path.glob("**/checkpoints")), "nothing may be trained"


def test_trainer_gpu_without_a_gpu_says_so_and_suggests_the_cpu(tmp_path):
    out = run("train.py", "trainer=gpu", f"output_root={tmp_path}", extra_env={"CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 1
    assert "trainer.accelerator=gpu (trainer=gpu) but this machine has no visible GPU" in out.stderr
    assert "train on the CPU with trainer=cpu" in out.stderr


def test_warmup_longer_than_training_is_named_with_the_fix(tmp_path):
    out = run("train.py", "trainer.max_steps=100", "schedule.warmup_steps=500", "trainer.precision=8-mixed",
              f"output_root={tmp_path}")  # the precision refusal comes after the warm-up check: nothing trains
    assert "schedule.warmup_steps=500 exceeds trainer.max_steps=100: the learning rate never reaches optim.lr " \
           "(it stops at 20% of it); lower schedule.warmup_steps (e.g. to 10)" in out.stdout + out.stderr
    assert out.returncode == 1 and "trainer.precision='8-mixed' is not a precision Lightning knows; choose one of " \
        in out.stderr and "bf16-mixed" in out.stderr  # Lightning's own list, asked through Trainer's signature
    assert "Traceback" not in out.stderr and not list(tmp_path.glob("**/checkpoints"))


def test_an_output_root_that_is_a_file_is_refused(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in ([], ["-m", "seed=0,1"]):
        out = run("train.py", *args, f"output_root={blocker}")
        assert out.returncode == 1, out.stderr[-2000:]
        assert re.search(rf"output_root={blocker}: cannot write to {blocker}/(runs|sweeps)/\S+ \(Not a directory",
                         out.stderr), out.stderr[-2000:]
        assert "choose a writable directory" in out.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_output_root_is_refused(tmp_path):
    tmp_path.chmod(0o555)
    try:
        out = run("train.py", f"output_root={tmp_path / 'outputs'}")
    finally:
        tmp_path.chmod(0o755)
    assert out.returncode == 1 and "cannot write to" in out.stderr and "Permission denied" in out.stderr


@pytest.mark.parametrize("content", ["text", "truncated"])
def test_a_file_that_is_not_a_checkpoint_is_refused_as_ckpt_path(tmp_path, content):
    path = tmp_path / "model.ckpt"
    if content == "text":
        path.write_text("not a checkpoint")
    else:
        good = write_checkpoint(tmp_path / "good.ckpt").read_bytes()
        path.write_bytes(good[: len(good) * 2 // 3])
    out = run("train.py", f"ckpt_path={path}", f"output_root={tmp_path}")
    assert out.returncode == 1
    assert f"{path} is not a readable checkpoint" in out.stderr and "truncated" in out.stderr
    assert "Traceback" not in out.stderr and "PytorchStreamReader" not in out.stderr


@pytest.mark.slow  # four evaluate.py processes, two of which evaluate
def test_evaluate_refuses_model_overrides_and_takes_task_overrides_without_plus(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.ckpt")
    out = run("evaluate.py", f"ckpt={ckpt}", "+model.max_seq_len=512", cwd=tmp_path)
    assert out.returncode == 1
    assert "model.max_seq_len: model settings do not apply in evaluate.py; the model is rebuilt from the " \
           "checkpoint" in out.stderr
    out = run("evaluate.py", f"ckpt={ckpt}", "+decode_limitt=3", cwd=tmp_path)
    assert out.returncode == 1  # refused before Hydra composes, with the nearest setting
    assert ("+decode_limitt=3: 'decode_limitt' is not a setting of evaluate.py (did you mean decode_limit?)"
            in out.stderr)
    out = run("evaluate.py", f"ckpt={ckpt}", "task.test_batches=2", "task.batch_size=3", "splits=[test]",
              f"output={tmp_path / 'eval.json'}", "device=cpu", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "6 examples" in out.stdout  # 2 batches of 3: the task overrides applied
    out = run("evaluate.py", f"ckpt={ckpt}", "task.block_size=512", cwd=tmp_path)
    assert out.returncode == 1 and "task: " in out.stderr and "block_size" in out.stderr
    assert "Traceback" not in out.stderr


def torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_a_full_disk_while_writing_a_checkpoint_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    checkpoint.atomic_save({"step": 1}, path)
    real_open = builtins.open

    def full_disk(file, mode="r", *args, **kwargs):  # the temporary file lands on a device with no space left
        return real_open("/dev/full", mode, *args, **kwargs) if ".tmp-" in str(file) else real_open(file, mode,
                                                                                                  *args, **kwargs)

    monkeypatch.setattr(checkpoint, "open", full_disk, raising=False)
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: SimpleNamespace(free=2**17))  # 128 KiB left
    state = {"step": 2, "weights": torch.arange(300_000)}  # 2.3 MiB of int64
    size = len(torch_bytes(state))
    with pytest.raises(OSError, match=rf"cannot write the checkpoint {path}: the disk is full .* the previous "
                                      r"last.ckpt, if any, is intact") as caught:
        checkpoint.atomic_save(state, path)
    assert caught.value.errno == errno.ENOSPC
    message = caught.value.strerror  # what train.py prints after `error: `: one line with the folder and the sizes
    assert "\n" not in message
    assert (f"last.ckpt needs {size / 2**20:.1f} MiB, {path.parent} has 128.0 KiB free" in message
            and f"Free {(size - 2**17) / 2**20:.1f} MiB or more there" in message), message
    assert checkpoint.safe_load(path) == {"step": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]


WRITER_FAILED = ("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: file "
                 "write failed")


@pytest.mark.parametrize("free, full", [(2**10, True), (2**40, False)])
def test_torchs_archive_writer_failing_is_a_full_disk_only_when_the_checkpoint_does_not_fit(tmp_path, monkeypatch,
                                                                                           free, full):
    path = tmp_path / "checkpoints" / "best.ckpt"
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):  # what torch raises when its writer hits a full disk
        if isinstance(f, io.BufferedWriter):
            f.write(b"partial")
            raise RuntimeError(WRITER_FAILED)
        return real_save(obj, f, *args, **kwargs)  # serialised into a byte counter: the size it needs

    monkeypatch.setattr(torch, "save", failing_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: SimpleNamespace(free=free))
    expected = (OSError, rf"cannot write the checkpoint {path}: the disk is full \(best.ckpt needs [\d.]+ KiB, "
                         rf"{path.parent} has 1.0 KiB free\)") if full else (RuntimeError, re.escape(WRITER_FAILED))
    with pytest.raises(expected[0], match=expected[1]):
        checkpoint.atomic_save({"weights": torch.arange(1000)}, path)
    assert list(path.parent.iterdir()) == []  # the partial temporary file removed
