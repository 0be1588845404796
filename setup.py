"""Packaging glue that pyproject.toml cannot express: the folders `src/variants` and `src/core` install as the
package `archsweep` (`archsweep.variants`, `archsweep.core...`), and `conf/` as its package data
`archsweep/conf`, found automatically so a new sub-package or config group needs no edit here."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
packages = ["archsweep", *(f"archsweep.{p}" for p in find_packages(str(ROOT / "src")))]
conf_files = [str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*.yaml")]

setup(
    packages=[*packages, "archsweep.conf"],
    package_dir={"archsweep": "src", "archsweep.conf": "conf"},
    package_data={"archsweep.conf": conf_files},
)
