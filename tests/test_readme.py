"""The README's plain-PyTorch example (section "The model library") runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_model_library_examples_run():
    section = README.read_text().split("\n## The model library\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, "README.md's model library section has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
