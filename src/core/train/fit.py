"""Build, fit and test one validated configuration with Lightning; write the run directory's outputs.

<run dir>/config.yaml        resolved config (what was trained, vocab sizes filled in)
<run dir>/metrics.csv        every logged metric, whatever the logger
<run dir>/checkpoints/       last.ckpt (resume) and best.ckpt (lowest val/loss)
<run dir>/attention/         attention maps at each validation (step_<step>.png; `diagnostics:` settings; image
                             tasks also patches_step_<step>.png: attention over the patches on the images)
<run dir>/confusion_matrix_<split>.png, .json   image tasks: the test split's confusion matrix
<run dir>/results.json       final metrics and facts about the run (core/train/results.py: `Results`)
<run dir>/branches/          schedule.branches: the stable-phase states and budgets.json (core/train/branches.py)
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch.distributed as dist
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf, read_write

from archsweep.core.data.codec import codec_from_state, codec_state_for
from archsweep.core.data.paths import cache_dir
from archsweep.core.data.tasks.base import Task
from archsweep.core.model.build import build_model, count_parameters
from archsweep.core.model.checkpoint import CKPT_DIR
from archsweep.core.train.branches import (
    Budgets,
    branch_callbacks,
    branch_trainer_cfg,
    fit_branch,
    plan_of,
    stable_points,
)
from archsweep.core.train.callback_group import make_callbacks
from archsweep.core.train.callbacks import (
    AtomicCheckpointIO,
    Interrupted,
    Progress,
    RunCheckpoint,
    StopOnSignal,
    ValidateAtEnd,
)
from archsweep.core.train.compute import Compute
from archsweep.core.train.decode_callback import DecodeOnValidation
from archsweep.core.train.diagnostic_callbacks import DivergenceMonitor, diagnostic_callbacks
from archsweep.core.train.image_callbacks import image_callbacks
from archsweep.core.train.lit import LitModel
from archsweep.core.train.loggers import LogRun, finish_wandb, make_loggers, new_run_id
from archsweep.core.train.memory import peak_mib, reset_peak
from archsweep.core.train.results import RESULTS, Results
from archsweep.core.train.rules import FSDP_STRATEGY, data_parallel, processes
from archsweep.core.train.runinfo import RunInfo, compare_block, wandb_config
from archsweep.core.train.setup import ConfigError, Setup
from archsweep.core.train.shard import sharded_strategy
from archsweep.core.train.summary import family, summary_line, validation_keys
from archsweep.core.train.wsd import Branch
from archsweep.variants.model import BIDIRECTIONAL, IMAGE, form_of

log = logging.getLogger("train")


class TaskData(L.LightningDataModule):
    """The task's dataloaders; training resumes at the batch the restored step count says."""

    def __init__(self, task: Task, kind: str, seed: int) -> None:
        super().__init__()
        self.task, self.kind, self.seed = task, kind, seed

    def _loader(self, split: str, start: int = 0) -> Any:
        t = self.trainer
        return self.task.dataloader(split, self.kind, self.seed, start, t.global_rank, t.world_size)

    def train_dataloader(self) -> Any:
        return self._loader("train", self.trainer.global_step * self.trainer.accumulate_grad_batches)

    def val_dataloader(self) -> Any:
        return self._loader("val")

    def test_dataloader(self) -> Any:
        splits = self.task.test_splits
        return self._loader(splits[0]) if len(splits) == 1 else [self._loader(s) for s in splits]


def sweep_job_for_ddp(info: RunInfo) -> None:
    """Lightning starts DDP workers by re-running the command line; in a sweep that line is the whole sweep.
    Point it at this job alone, in this job's directory."""
    from hydra.core.hydra_config import HydraConfig

    sys.argv = [sys.argv[0], *info.overrides]
    hc = HydraConfig.get()
    with read_write(hc):
        hc.run.dir = str(info.run_dir)


def validation_every(max_steps: int, interval: int) -> int:
    """Steps between validations: `interval`, or in a run shorter than it (a short sweep) the largest divisor of
    max_steps that gives 4 to 20 validations, the last at the final step, so loss curves are curves; where no
    divisor does (max_steps prime, say, as a FLOP budget can make it), 8 evenly spaced ones. Either way the final
    step is validated too (callbacks.ValidateAtEnd)."""
    if max_steps >= interval:
        return interval
    fitting = [d for d in range(1, max_steps // 4 + 1) if max_steps % d == 0 and max_steps // d <= 20]
    return max(fitting) if fitting else max(1, -(-max_steps // 8))


def make_trainer(cfg: DictConfig, loggers: list[Any], callbacks: list[Any], run_dir: Path) -> L.Trainer:
    args = OmegaConf.to_container(cfg.trainer, resolve=True)
    args.pop("peak_flops", None)  # ours (MFU), not Lightning's
    timeout = args.pop("collective_timeout_s", None)
    if args["strategy"] == FSDP_STRATEGY:  # trainer=fsdp (core/train/shard.py)
        args["strategy"] = sharded_strategy(processes(cfg.trainer), timeout)
    else:
        args["strategy"] = with_collective_timeout(args["strategy"], timeout)
    accumulate = args.get("accumulate_grad_batches", 1)
    every = validation_every(args["max_steps"], args["val_check_interval"])
    if every != args["val_check_interval"]:
        log.info(f"trainer.max_steps={args['max_steps']} is below trainer.val_check_interval="
                 f"{args['val_check_interval']}: validating every {every} steps instead")
    args["val_check_interval"] = every * accumulate
    return L.Trainer(**args, logger=loggers, callbacks=callbacks, plugins=[AtomicCheckpointIO()],
                     default_root_dir=str(run_dir))


class CollectiveTimeout(RuntimeError):
    """A data-parallel collective did not complete in trainer.collective_timeout_s."""


def with_collective_timeout(strategy: Any, seconds: float | None) -> Any:
    """A `ddp*` strategy name -> that strategy with this timeout on its collectives (torch's default is 30
    minutes, which looks like a hang); anything else unchanged."""
    if not isinstance(strategy, str) or not strategy.startswith("ddp") or not seconds:
        return strategy
    from lightning.pytorch.strategies import StrategyRegistry

    if strategy not in StrategyRegistry:
        return strategy  # not a registered name: Lightning says so
    entry = StrategyRegistry[strategy]  # {"strategy": class, "init_params": {...}}
    return entry["strategy"](**entry["init_params"], timeout=datetime.timedelta(seconds=float(seconds)))


def stop_workers(trainer: L.Trainer) -> None:
    """After an error in rank 0 of a DDP run, end the other processes: Lightning leaves them running (except on
    Ctrl+C), and they would wait in their next collective, holding the run's output pipes open. A launcher ends
    only the processes it started itself: none where torchrun, SLURM or spawn's parent started them."""
    launcher = trainer.strategy.launcher
    if launcher is not None and trainer.is_global_zero:
        launcher.kill(signal.SIGKILL)


def explain_collective_timeout(error: BaseException, cfg: DictConfig) -> BaseException:
    """gloo's "Timed out waiting ... for recv" / NCCL's watchdog timeout, said in our terms."""
    text = str(error)
    if not data_parallel(cfg.trainer.get("strategy", "")) or not (
            "Timed out" in text or "timed out" in text or "Watchdog caught collective operation timeout" in text):
        return error
    seconds = cfg.trainer.get("collective_timeout_s")
    return CollectiveTimeout(
        f"a collective across the data-parallel processes did not complete within trainer.collective_timeout_s="
        f"{seconds} s: another process stopped, hung or fell behind (its log is train_ddp_process_<rank>.log in "
        f"the run directory); if one step legitimately takes longer, raise trainer.collective_timeout_s "
        f"(torch: {text.splitlines()[0][:200]})")


def wandb_lines(loggers: list[Any]) -> list[str]:
    """W&B runs silent (core/train/console.py); this is what it would have said that matters: where the run is."""
    from lightning.pytorch.loggers import WandbLogger

    lines = []
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            run = logger.experiment  # starts the W&B run now rather than at the first logged metric
            if getattr(run, "settings", None) is not None and run.settings.mode == "offline":
                lines.append(f"W&B offline run in {run.settings.sync_dir}; upload it with "
                             f"`wandb sync {run.settings.sync_dir}`")
            elif getattr(run, "url", None):
                lines.append(f"W&B run {run.url}")
    return lines


def train_summary(trainer: L.Trainer) -> dict[str, float | None]:
    """The last logged training loss (the final loss; val/loss comes from the best checkpoint) and the loss spikes
    the divergence check counted (diagnostics.spike_factor)."""
    loss = trainer.callback_metrics.get("train/loss")
    monitor = next((cb for cb in trainer.callbacks if isinstance(cb, DivergenceMonitor)), None)
    return {"loss": float(loss) if loss is not None else None,
            "loss_spikes": float(monitor.spikes) if monitor is not None else None}


def metrics_of(split: str, out: dict[str, Any]) -> dict[str, float]:
    return {k.split("/", 1)[1]: float(v) for k, v in out.items() if k.startswith(f"{split}/")}


def evaluate_after_fit(trainer: L.Trainer, lit: LitModel, data: TaskData, ckpt_cb: RunCheckpoint,
                       splits: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(validation outputs, test outputs, checkpoint evaluated) from the best checkpoint, else the final weights.
    A diverged run is evaluated only from a checkpoint whose validation loss was finite; without one, its
    metrics are NaN and its (possibly NaN) weights are not run."""
    best = ckpt_cb.best_model_path or None
    score = ckpt_cb.best_model_score
    if lit.diverged is not None and (best is None or score is None or not math.isfinite(float(score))):
        nan = {f"{split}/{k}": math.nan for split in ("val", *splits) for k in ("loss", "ppl", "acc", "exact_match")}
        return nan, nan, None
    ckpt = "best" if best else None
    log.info(f"evaluating {f'the best checkpoint ({best})' if best else 'the final weights'} on "
             f"{', '.join(('val', *splits)[:-1])} and {splits[-1]}")
    val = trainer.validate(lit, datamodule=data, ckpt_path=ckpt, verbose=False)[0]
    test = {k: v for out in trainer.test(lit, datamodule=data, ckpt_path=ckpt, verbose=False) for k, v in out.items()}
    return val, test, best


def interrupted_results(trainer: L.Trainer, stop: BaseException, info: RunInfo, cfg: DictConfig, setup: Setup,
                        n_params: int, run_id: str, ckpt_cb: RunCheckpoint) -> dict[str, Any] | None:
    """results.json of a run stopped by a signal: status `interrupted`, the step, the checkpoint to resume from."""
    if isinstance(stop, Interrupted):
        signum, step, checkpoint = stop.signum, stop.step, stop.checkpoint
    else:  # Lightning's SIGTERM handling (DDP): the newest checkpoint is the last one saved
        signum, step, checkpoint = signal.SIGTERM, trainer.global_step, ckpt_cb.last_model_path or None
    how = "re-run the sweep" if info.multirun else f"python train.py resume={info.run_dir} (or the same command again)"
    log.warning(f"interrupted by {signal.Signals(signum).name} at step {step}; to continue from {checkpoint}: {how}")
    if not trainer.is_global_zero:
        return None
    results = Results(
        status="interrupted",
        interrupted={"signal": signal.Signals(signum).name, "step": step, "exit_code": 128 + signum},
        name=info.name, group=info.group, run_dir=str(info.run_dir), choices=info.choices, overrides=info.overrides,
        seed=cfg.seed, params=n_params, steps=step, last_checkpoint=checkpoint,
        resumed_from=str(setup.ckpt_path) if setup.ckpt_path else None, wandb_run_id=run_id)
    results.write(info.run_dir / RESULTS)
    return results.to_dict()


DDP_ENV = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "PL_GLOBAL_SEED",
           "PL_SEED_WORKERS")


def train(cfg: DictConfig, setup: Setup, info: RunInfo, start_time: float) -> dict[str, Any] | None:
    """Returns results.json's content (None in DDP worker processes other than rank 0)."""
    env = {k: os.environ.get(k) for k in DDP_ENV}
    try:
        return fit_and_test(cfg, setup, info, start_time)
    except RuntimeError as error:
        explained = explain_collective_timeout(error, cfg)
        if explained is error:
            raise
        raise explained from error
    finally:
        # Lightning leaves its process group and environment (LOCAL_RANK, MASTER_PORT, ...) behind; the next job
        # of a sweep would take them for an external launcher's and never start its own workers.
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def folder_codec(codec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A run started from a Hugging Face folder keeps the folder's tokenizer where its data came as bare ids; one
    whose data has another tokenizer than the folder's is refused (the same ids would mean other text)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return codec
    text = path.read_text()
    if codec.get("type") == "ids":
        return {**codec, "type": "tokenizer", "src": text, "tgt": text}
    if codec.get("type") == "tokenizer" and json.loads(codec["tgt"]).get("model") != json.loads(text).get("model"):
        raise ConfigError(f"model.init_from={folder}: the task's tokenizer is not the folder's tokenizer.json (their "
                          f"vocabularies differ); train on data tokenized with the folder's tokenizer")
    return codec


def fit_and_test(cfg: DictConfig, setup: Setup, info: RunInfo, start_time: float) -> dict[str, Any] | None:
    """Build, fit and test `setup` (checked by job.py; `cfg` is read, not checked again)."""
    meta_in = setup.resume
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    model = build_model(setup.model_cfg)
    if cfg.get("init_from") is not None and meta_in is None:  # fine-tuning; a resumed run has its own weights
        from archsweep.core.model.checkpoint import CheckpointError, init_weights_from

        try:
            log.info(f"initialised from the weights of {init_weights_from(model, cfg.init_from)}")
        except CheckpointError as e:
            raise ConfigError(str(e)) from None
    if setup.hf_init is not None and meta_in is None:  # model.init_from: published weights
        from archsweep.core.model.hf import load_folder_weights

        try:
            load_folder_weights(model, setup.hf_init)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        log.info(f"initialised from the Hugging Face model in {setup.hf_init}")
    n_params, n_active = count_parameters(model), count_parameters(model, count="active")
    if cfg.compile:
        model.compile()
    run_id = meta_in["wandb_run_id"] if meta_in else new_run_id()
    resolved = OmegaConf.to_container(cfg, resolve=True)
    codec = codec_state_for(setup.task)  # lets generate.py / evaluate.py work from a checkpoint alone
    if setup.hf_init is not None:
        codec = folder_codec(codec, Path(setup.hf_init))
    meta = {"config": resolved, "choices": info.choices, "overrides": info.overrides, "wandb_run_id": run_id,
            "codec": codec}
    lit = LitModel(model, setup.task.forward_fn(setup.model_cfg.kind), resolved["optim"], resolved["schedule"],
                   cfg.label_smoothing, cfg.seed, meta, setup.task.test_splits,
                   longest_input=setup.task.max_input_len(setup.model_cfg.kind),
                   token_bytes=setup.task.token_bytes(setup.model_cfg.kind))
    extra = {"params": n_params, "active_params": n_active, "run_dir": str(info.run_dir)}
    in_place = setup.ckpt_path is not None and info.run_dir.resolve() in Path(setup.ckpt_path).resolve().parents
    run = LogRun(info.run_dir, info.name, info.group, info.tags, wandb_config(cfg, info, extra), run_id)
    loggers = make_loggers(resolved["logger"], run, setup.resume_step if in_place else None)
    ckpt_cb = RunCheckpoint(info.run_dir / CKPT_DIR)
    progress = Progress(start_time, validation_keys(setup.task))
    compute = Compute(cfg.trainer.get("peak_flops"), cache_dir(cfg.task.get("cache_dir")))
    if info.multirun and data_parallel(cfg.trainer.strategy) and "spawn" not in str(cfg.trainer.strategy):
        sweep_job_for_ddp(info)
    last_path = info.run_dir / CKPT_DIR / "last.ckpt"
    stop_cb = StopOnSignal(last_path)
    callbacks: list[L.Callback] = [ckpt_cb, progress, compute, stop_cb, ValidateAtEnd(),
                                   LearningRateMonitor(logging_interval="step")]  # train/lr/pg<N>
    plan = plan_of(cfg)  # budget branches (schedule.branches): their stable-phase states are saved as the run passes
    if plan:
        try:
            callbacks.append(stable_points(plan, info.run_dir, (setup.resume_step or 0) if setup.ckpt_path else None))
        except ValueError as e:
            raise ConfigError(str(e)) from None
    kind, text = setup.model_cfg.kind, codec_from_state(codec)
    if cfg.eval.decode_samples > 0 and codec["seq2seq"] and form_of(kind) != BIDIRECTIONAL:
        callbacks.append(DecodeOnValidation(setup.task, kind, text, setup.decoding, cfg.eval.decode_samples,
                                            cfg.eval.show_examples, cfg.seed, cfg.eval.decode_max_new_tokens,
                                            cfg.eval.decode_time_s))
    callbacks += diagnostic_callbacks(setup.diagnostics, setup.task, kind, text, cfg.seed, info.run_dir,
                                      compiled=cfg.compile)
    if form_of(kind) == IMAGE:  # top-5 accuracy, confusion matrix, attention over the patches
        callbacks += image_callbacks(setup.task, kind, cfg.seed, info.run_dir, setup.diagnostics.attention_maps)
    callbacks += make_callbacks(setup.callbacks)  # the `callbacks` group, after train.py's own
    trainer = make_trainer(cfg, loggers, callbacks, info.run_dir)
    if trainer.is_global_zero:
        OmegaConf.save(cfg, info.run_dir / "config.yaml", resolve=True)
        setup.task.save(info.run_dir)  # e.g. the tokenizer, so the run's outputs can be decoded
        log.info(f"run {info.name!r} in {info.run_dir}: {setup.model_cfg.kind}, {n_params:,} parameters"
                 + (f" ({n_active:,} active per token)" if n_active != n_params else "")
                 + (f", resuming from {setup.ckpt_path}" if setup.ckpt_path else ""))
        for line in wandb_lines(loggers):
            log.info(line)
    data = TaskData(setup.task, setup.model_cfg.kind, cfg.seed)
    reset_peak()
    fit_start = time.time()
    try:
        trainer.fit(lit, datamodule=data, ckpt_path=str(setup.ckpt_path) if setup.ckpt_path else None)
    except (Interrupted, SIGTERMException) as stop:
        return interrupted_results(trainer, stop, info, cfg, setup, n_params, run_id, ckpt_cb)
    except BaseException:
        stop_workers(trainer)
        raise
    fit_s = time.time() - fit_start
    train = train_summary(trainer)  # before the evaluation below replaces the callback metrics
    if ckpt_cb.saved_step != trainer.global_step:  # last steps after the last validation
        trainer.save_checkpoint(ckpt_cb.last_model_path or str(info.run_dir / CKPT_DIR / "last.ckpt"))
    eval_start = time.time()
    try:
        val, test, best = evaluate_after_fit(trainer, lit, data, ckpt_cb, setup.task.test_splits)
    except SIGTERMException as stop:  # a SystemExit with code 0: never let it end the run as a success
        return interrupted_results(trainer, stop, info, cfg, setup, n_params, run_id, ckpt_cb)
    except BaseException:
        stop_workers(trainer)
        raise
    by_context = None
    if cfg.eval.get("context_lengths") is not None and trainer.is_global_zero:
        from archsweep.core.eval.context import evaluate_contexts

        by_context = evaluate_contexts(lit.model, setup.task, "test", list(cfg.eval.context_lengths),
                                       cfg.eval.get("stride"), cfg.eval.get("context_tokens"), progress=log.info)
    eval_s = time.time() - eval_start
    results = None
    if trainer.is_global_zero:
        done = Results(
            status="diverged" if lit.diverged else "completed", diverged=lit.diverged,
            name=info.name, group=info.group, run_dir=str(info.run_dir), choices=info.choices,
            overrides=info.overrides, seed=cfg.seed, params=n_params, active_params=n_active,
            task_family=family(setup.task),
            steps=trainer.global_step, train=train,
            budget=setup.budget.record(trainer.global_step) if setup.budget else None,
            splits={"val": metrics_of("val", val), **{s: metrics_of(s, test) for s in setup.task.test_splits}},
            by_length=lit.by_length, by_context=by_context, best_checkpoint=best,
            last_checkpoint=str(info.run_dir / CKPT_DIR / "last.ckpt"),
            resumed_from=str(setup.ckpt_path) if setup.ckpt_path else None, wandb_run_id=run_id,
            tokens_per_s=progress.tokens_per_s * trainer.world_size,
            **compute.summary(progress.train_s, trainer.world_size),  # FLOPs, mfu, mfu_estimate, peak_*
            peak_memory_mib=peak_mib(lit.device), train_time_s=progress.train_s, val_time_s=progress.val_s,
            fit_time_s=fit_s, eval_time_s=eval_s, wall_time_s=time.time() - start_time,
            time_to_first_step_s=progress.first_step_s,
            world_size=trainer.world_size, compare=compare_block(cfg))
        if plan and (lit.diverged or trainer.global_step < cfg.trainer.max_steps):
            log.warning(f"schedule.branches: the run stopped at step {trainer.global_step} of "
                        f"{cfg.trainer.max_steps} ({'diverged' if lit.diverged else 'stopped early'}); no budgets "
                        f"are recorded")
        elif plan:
            try:
                done = with_budgets(done, Budgets(plan, info.run_dir), cfg, setup, lit, data, compute, info,
                                    start_time, stop_cb.pending)
            except (Interrupted, SIGTERMException) as stop:  # in a branch: continuing the run re-fits that branch
                signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGTERM
                last = ckpt_cb.last_model_path or str(last_path)
                return interrupted_results(trainer, Interrupted(signum, trainer.global_step, last), info, cfg,
                                           setup, n_params, run_id, ckpt_cb)
        done.write(info.run_dir / RESULTS)
        results = done.to_dict()
        log.info(summary_line(setup.task, results, info.run_dir / RESULTS))
    finish_wandb()
    return results


def with_budgets(done: Results, budgets: Budgets, cfg: DictConfig, setup: Setup, lit: LitModel, data: TaskData,
                 compute: Compute, info: RunInfo, start_time: float, pending: int | None) -> Results:
    """The run's results with `budgets`: each branch not yet recorded is fitted from its stable-phase state by a
    trainer of its own (no logger: the run's curves stay the run's), then the run itself (branches.py). `pending`: a
    signal the run's fit noted in its last step, which stops before the first branch."""
    done = budgets.run_results(done, trained=compute.flops_this_fit > 0)

    def fit_one(branch: Branch) -> tuple[dict[str, Any], int | None]:
        model = build_model(setup.model_cfg)  # its weights come from the stable-phase checkpoint
        if cfg.compile:
            model.compile()
        schedule = {**lit.schedule_cfg, "total_steps": branch.steps}
        branch_lit = LitModel(model, lit.forward_fn, lit.optim_cfg, schedule, cfg.label_smoothing, cfg.seed, lit.meta,
                              setup.task.test_splits, longest_input=lit.longest_input,
                              token_bytes=setup.task.token_bytes(setup.model_cfg.kind))
        branch_compute = Compute(cfg.trainer.get("peak_flops"), cache_dir(cfg.task.get("cache_dir")))
        callbacks = branch_callbacks(branch_compute, start_time, validation_keys(setup.task))
        trainer = make_trainer(branch_trainer_cfg(cfg, branch), [], callbacks, info.run_dir)
        return fit_branch(branch, branch_lit, data, trainer, branch_compute, info.run_dir)

    done.budgets = budgets.complete(done, fit_one, pending)
    return done
