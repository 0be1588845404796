"""`hydra/sweeper=halving`: a sweep whose tuned key's grid is pruned by successive halving within each cell
(archsweep.core.train.runs.halving; docs/training.md, Pruned tuning). It launches through whatever launcher the
sweep names (basic, joblib, submitit), one batch per rung: every job to the first rung, then each cell's surviving
values to the next, continued from their checkpoints, then the last survivors to the end. Re-run after a kill, it
launches only what is not yet done: a job paused at a rung it has reached is not launched for that rung again."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("train")


@dataclass
class HalvingSweeperConf:
    _target_: str = "hydra_plugins.archsweep_halving.halving_sweeper.HalvingSweeper"
    params: dict[str, str] | None = None  # the grid, as the basic sweeper takes it
    tune: str = "optim.lr"  # the key whose values are pruned within each cell
    rungs: list[float] = field(default_factory=lambda: [1 / 9, 1 / 3])  # fractions of the steps where they are
    eta: int = 3  # each rung keeps the best ceil(n / eta) of a cell's n values
    metric: str = "val/loss"  # what ranks them: the cool-down branch's validation metric (:min / :max)
    sequential: bool = False  # then add seeds to the cells whose comparison is open (compare.sequential's design)


ConfigStore.instance().store(group="hydra/sweeper", name="halving", node=HalvingSweeperConf, provider="archsweep")


class HalvingSweeper(Sweeper):
    def __init__(self, params: dict[str, str] | None, tune: str, rungs: list[float], eta: int, metric: str,
                 sequential: bool = False) -> None:
        super().__init__()
        self.params = dict(params or {})
        self.tune, self.rungs, self.eta, self.metric = tune, [float(r) for r in rungs], int(eta), metric
        self.sequential = sequential
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None
        self.hydra_context: HydraContext | None = None
        self.next_idx = 0
        self.branches: list[float] = []  # set on every job when the runs' schedule.branches is empty (check)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def grid(self, arguments: list[str]) -> list[list[str]]:
        """Every combination of the swept values (the basic sweeper's product), each a list of key=value."""
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        lists = []
        for override in parser.parse_overrides([*(f"{k}={v}" for k, v in self.params.items()), *arguments]):
            key = override.get_key_element()
            if override.is_sweep_override():
                if not override.is_discrete_sweep():
                    raise ValueError(f"hydra/sweeper=halving: {key} is swept as a range or interval; give its values "
                                     f"as a list, e.g. {key}=1,2,3")
                lists.append([f"{key}={v}" for v in override.sweep_string_iterator()])
            else:
                lists.append([f"{key}={override.get_value_element_as_str()}"])
        return [list(x) for x in itertools.product(*lists)]

    def check(self) -> tuple[bool, str]:
        """The rungs against the runs' schedule; the metric's direction. ValueError with the fix."""
        from archsweep.core.report.cells import parse_sort
        from archsweep.core.report.runs import CompareError

        assert self.config is not None
        if self.eta < 2:
            raise ValueError(f"hydra.sweeper.eta={self.eta} must be at least 2 (each rung keeps 1/eta of the values)")
        if not self.rungs or sorted(self.rungs) != self.rungs or not all(0 < r < 1 for r in self.rungs):
            raise ValueError(f"hydra.sweeper.rungs={self.rungs} must be increasing fractions between 0 and 1, e.g. "
                             f"[0.111,0.333]")
        if self.config.schedule.get("name") != "wsd":
            raise ValueError("hydra/sweeper=halving scores each rung on the cool-down branch of its budget, which "
                             "needs a warmup-stable-decay schedule: add schedule=wsd")
        branches = [float(b) for b in self.config.schedule.get("branches") or []]
        missing = [r for r in self.rungs if not any(abs(r - b) < 1e-9 for b in branches)]
        if branches and missing:
            raise ValueError(f"hydra.sweeper.rungs={self.rungs}: schedule.branches={branches} lacks "
                             f"{', '.join(f'{r:g}' for r in missing)}; leave schedule.branches empty (the sweeper "
                             f"then sets it to the rungs) or list every rung in it")
        self.branches = [] if branches else [*self.rungs, 1.0]
        try:
            sort = parse_sort(self.metric, [self.metric.partition(":")[0]])
        except CompareError as e:
            raise ValueError(f"hydra.sweeper.metric: {e}") from None
        return sort.lower_better, sort.key

    def launch(self, jobs: list[Any], pause_at: float | None) -> list[Any]:
        """Each job into its own directory (its place in the grid), paused at `pause_at` (None: to the end)."""
        assert self.launcher is not None
        if not jobs:
            return []
        pause = "null" if pause_at is None else repr(pause_at)
        branches = [f"schedule.branches=[{','.join(map(repr, self.branches))}]"] if self.branches else []
        batch = [[*job.overrides, *branches, f"pause_at={pause}", f"hydra.sweep.subdir={job.id}"] for job in jobs]
        self.validate_batch_is_legal(batch)
        returns = list(self.launcher.launch(batch, initial_job_idx=self.next_idx))
        self.next_idx += len(batch)
        for r in returns:
            _ = r.return_value  # a job that raised ends the sweep with its error, as Hydra's basic sweeper does
        return returns

    def sweep(self, arguments: list[str]) -> Any:
        from archsweep.core.train.runs.halving import State, jobs_of, reached, results_of, rung_score, survivors

        assert self.config is not None
        lower_better, metric = self.check()
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        alive = jobs_of(self.grid(arguments), self.tune)
        jobs = {j.id: j for j in alive}
        state = State(sweep_dir, {"tune": self.tune, "eta": self.eta, "metric": metric, "rungs_asked": self.rungs},
                      len(alive))
        steps = self.config.trainer.get("max_steps")
        returns = []
        for fraction in self.rungs:
            todo = [j for j in alive if not reached(results_of(sweep_dir, j), fraction)]
            log.info(f"halving: rung {fraction:.3g} ({round(fraction * steps) if steps else '?'} steps): "
                     f"{len(alive)} jobs, {len(todo)} to train"
                     + (f" ({len(alive) - len(todo)} there already)" if len(todo) < len(alive) else ""))
            returns.append(self.launch(todo, fraction))
            scores = {j.id: rung_score(results_of(sweep_dir, j), fraction, metric) for j in alive}
            kept = survivors(alive, scores, self.eta, lower_better)
            state.add_rung(fraction, alive, scores, kept)
            values = len({(j.cell, j.value) for j in alive})
            log.info(f"halving: rung {fraction:.3g} kept {len({(j.cell, j.value) for j in kept})} of {values} "
                     f"{self.tune} values ({len(kept)} jobs) by {metric}")
            alive = kept
        todo = [j for j in alive if not reached(results_of(sweep_dir, j), None)]
        returns.append(self.launch(todo, None))
        state.finish(alive)
        if self.sequential:
            returns += self.add_seeds(sweep_dir, jobs, state)
        return returns

    def add_seeds(self, sweep_dir: Path, jobs: dict[int, Any], state: Any) -> list[Any]:
        """Seeds in batches, each cell at its chosen value, until compare's sequential design has decided every
        comparison with the baseline or reached its most seeds (compare.sequential, compare.max_seeds,
        compare.seed_batch, compare.baseline, compare.detect of the runs)."""
        from archsweep.core.report import CompareError, compare
        from archsweep.core.report.render import next_seeds
        from archsweep.core.train.runs.halving import reached, results_of

        returns, before = [], None
        while True:
            try:
                report = compare([sweep_dir], sequential=True, tune=[self.tune])
            except CompareError as e:
                log.warning(f"halving: no seeds added: {e}")
                return returns
            sig = report.significance
            if sig is None:
                log.warning("halving: no seeds added: the runs name no baseline to compare with (compare.baseline)")
                return returns
            wanted = {id(c): c.test.next_seeds for c in report.cells if c.test is not None and c.test.next_seeds}
            for base in sig.baselines:
                most = max((wanted[id(c)] for c in report.cells if id(c) in wanted and sig.baseline_of(c) is base),
                           default=0)
                if most:
                    wanted[id(base)] = max(most, wanted.get(id(base), 0))
            todo = []
            for cell in report.cells:
                if id(cell) in wanted and cell.runs:
                    template = jobs[int(cell.runs[0].run_dir.name)]
                    for seed in next_seeds(cell.seed_values(), wanted[id(cell)]):
                        job = state.seed_job(template, seed)
                        jobs[job.id] = job
                        todo.append(job)
            todo = [j for j in todo if not reached(results_of(sweep_dir, j), None)]
            if not todo or [j.id for j in todo] == before:  # decided, or the same seeds again: they failed
                if todo:
                    failed = ", ".join(" ".join((*j.cell, f"seed={j.seed}")) for j in todo)
                    log.warning(f"halving: {failed} ran without results; no more seeds added")
                return returns
            before = [j.id for j in todo]
            log.info(f"halving: {len(wanted)} cells need more seeds for their comparison: {len(todo)} jobs")
            returns.append(self.launch(todo, None))


def register() -> None:
    """Make the sweeper known to Hydra. Hydra finds plugins by walking the hydra_plugins namespace, which an
    editable install of archsweep does not expose to that walk; registering the class by hand (Hydra's public way)
    works for both kinds of install. Not at import: Hydra's own walk imports this module while it sets up."""
    Plugins.instance().register(HalvingSweeper)
