"""Test markers kept here rather than in the test files: the `slow` tests of modules that are edited often, so the
mark cannot be lost in a merge. Other modules mark their own (`pytestmark = pytest.mark.slow` or
`@pytest.mark.slow`).

    python -m pytest -q                   # everything (what CI runs)
    python -m pytest -m "not slow" -q     # the quick tests: no train.py subprocesses, sweeps or learning tests
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# The libraries' caches (torch's compiled kernels, Hugging Face datasets, W&B, matplotlib) in one folder of this
# test session's own, made by its first pytest process (xdist workers and the processes tests start inherit it),
# removed at its end: never ~/.cache or /tmp/torchinductor_<user>, where an earlier session's kernels or tokenized
# datasets would make a test fast, or pass, on what it did not make itself. Set before anything imports torch.
SESSION_CACHES = "ARCHSWEEP_TEST_CACHES"
if SESSION_CACHES not in os.environ:
    os.environ[SESSION_CACHES] = tempfile.mkdtemp(prefix="archsweep-test-caches-")
    atexit.register(shutil.rmtree, os.environ[SESSION_CACHES], ignore_errors=True)
    for var, folder in {"XDG_CACHE_HOME": "xdg", "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
                        "TRITON_CACHE_DIR": "triton", "HF_HOME": "huggingface", "MPLCONFIGDIR": "matplotlib",
                        "WANDB_CACHE_DIR": "wandb", "WANDB_CONFIG_DIR": "wandb-config",
                        "WANDB_DATA_DIR": "wandb-data"}.items():
        os.environ[var] = os.path.join(os.environ[SESSION_CACHES], folder)

import pytest  # noqa: E402

# registers the config groups' schemas, which the yaml files name
import archsweep.core.train.config.schemas  # noqa: E402, F401

# skip_policy: a skip not on its allow-list fails the run; pytester: test_skip_policy.py runs pytest on examples
pytest_plugins = ["skip_policy", "pytester"]

if os.environ.get("PYTEST_XDIST_WORKER"):  # `-n 2`: the test processes share the cores, one torch thread each
    import torch

    torch.set_num_threads(1)
    # and so do the train.py processes they start: two threads each beside another worker's would contend for the
    # cores (tests that set their own thread count keep it)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# module -> its slow tests by function name (every parametrisation), or "*" for the whole module
SLOW = {
    "test_model_learning.py": "*",  # learning tests: tiny models overfit a batch
    "test_inference_cli.py": "*",  # trains two checkpoints through train.py, then generate.py / evaluate.py
    "test_bpb.py": {"test_a_bpe_run_logs_the_bpb_its_checkpoint_gives_by_hand"},  # a train.py run
    "test_branches.py": "*",  # train.py runs with budget branches, one stopped during a branch and continued
    "test_diagnostics.py": {"test_train_logs_norms_entropy_maps_and_accuracy_by_length",
                            "test_diverging_run_is_stopped_and_marked",  # train.py runs
                            "test_train_refuses_bad_settings_naming_the_field",  # refusals of train.py processes
                            "test_settings_check_imports_nothing_heavy"},  # a fresh interpreter's imports
    # refusals and --help as a user meets them: a train.py / generate.py / evaluate.py process each (the same
    # rules are checked in-process by test_train_conf.py, test_rules.py, test_cli_args.py and test_model_product.py)
    "test_train_cli.py": "*",
    "test_refusals.py": {"test_a_value_of_the_wrong_type_is_refused_when_composing",
                         "test_bad_training_setting_is_refused_naming_the_field",
                         "test_trainer_gpu_without_a_gpu_says_so_and_suggests_the_cpu",
                         "test_warmup_longer_than_training_is_named_with_the_fix",
                         "test_an_output_root_that_is_a_file_is_refused", "test_a_read_only_output_root_is_refused",
                         "test_a_file_that_is_not_a_checkpoint_is_refused_as_ckpt_path",
                         "test_evaluate_refuses_model_overrides_and_takes_task_overrides_without_plus"},
    "test_cli_args.py": {"test_a_misspelt_setting_stops_train_py_in_one_line_and_leaves_no_run",
                         "test_generate_without_ckpt_says_so_in_one_line"},
    "test_callbacks.py": {"test_help_lists_the_group", "test_train_refuses_a_bad_target_before_training",
                          "test_default_check_imports_nothing_heavy"},
    "test_imports.py": {"test_variants_and_builder_import_no_framework",
                        "test_the_registries_rules_and_model_config_import_no_torch"},
    "test_compare.py": {"test_cli_prints_the_table_writes_files_and_exits_2_on_bad_input"},
    "test_significance.py": {"test_compare_py_exits_2_on_a_baseline_matching_no_cell"},  # compare.py process
    "test_compute.py": {"test_a_run_logs_flops_and_mfu_to_metrics_wandb_and_results"},  # a train.py run
    # over ~2 s in one process
    "test_generation.py": {"test_a_compiled_model_decodes_the_same_tokens"},  # dynamo traces the decoding steps
    "test_gpu_bench.py": "*",  # bench/gpu.py --tiny as a process
    "test_attention_kinds.py": {"test_flex_attention_block_mask_equals_sdpa"},  # flex_attention compiles
    "test_experiments.py": {"test_match_d_ff_picks_the_closest_count"},  # builds a model per candidate d_ff
    "test_sweep_console.py": {"test_a_sweep_prints_an_error_every_job_hit_once_with_their_count",  # train.py sweeps
                              "test_a_joblib_sweep_re_run_to_resume_prints_no_library_line_a_user_cannot_act_on"},
}


# the tests that signal or kill a run (`-m signals`: issue 39 asks for 20 rounds of them in a row under load)
SIGNALS = {
    "test_signals.py": "*", "test_ddp_signals.py": "*", "test_parallel_events.py": "*",
    "test_run_safety.py": {"test_a_signal_stops_with_a_checkpoint_and_resumes_exactly_in_place",
                           "test_resume_continues_an_interrupted_run_in_its_directory_with_the_uninterrupted_losses",
                           "test_an_interrupted_sweep_cell_resumes_with_its_whole_history",
                           "test_a_submitit_job_signalled_as_slurm_does_is_interrupted_then_resumed_by_the_rerun",
                           "test_a_data_parallel_run_signalled_stops_interrupted_and_resumes"},
    "test_fsdp.py": {"test_a_sigterm_leaves_an_interrupted_run_whose_resume_equals_the_uninterrupted_one"},
    "test_tokens_train.py": {"test_a_run_stopped_and_resumed_trains_on_the_batches_of_the_uninterrupted_run"},
    "test_wsd.py": {
        "test_a_signal_a_branch_noted_in_its_last_step_stops_before_the_next_branch_with_that_branch_recorded",
        "test_stop_on_signal_reports_a_signal_it_could_not_act_on"},
    "test_branches.py": {"test_a_run_stopped_during_a_branch_completes_the_missing_ones_once"},
    "test_slurm.py": {"test_only_submitits_preemption_signal_is_handed_to_its_requeue",
                      "test_a_two_process_cell_preempted_is_requeued_and_resumes_at_its_step"},
    "test_prepare.py": {"test_killed_and_resumed_equals_an_uninterrupted_run"},
    "test_sweep_console.py": {"test_a_joblib_sweep_re_run_to_resume_prints_no_library_line_a_user_cannot_act_on"},
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = getattr(item, "originalname", item.name)
        for marks, marker in ((SLOW, pytest.mark.slow), (SIGNALS, pytest.mark.signals)):
            chosen = marks.get(item.path.name)
            if chosen == "*" or (chosen and name in chosen):
                item.add_marker(marker)


@pytest.fixture(autouse=True, scope="session")
def own_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Tests, and the train.py processes they start, cache (tokenized data, the peak-FLOPs probe) in this session's
    own folder: never the user's ~/.cache, so what an earlier session left there cannot make a test pass."""
    before = os.environ.get("ARCHSWEEP_CACHE_DIR")
    os.environ["ARCHSWEEP_CACHE_DIR"] = str(tmp_path_factory.mktemp("archsweep-cache"))
    yield
    if before is None:
        os.environ.pop("ARCHSWEEP_CACHE_DIR", None)
    else:
        os.environ["ARCHSWEEP_CACHE_DIR"] = before


@pytest.fixture(autouse=True)
def no_stop_signal_carried_over():
    """A test that signals a handler in this process (StopOnSignal, HeldSignals) leaves the process's noted stop
    (`stops.STOPS`) behind; the next test's run would take it for its own and stop before it started."""
    from archsweep.core.train.lifecycle.stops import STOPS

    yield
    STOPS.take()
