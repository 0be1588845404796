"""src/variants stays plain PyTorch: building and running any model imports no framework."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("lightning", "pytorch_lightning", "hydra", "omegaconf", "wandb", "torchmetrics")


def test_variants_and_builder_import_no_framework():
    code = (
        "import sys, torch\n"
        "from archsweep.core.model.build import ModelConfig, build_model\n"
        "import archsweep.variants.model, archsweep.variants.attention, archsweep.variants.cache\n"
        "m = build_model(ModelConfig(kind='decoder_only', vocab_size=10, d_model=16, n_heads=2, n_layers=1))\n"
        "m(torch.ones(1, 3, dtype=torch.long))\n"
        f"print(sorted(k for k in sys.modules if k.split('.')[0] in {FORBIDDEN!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_registries_rules_and_model_config_import_no_torch():
    """A family's package holds only its registry, so the config (and a refusal of a setting) needs no torch; the
    variants, and torch, are imported when a registry is first asked for one."""
    code = ("import sys\n"
            "import archsweep.variants.pos, archsweep.variants.norm, archsweep.variants.ffn\n"
            "import archsweep.variants.attention, archsweep.variants.model, archsweep.variants.rules\n"
            "import archsweep.core.model.config\n"
            "print('torch' in sys.modules)\n"
            "from archsweep.variants.pos import POS\n"
            "POS.names()\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_variant_sources_do_not_mention_framework_imports():
    for path in (ROOT / "src" / "variants").rglob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")):
                assert stripped.split()[1].split(".")[0] not in FORBIDDEN, f"{path}: {stripped}"


WINGS = ["model", "data", "eval", "train", "report"]  # each may import the wings before it, never after


def module_name(path: Path) -> str:
    parts = list(path.with_suffix("").relative_to(ROOT / "src").parts)
    return ".".join(["archsweep", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def import_graph() -> dict[str, set[str]]:
    """Module -> the archsweep modules it imports (at the top or inside functions), read from the sources."""
    modules = {module_name(p): p for p in (ROOT / "src").rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("archsweep"):
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("archsweep")}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "core" else parts[1] if len(parts) > 1 else None


def test_core_has_five_wings_each_saying_what_it_owns():
    wings = sorted(p.name for p in (ROOT / "src" / "core").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert wings == sorted(WINGS)
    assert not [p.name for p in (ROOT / "src" / "core").glob("*.py") if p.name != "__init__.py"]
    for name in WINGS:
        doc = ast.get_docstring(ast.parse((ROOT / "src" / "core" / name / "__init__.py").read_text()))
        assert doc and "wing" in doc.split("\n")[0].lower() and "import" in doc.lower(), name


def test_wings_import_one_way():
    order = {"variants": -1, **{w: i for i, w in enumerate(WINGS)}}
    wrong = []
    for module, deps in import_graph().items():
        here = wing(module)
        if here not in order:
            continue
        for dep in deps:
            there = wing(dep)
            if there == "core" or (there in order and order[there] > order[here]):
                wrong.append(f"{module} imports {dep}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    graph = import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [module, dep] if dep in path else [module, dep]
            if dep not in state and (cycle := visit(dep, path + [module])):
                return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [])
            assert cycle is None, " -> ".join(cycle)


def top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (definitions, assignments, imports), where a static reader finds them."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_every_import_names_the_module_that_defines_it():
    """No module `__getattr__` hands out names at run time: each `from archsweep.<module> import name` finds `name`
    bound in that module's source (or a submodule of that name), so editors and type checkers can follow it."""
    modules = {module_name(p): p for p in (ROOT / "src").rglob("*.py")}
    defined = {name: top_level_names(ast.parse(path.read_text())) for name, path in modules.items()}
    assert not [m for m, names in defined.items() if "__getattr__" in names]
    users = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py"),
             *ROOT.glob("*.py")]
    unresolved = []
    for path in users:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                unresolved += [f"{path.relative_to(ROOT)}:{node.lineno} from {node.module} import {a.name}"
                               for a in node.names if a.name not in defined[node.module]
                               and f"{node.module}.{a.name}" not in modules]
    assert not unresolved, "\n".join(unresolved)
