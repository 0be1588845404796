"""The train wing's rooms (src/core/train/*/): imports between them run the way its docstring says, no folder
grows past about 15 modules, no function past 60 lines, and the module paths of the flat layout before the rooms
(named by old checkpoints, saved overrides and one's own yaml files) still lead to the code."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from archsweep.core.model.legacy import MODULES, module_path
from archsweep.core.train.lifecycle.checks import current_targets

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "src" / "core" / "train"
# room -> the rooms it may import (src/core/train/__init__.py); lifecycle may import them all
MAY_IMPORT = {"config": set(), "launch": set(), "optimisers": {"config"}, "lit": {"config", "launch", "optimisers"},
              "monitoring": {"config", "launch"}, "runs": {"config", "launch", "monitoring"},
              "lifecycle": {"config", "launch", "optimisers", "lit", "monitoring", "runs"}}
FORMER = [m for m in MODULES if m.startswith("archsweep.core.train.")]


def room(path: Path) -> str:
    return path.relative_to(TRAIN).parts[0].removesuffix(".py")


def test_rooms_import_one_way():
    wrong = []
    for path in TRAIN.rglob("*.py"):
        if path.parent == TRAIN and path.name == "__init__.py":
            continue
        here = room(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("archsweep.core.train."):
                there = node.module.split(".")[3]
                if there != here and there not in MAY_IMPORT[here]:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
    assert not wrong, "\n".join(wrong)
    assert set(MAY_IMPORT) == {room(p) for p in TRAIN.iterdir() if p.name not in ("__init__.py", "__pycache__")}


def test_each_room_says_what_it_owns_and_may_import():
    for folder in (p for p in TRAIN.iterdir() if p.is_dir() and p.name != "__pycache__"):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc and "Imports" in doc, folder.name


def test_no_folder_is_crowded_and_no_function_is_long():
    src = ROOT / "src"
    for folder in [src, *(p for p in src.rglob("*") if p.is_dir() and p.name != "__pycache__")]:  # all of src/
        assert len([p for p in folder.glob("*.py") if p.name != "__init__.py"]) <= 15, folder
    long = []
    for path in TRAIN.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not long, "\n".join(long)


@pytest.mark.parametrize("former", FORMER)
def test_a_former_module_path_leads_to_the_module_now(former):
    now = module_path(former)
    assert now != former
    importlib.import_module(now)
    assert module_path(now) == now  # today's paths pass through


def test_every_module_of_the_flat_layout_is_mapped():
    flat = {"branches", "callback_group", "callbacks", "compute", "console", "decode_callback",
            "diagnostic_callbacks", "diagnostics", "fit", "image_callbacks", "job", "loggers", "memory",
            "metrics_csv", "muon", "optim", "results", "resume", "rules", "rundir", "runinfo", "schemas", "setup",
            "shard", "submitit_job", "summary", "sweep", "torchrun", "wsd"}
    assert {m.rsplit(".", 1)[1] for m in FORMER} == flat
    assert module_path("src.core.fit.train") == "archsweep.core.train.lifecycle.fit.train"
    assert module_path("src.core.lit.LitModel") == "archsweep.core.train.lit.LitModel"


def test_a_config_naming_former_targets_is_read_with_todays():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["optim._target_=archsweep.core.train.optim.adamw",
                                          "schedule._target_=archsweep.core.train.optim.noam", "logger=tensorboard",
                                          "logger._target_=archsweep.core.train.loggers.tensorboard_logger"])
    current_targets(cfg)
    assert cfg.optim._target_ == "archsweep.core.train.optimisers.optim.adamw"
    assert cfg.schedule._target_ == "archsweep.core.train.optimisers.optim.noam"
    assert cfg.logger._target_ == "archsweep.core.train.monitoring.loggers.tensorboard_logger"
    assert OmegaConf.select(cfg, "task._target_").startswith("archsweep.core.data.tasks.")  # today's: unchanged
