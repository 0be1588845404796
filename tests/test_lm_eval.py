"""The lm-eval model `archsweep` (archsweep.core.eval.harness) against lm-eval's Hugging Face backend on the
exported model: the same per-document log-likelihoods, rolling log-likelihoods, generations and scores, on local
tasks (a task YAML over a JSON file the test writes; lm-eval's benchmarks come from the Hub). Without a network,
a task whose dataset is on the Hub fails at once, in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import scripts

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from test_hf_interop import LLAMA, bpe_codec, save_run  # noqa: E402

import archsweep.core.eval.harness  # noqa: E402, F401  (registers the `archsweep` model)
from archsweep.core.eval.export import export  # noqa: E402

DOCS = [{"question": "the cat sat on the", "choices": [" mat", " log", " dog"], "answer": 0,
         "text": "the dog sat on the log.", "target": " mat"},
        {"question": "the dog sat on", "choices": [" the log", " the mat"], "answer": 1,
         "text": "the cat sat on the mat, the dog sat on the log. " * 8, "target": " the log"},
        {"question": "on the", "choices": [" cat", " dog", " mat", " log"], "answer": 2, "text": "cat",
         "target": " cat"}]
TASKS = {
    "local_choice": {"output_type": "multiple_choice", "doc_to_text": "{{question}}", "doc_to_choice": "{{choices}}",
                     "doc_to_target": "{{answer}}", "metric_list": [{"metric": "acc"}]},
    "local_rolling": {"output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
                      "metric_list": [{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}]},
    "local_generate": {"output_type": "generate_until", "doc_to_text": "{{question}}", "doc_to_target": "{{target}}",
                       "generation_kwargs": {"until": ["."], "max_gen_toks": 6, "do_sample": False},
                       "metric_list": [{"metric": "exact_match"}]},
}


def write_tasks(folder) -> TaskManager:
    folder.mkdir()
    data = folder / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    for name, spec in TASKS.items():  # JSON is YAML: each task file written with json.dumps
        task = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
                "test_split": "test", **spec}
        (folder / f"{name}.yaml").write_text(json.dumps(task))
    return TaskManager(include_path=str(folder))


def per_doc(result: dict, task: str) -> list:
    return [s["filtered_resps"] for s in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


@pytest.mark.slow
def test_same_scores_as_lm_evals_hugging_face_backend_on_the_exported_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    run, _ = save_run(tmp_path, LLAMA, bpe_codec())
    export(run, tmp_path / "hf")
    tasks = write_tasks(tmp_path / "tasks")
    common = dict(tasks=list(TASKS), task_manager=tasks, log_samples=True, batch_size=2, device="cpu")
    ours = simple_evaluate(model="archsweep", model_args=f"ckpt={run}", **common)
    theirs = simple_evaluate(model="hf", model_args=f"pretrained={tmp_path / 'hf'},dtype=float32", **common)
    for task in ("local_choice", "local_rolling"):
        for a, b in zip(per_doc(ours, task), per_doc(theirs, task), strict=True):
            flat = lambda r: [x for item in r for x in (item if isinstance(item, (list, tuple)) else [item])]
            assert flat(a) == pytest.approx(flat(b), abs=1e-4)
    assert per_doc(ours, "local_generate") == per_doc(theirs, "local_generate")
    assert any(text for text in per_doc(ours, "local_generate"))  # something was generated
    via_evaluate = evaluate_py(run, tmp_path)  # evaluate.py lm_eval.tasks=[...] runs the same model
    for task, metric in (("local_choice", "acc,none"), ("local_rolling", "word_perplexity,none"),
                         ("local_generate", "exact_match,none")):
        assert ours["results"][task][metric] == pytest.approx(theirs["results"][task][metric], rel=1e-4)
        assert via_evaluate["results"][task][metric] == pytest.approx(theirs["results"][task][metric], rel=1e-4)


def evaluate_py(run, tmp_path) -> dict:
    """evaluate.py ckpt=<run> lm_eval.tasks=[...] lm_eval.include_path=<tasks>, composed and run in this process;
    the results file it writes."""
    from hydra import compose, initialize_config_dir

    from archsweep import conf_dir
    from archsweep.core.eval.inference import run_evaluate

    output = tmp_path / "lm_eval.json"
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("evaluate", overrides=[f"ckpt={run}", f"lm_eval.tasks=[{','.join(TASKS)}]",
                                             f"lm_eval.include_path={tmp_path / 'tasks'}", "lm_eval.batch_size=2",
                                             "device=cpu", f"output={output}"])
    run_evaluate(cfg)
    return json.loads(output.read_text())


def test_refuses_a_run_without_a_text_tokenizer_or_a_causal_model(tmp_path):
    from archsweep.core.eval.harness import ArchsweepLM

    run, _ = save_run(tmp_path / "ids", LLAMA, {"type": "ids", "seq2seq": False, "pad_id": 0, "bos_id": 1,
                                                 "eos_id": 2, "sep_id": 3})
    with pytest.raises(ValueError, match="no text tokenizer"):
        ArchsweepLM(ckpt=str(run))
    run, _ = save_run(tmp_path / "encoder", {**LLAMA, "kind": "encoder_only"}, bpe_codec())
    with pytest.raises(ValueError, match="kind=encoder_only .*model=decoder_only"):
        ArchsweepLM(ckpt=str(run))


def test_the_hub_probe_tells_a_listening_port_from_a_closed_one():
    import socket

    from archsweep.core.eval.harness import hub_answers

    with socket.create_server(("127.0.0.1", 0)) as server:
        assert hub_answers(f"http://127.0.0.1:{server.getsockname()[1]}")
        closed = server.getsockname()[1]
    assert not hub_answers(f"http://127.0.0.1:{closed}", timeout=1.0)


def unreachable_dataset_run(tmp_path, *command: str, **env: str) -> subprocess.CompletedProcess:
    """`command` with the Hub at a closed local port (no network, on any machine), no dataset cache, and a task
    over a Hub dataset (--include_path <tmp_path>/tasks)."""
    import os
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        closed = server.getsockname()[1]
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hub_choice.yaml").write_text(json.dumps({"task": "hub_choice", "dataset_path": "archsweep/absent",
                                                       "test_split": "test", **TASKS["local_choice"]}))
    run, _ = save_run(tmp_path, LLAMA, bpe_codec())
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    return scripts.run([sys.executable, *(c.format(run=run, tasks=tasks) for c in command)], capture_output=True,
                          text=True, timeout=300, env={**base, "HF_ENDPOINT": f"http://127.0.0.1:{closed}",
                                                       "HF_HOME": str(tmp_path / "hf_home"), **env})


@pytest.mark.slow
def test_offline_a_hub_dataset_fails_at_once_in_one_line_naming_the_local_copy(tmp_path):
    """archsweep-lm-eval without a network: no retries (about 40 s) and no traceback, but one line saying the
    dataset could not be reached offline and how to give a local copy; exit status 1."""
    out = unreachable_dataset_run(tmp_path, "-m", "archsweep.core.eval.harness", "--model", "archsweep",
                                  "--model_args", "ckpt={run}", "--tasks", "hub_choice", "--include_path", "{tasks}",
                                  "--device", "cpu")
    assert out.returncode == 1, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("archsweep-lm-eval: error: a task's dataset could not be reached offline ("), last
    assert "'archsweep/absent'" in last and "--include_path" in last and "dataset_path: json" in last
    assert "Traceback" not in out.stderr and "Retrying" not in out.stderr
