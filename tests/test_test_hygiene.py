"""No test reads a private attribute of another library (STYLE.md: "Never read a private attribute (`_name`) of
another library"): a scan of tests/*.py with `ast` for `x._name` (one leading underscore, not a dunder) on anything
but `self` or `cls`, `getattr(x, "_name")` and its kin, and imports of private modules (`lm_eval._cli`). Hydra's
config keys (`cfg.task._target_`, `_partial_`: an underscore at each end) are keys, not attributes. A private
attribute of our own code read by a test is listed in ALLOWED with the reason the test needs it."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ALLOWED = {  # (file, attribute): why a test reads this private attribute of archsweep's own
    ("test_hooks.py", "_classes"): "a toy FFN joins our FFN registry for one test (monkeypatch.setitem removes it "
                                   "again); the registry has no public way to take an option out",
    ("test_hooks.py", "_log_step"): "our LitModel asks Lightning's trainer whether a step logs; the test runs "
                                    "training_step without a trainer, on a log step",
}
ATTRIBUTE_CALLS = ("getattr", "setattr", "hasattr", "delattr")
IMPORT_CALLS = ("importorskip", "import_module")


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.endswith("_")


def private_module(dotted: str) -> bool:
    return any(private(part) for part in dotted.split("."))


def literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def private_reads(source: str) -> list[tuple[int, str, str]]:
    """(line, private name, the expression) of each private read in `source` (see the module docstring)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append((node.lineno, node.attr, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module and private_module(node.module):
            found.append((node.lineno, node.module, f"from {node.module} import ..."))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, f"import {a.name}") for a in node.names if private_module(a.name)]
        elif isinstance(node, ast.Call) and node.args:
            name = ast.unparse(node.func).split(".")[-1]
            if name in ATTRIBUTE_CALLS and len(node.args) > 1 and private(literal(node.args[1]) or ""):
                found.append((node.lineno, literal(node.args[1]), ast.unparse(node)))
            elif name in IMPORT_CALLS and private_module(literal(node.args[0]) or ""):
                found.append((node.lineno, literal(node.args[0]), ast.unparse(node)))
    return sorted(found)


def scan() -> list[tuple[str, int, str, str]]:
    return [(path.name, line, name, text) for path in sorted(TESTS.glob("*.py"))
            for line, name, text in private_reads(path.read_text())]


def test_no_test_reads_a_private_attribute_of_a_library():
    reads = [f"tests/{file}:{line}: {text}" for file, line, name, text in scan() if (file, name) not in ALLOWED]
    assert reads == [], "private attributes read; use the library's public API instead:\n" + "\n".join(reads)


def test_every_allowed_read_is_still_there():
    used = {(file, name) for file, _, name, _ in scan()}
    assert set(ALLOWED) <= used, f"stale entries in ALLOWED: {set(ALLOWED) - used}"


def test_the_scan_finds_private_reads_and_passes_public_ones():
    found = private_reads(
        "trainer.strategy._timeout.total_seconds()\n"
        "with_collective_timeout('ddp_spawn', 3)._start_method\n"
        "config._attn_implementation = 'sdpa'\n"
        "getattr(block, '_forward_hooks')\n"
        "cli = pytest.importorskip('lm_eval._cli')\n"
        "from torch._dynamo import config\n"
        "import transformers.models._private\n")
    assert [name for _, name, _ in found] == ["_timeout", "_start_method", "_attn_implementation", "_forward_hooks",
                                              "lm_eval._cli", "torch._dynamo", "transformers.models._private"]
    assert private_reads("self._cache\ncls._registry\ncfg.task._target_\nx.__class__\ngetattr(x, 'name')\n"
                         "import lm_eval.__main__\nfrom lightning.pytorch import Trainer\n") == []


def test_every_test_conftest_marks_by_name_exists():
    """conftest.py marks tests `slow` and `signals` by module and function name: a renamed test would silently lose
    its mark (a slow test in the quick subset, a signal test out of the loop)."""
    import conftest

    for marks in (conftest.SLOW, conftest.SIGNALS):
        for module, names in marks.items():
            assert (TESTS / module).is_file(), module
            if names == "*":
                continue
            tree = ast.parse((TESTS / module).read_text())
            defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert names <= defined, (module, names - defined)
