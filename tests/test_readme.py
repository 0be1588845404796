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


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")


def test_table_of_contents_links_to_headings_and_lists_every_top_level_section():
    text = README.read_text()
    toc = text.split("<!-- toc -->", 1)[1].split("<!-- /toc -->", 1)[0]
    body = re.sub(r"```.*?```", "", text.split("<!-- /toc -->", 1)[1], flags=re.DOTALL)
    headings = re.findall(r"^(##|###) (.+)$", body, flags=re.MULTILINE)
    anchors = {anchor(title) for _, title in headings}
    links = re.findall(r"\]\(#([^)]+)\)", toc)
    assert links and not [a for a in links if a not in anchors]
    missing = [f"- [{t.replace('`', '')}](#{anchor(t)})" for level, t in headings
               if level == "##" and anchor(t) not in links]
    assert not missing, "add to the README's table of contents:\n" + "\n".join(missing)  # every section listed
