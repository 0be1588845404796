"""Packaging glue that pyproject.toml cannot express: the folders `src/variants` and `src/core` install as the
package `archsweep` (`archsweep.variants`, `archsweep.core...`), and `conf/` as its package data
`archsweep/conf`, found automatically so a new sub-package or config group needs no edit here. `src/hydra_plugins`
installs into Hydra's plugin namespace `hydra_plugins` (Hydra instantiates sweepers only from there)."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
PLUGINS = "hydra_plugins"  # a namespace package shared with Hydra's other plugins: no __init__.py of ours
packages = ["archsweep", *(f"archsweep.{p}" for p in find_packages(str(ROOT / "src"), exclude=[f"{PLUGINS}*"]))]
plugins = [f"{PLUGINS}.{p}" for p in find_packages(str(ROOT / "src" / PLUGINS))]
# every folder of conf/ is listed as a (data-only) package: setuptools warns, once per folder, about a folder inside
# a package that it would otherwise have to guess about
conf_dirs = sorted(p for p in (ROOT / "conf").rglob("*") if p.is_dir())
conf_dirs = [".".join(p.relative_to(ROOT / "conf").parts) for p in conf_dirs]
conf_packages = ["archsweep.conf", *(f"archsweep.conf.{d}" for d in conf_dirs)]

setup(
    packages=[*packages, *conf_packages, *plugins],
    package_dir={"archsweep": "src", "archsweep.conf": "conf",
                 **{p: f"src/{p.replace('.', '/')}" for p in plugins}},
    package_data={p: ["*.yaml"] for p in conf_packages},
)
