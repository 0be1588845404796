"""generate.py and evaluate.py end to end on checkpoints that train.py wrote."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import scripts
import torch

from archsweep.core.data.codec import codec_from_state
from archsweep.core.eval.inference import load

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.batch_size=16",
        "task.max_len=6", "task.val_batches=2", "task.test_batches=2", "trainer.max_steps=30",
        "trainer.val_check_interval=15", "schedule.warmup_steps=5", "logger=none"]


def run(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = scripts.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.mark.parametrize("script", ["evaluate.py", "generate.py"])
def test_help_shows_the_scripts_own_usage_and_only_its_group(script):
    """--help starts with the script's usage line (not Hydra's list of train.py's groups), names its console
    script, gives an example, and lists the one group it composes, decoding (conf/hydra/help/<script>.yaml)."""
    out = run(script, "--help")
    first = out.stdout.splitlines()[0]
    assert first.startswith(f"Usage: python {script} ckpt=<checkpoint or run dir>"), out.stdout[:500]
    assert f"archsweep-{script.removesuffix('.py')}" in first
    assert f"    python {script} ckpt=outputs/runs/<run>" in out.stdout
    options = sorted(p.stem for p in (ROOT / "conf" / "decoding").glob("*.yaml"))
    assert f"\ndecoding: {', '.join(options)}\n" in out.stdout
    assert "\nnorm:" not in out.stdout and "powered by Hydra" not in out.stdout


@pytest.fixture(scope="module", params=["encoder_decoder", "decoder_only"])
def run_dir(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp(request.param)
    run("train.py", f"model={request.param}", *TINY, f"hydra.run.dir={path}")
    return path


def test_generate_prints_one_line_per_hypothesis(run_dir):
    out = run("generate.py", f"ckpt={run_dir}", 'prompts=["3 1 4", "2 7 1 8"]', "decoding=beam",
              "decoding.beam_size=3", "decoding.n_best=2", "decoding.max_new_tokens=8")
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "> 3 1 4" and lines[3] == "> 2 7 1 8"
    assert len(lines) == 6 and all("(score" in line for line in lines[1:3] + lines[4:6])
    for line in lines[1:3] + lines[4:6]:
        assert all(s.isdigit() for s in line.split("(score")[0].split())  # symbols of the task


def test_generate_greedy_matches_library_decoding(run_dir):
    from archsweep.core.eval.generation import DecodingConfig, generate
    from archsweep.core.eval.inference import encode_prompts

    out = run("generate.py", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", "prompt=5 4 3 2",
              "decoding.max_new_tokens=8")
    loaded = load(run_dir / "checkpoints" / "last.ckpt", torch.device("cpu"))
    inputs, mask = encode_prompts(loaded, ["5 4 3 2"], torch.device("cpu"))
    state = loaded.codec_state
    ids = generate(loaded.model, inputs, mask, DecodingConfig(max_new_tokens=8), eos_id=state["eos_id"],
                   pad_id=state["pad_id"], bos_id=state["bos_id"]).tokens[0, 0].tolist()
    assert out.stdout.splitlines()[1].strip() == loaded.codec.decode(ids)


def test_sampling_with_a_seed_is_repeatable(run_dir):
    args = (f"ckpt={run_dir}", "prompt=1 2 3", "decoding=sample", "decoding.temperature=3.0", "decoding.seed=4")
    assert run("generate.py", *args).stdout == run("generate.py", *args).stdout


def test_generate_refuses_bad_input_clearly(run_dir, tmp_path):
    out = run("generate.py", f"ckpt={run_dir}", "prompt=3 x 4", check=False)
    assert out.returncode != 0 and "prompt has symbols this task does not know: x" in out.stderr
    out = run("generate.py", f"ckpt={tmp_path}", "prompt=3", check=False)
    assert out.returncode != 0 and "no checkpoint there" in out.stderr
    out = run("generate.py", f"ckpt={run_dir}", check=False)
    assert out.returncode != 0 and "give prompt=" in out.stderr
    out = run("generate.py", f"ckpt={run_dir}", "prompt=3", "decoding=beam", "decoding.n_best=9", check=False)
    assert out.returncode != 0 and "decoding.n_best=9 must be between 1 and beam_size" in out.stderr


def test_evaluate_writes_metrics_and_length_table_beside_the_checkpoint(run_dir):
    out = run("evaluate.py", f"ckpt={run_dir}", "buckets=2")
    ckpt = run_dir / "checkpoints" / "best.ckpt"
    report = json.loads(ckpt.with_suffix(".eval.greedy.json").read_text())
    assert report["checkpoint"] == str(ckpt) and report["decoding"]["strategy"] == "greedy"
    test = report["splits"]["test"]
    assert test["n"] == 32 and test["decoded"] == 32
    assert {"loss", "ppl", "acc", "exact_match"} <= set(test) and 0.0 <= test["exact_match"] <= 1.0
    buckets = [row for row in report["by_length"] if row["split"] == "test"]
    assert sum(row["n"] for row in buckets) == 32 and 1 <= len(buckets) <= 2
    assert buckets[0]["lengths"][0] >= 1 and buckets[-1]["lengths"][1] <= 6
    assert "source length" in out.stdout and "results written to" in out.stdout


def test_evaluate_writes_one_file_per_decoding_setting_and_labels_a_partial_decode(run_dir):
    run("evaluate.py", f"ckpt={run_dir}", "decoding=beam", "decoding.beam_size=3", "splits=[test]")
    out = run("evaluate.py", f"ckpt={run_dir}", "decode_limit=5", "splits=[test]")
    ckpt = run_dir / "checkpoints" / "best.ckpt"
    beam = json.loads(ckpt.with_suffix(".eval.beam-beam_size3.json").read_text())
    limited = json.loads(ckpt.with_suffix(".eval.greedy-limit5.json").read_text())
    assert beam["setting"] == "beam-beam_size3" and limited["setting"] == "greedy-limit5"
    test = limited["splits"]["test"]
    assert test["n"] == 32 and test["decoded"] == 5 and test["length_table_exact_match"] == "teacher_forced"
    assert {"exact_match_teacher_forced", "exact_match_decoded"} <= set(test)
    assert test["exact_match"] == test["exact_match_decoded"]
    header = next(line for line in out.stdout.splitlines() if line.startswith("split") and "decoded" in line)
    assert header.split()[:7] == ["split", "n", "loss", "ppl", "acc", "exact", "decoded"]
    assert "teacher-forced (every example)" in out.stdout and "decoded (greedy)" in out.stdout
    assert "test: 5 of 32 examples decoded (decode_limit); teacher-forced metrics use all" in out.stdout
    assert "exact (t-forced)" in out.stdout  # the length table says which exact match it counts


def test_codec_round_trips_through_the_checkpoint(run_dir):
    loaded = load(run_dir, torch.device("cpu"))
    codec = codec_from_state(loaded.codec_state)
    ids = codec.encode("3 1 4", "src")
    assert codec.decode(ids + [loaded.codec_state["eos_id"], ids[0]]) == "3 1 4"


def test_validation_decodes_and_logs_examples_to_wandb(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("wandb_offline", ROOT.parent / "shared/tools/wandb_offline.py")
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    args = [a for a in TINY if a != "logger=none"] + ["eval.decode_samples=8", "eval.show_examples=2",
                                                      f"hydra.run.dir={tmp_path}"]
    out = scripts.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "decoded 8 validation examples (greedy, at most" in out.stdout + out.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    assert {"decoded_exact_match", "bleu"} <= set(result["val"])
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    history = reader.read_run(str(run_file))["history"]
    keys = {k for row in history for k in row}
    assert {"val/decoded_exact_match", "val/bleu", "val/examples/_type"} <= keys
    row = next(row for row in history if "val/examples/_type" in row)
    assert row["val/examples/_type"] == "table-file" and row["val/examples/nrows"] == 2
    table = json.loads((run_file.parent / "files" / row["val/examples/path"]).read_text())
    assert table["columns"] == ["source", "reference", "prediction"] and len(table["data"]) == 2
    assert all(src.split() == ref.split()[::-1] for src, ref, _ in table["data"])  # reverse task's references


@pytest.mark.slow
def test_a_language_model_shows_loss_perplexity_and_bits_per_byte_and_no_exact_match(tmp_path):
    """train.py's last line, the sweep-end table, metrics.csv and evaluate.py on a character-level language model
    (Tiny Shakespeare is ASCII: one byte per token, so bits per byte is the loss in bits)."""
    sweep = tmp_path / "sweep"
    out = run("train.py", "-m", "task=shakespeare_char", "model=decoder_only", "model.d_model=32", "model.n_heads=2",
              "model.n_layers=1", "model.d_ff=64", "task.block_size=32", "task.batch_size=8", "task.val_batches=1",
              "task.test_batches=1", "trainer.max_steps=2", "logger=none", "seed=0", f"hydra.sweep.dir={sweep}",
              f"output_root={tmp_path}")
    console = out.stdout + out.stderr
    result = json.loads((sweep / "0" / "results.json").read_text())
    for split in ("val", "test"):  # one byte per token: bits per byte = loss in bits
        assert result[split]["bpb"] == pytest.approx(result[split]["loss"] / math.log(2), rel=1e-5)
    header, *rows = (sweep / "0" / "metrics.csv").read_text().splitlines()
    column = header.split(",").index("val/bpb")
    logged = [float(r.split(",")[column]) for r in rows if r.split(",")[column]]
    assert logged and all(0 < v < 8 for v in logged)  # below 8 bits, a uniform guess over 256 byte values
    (done,) = [line for line in console.splitlines() if "done in" in line]
    assert f"test bits per byte {result['test']['bpb']:.3f}" in done
    assert f"test loss {result['test']['loss']:.4f}" in done and "exact" not in done
    (header,) = [line for line in console.splitlines() if "status" in line and "val loss" in line]
    assert "val bpb" in header and "test ppl" in header and "exact" not in header

    out = run("evaluate.py", f"ckpt={sweep / '0'}", f"output={tmp_path / 'eval.json'}")
    assert "bpb" in out.stdout and "source length" not in out.stdout and "exact" not in out.stdout
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["by_length"] == [] and "exact_match" not in report["splits"]["test"]
    assert report["splits"]["test"]["bpb"] == pytest.approx(result["test"]["bpb"], rel=1e-4)
