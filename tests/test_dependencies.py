"""Every third-party import is declared in pyproject.toml, with a lower bound the installed version meets.

The sources are read with `ast` (every `import` and `from ... import`, at the top or inside a function), so an
import that only an optional path runs is checked too. src/ and the root scripts may use `[project] dependencies`,
plus the extras named in SRC_EXTRAS for the modules named there; tests/ may use the dependencies and the `test`
extra, plus the few imports in TEST_UNDECLARED, each behind a skip or a branch for its absence.
"""

from __future__ import annotations

import ast
import functools
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest itself depends on tomli there, so it is installed
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("train.py", "generate.py", "evaluate.py", "compare.py")

# import name -> (the extra that declares it, the only src files that may import it)
SRC_EXTRAS = {
    "lm_eval": ("eval", {"src/core/eval/harness.py"}),  # archsweep-lm-eval
    "tiktoken": ("tiktoken", {"src/core/data/prepare.py"}),  # archsweep-prepare --tokenizer tiktoken:<encoding>
}
# import name -> the test files that import it without its being declared, and why that is right
TEST_UNDECLARED = {
    "torchscale": ({"tests/test_deepnorm_reference.py"}, "skips without it; it pins old fairscale and timm"),
    "timm": ({"tests/test_deepnorm_reference.py"}, "torchscale's; a stand-in module is used when it is missing"),
    "tiktoken": ({"tests/test_prepare.py"}, "the test checks prepare's message when it is missing"),
    "tomli": ({"tests/test_dependencies.py"}, "tomllib's stand-in on Python 3.10, where pytest depends on it"),
}
# the tests use transformers 5 APIs: Mixtral's and DeepSeek-V3's fused `experts.gate_up_proj`, `rope_parameters=`
# in Llama and DeepSeek-V3 configs; 4.57.6, the last 4.x release, has neither (see pyproject's comment)
LAST_TRANSFORMERS_4 = Version("4.57.6")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements() -> dict[str, list[Requirement]]:
    """"dependencies" and each extra -> its requirements."""
    project = pyproject()["project"]
    groups = {"dependencies": project["dependencies"], **project["optional-dependencies"]}
    return {group: [Requirement(r) for r in reqs] for group, reqs in groups.items()}


def declared(*groups: str) -> set[str]:
    reqs = requirements()
    return {canonicalize_name(r.name) for g in groups for r in reqs.get(g, [])}


def third_party_imports(paths: list[Path], local: set[str]) -> dict[str, set[str]]:
    """Top-level module name -> the files (relative to the repository) that import it."""
    found: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names}:
                if top not in sys.stdlib_module_names and top not in local:
                    found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


@functools.cache
def import_names() -> dict[str, list[str]]:
    return packages_distributions()  # reads every installed distribution's file list: once


def distributions(module: str) -> set[str]:
    return {canonicalize_name(d) for d in import_names().get(module, [])}


def undeclared(found: dict[str, set[str]], allowed: set[str]) -> list[str]:
    return [f"{module} (distribution {', '.join(sorted(distributions(module))) or 'not installed'}), imported by "
            f"{', '.join(sorted(files))}" for module, files in sorted(found.items())
            if not distributions(module) & allowed]


def test_src_imports_only_declared_dependencies():
    paths = [*(ROOT / "src").rglob("*.py"), *(ROOT / s for s in SCRIPTS)]
    found = third_party_imports(paths, local={"archsweep"})
    wrong = undeclared({m: f for m, f in found.items() if m not in SRC_EXTRAS}, declared("dependencies"))
    for module, (extra, allowed_files) in SRC_EXTRAS.items():
        if outside := found.get(module, set()) - allowed_files:
            wrong.append(f"{module} (the {extra!r} extra's), imported by {', '.join(sorted(outside))}, outside "
                         f"{', '.join(sorted(allowed_files))}: declare it in dependencies or extend SRC_EXTRAS")
        if module in found and canonicalize_name(module) not in declared(extra):
            wrong.append(f"{module} is not declared in the {extra!r} extra")
    assert not wrong, "undeclared in pyproject.toml [project] dependencies:\n" + "\n".join(wrong)


def test_tests_import_only_dependencies_and_the_test_extra():
    paths = sorted((ROOT / "tests").rglob("*.py"))
    local = {"archsweep", "tests", *(p.stem for p in paths)}  # tests import their helper modules by name
    found = third_party_imports(paths, local)
    wrong = undeclared({m: f for m, f in found.items() if m not in TEST_UNDECLARED},
                       declared("dependencies", "test"))
    for module, (allowed_files, _why) in TEST_UNDECLARED.items():
        if outside := found.get(module, set()) - allowed_files:
            wrong.append(f"{module}, undeclared, imported by {', '.join(sorted(outside))}")
    assert not wrong, "undeclared in pyproject.toml dependencies or the test extra:\n" + "\n".join(wrong)


def test_every_requirement_has_a_lower_bound_the_installed_version_meets():
    wrong, missing = [], []
    for group, reqs in requirements().items():
        for req in reqs:
            if not any(s.operator in (">=", "==", "~=") for s in req.specifier):
                wrong.append(f"{group}: {req} has no lower bound")
                continue
            try:
                installed = version(req.name)
            except PackageNotFoundError:
                if group in ("dependencies", "test"):
                    missing.append(f"{group}: {req} is not installed")
                continue  # another extra that this environment did not install
            if not req.specifier.contains(installed, prereleases=True):
                wrong.append(f"{group}: {req}, but {installed} is installed: raise the bound or the install")
    assert not wrong + missing, "\n".join(wrong + missing)


def test_the_test_extra_asks_for_the_transformers_major_its_tests_use():
    (spec,) = [r.specifier for r in requirements()["test"] if canonicalize_name(r.name) == "transformers"]
    assert not spec.contains(LAST_TRANSFORMERS_4), f"test extra: transformers{spec} admits 4.x"
    assert Version(version("transformers")).major >= 5  # the test extra is installed where the tests run


def test_the_check_names_the_module_and_the_file():
    found = third_party_imports([ROOT / "tests" / "test_dependencies.py"], local={"archsweep"})
    assert found["packaging"] == {"tests/test_dependencies.py"}
    message = undeclared({"packaging": found["packaging"]}, allowed=set())
    assert message == ["packaging (distribution packaging), imported by tests/test_dependencies.py"]
