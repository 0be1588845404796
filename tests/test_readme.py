"""README.md and docs/*.md stay true: every relative link resolves (files and #anchors), each table of contents lists
its page's sections, the README stays short, every ```python example runs as written, every ```py example compiles
and its imports resolve, and every command (```bash blocks, `$ ` lines of ```console blocks, inline `python ...`
spans) is checked the cheap way its program allows: train.py, generate.py and evaluate.py overrides are composed
by Hydra (what `--cfg job` prints, without training; each value of a sweep once), compare.py and the fetch command
parse their arguments, a benchmark's flags exist in its script, and the set-up and test commands are the ones
.ci/run runs. A command no test can check (uploading to W&B, setting a variable) is listed in NOT_CHECKED."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import ConfigCompositionException

from archsweep.cli import compare_args, coordcheck_args, task_overrides_without_plus
from archsweep.core.data.fetch import CORPORA

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
CONF = ROOT / "conf"
README_MAX_LINES = 420
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", flags=re.DOTALL | re.MULTILINE)
ENTRY_CONFIGS = {"train.py": "train", "generate.py": "generate", "evaluate.py": "evaluate"}
NOT_CHECKED = {  # program (first word) -> why no test runs it; these are run by hand when the text changes
    "wandb": "uploads to or logs in to W&B: needs credentials and a network",
    "export": "sets an environment variable of the reader's shell",
    "tensorboard": "starts a web server",
}


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def fenced(page: Path, *langs: str) -> list[str]:
    return [body for lang, body in FENCE.findall(page.read_text()) if lang in langs]


def prose(text: str) -> str:
    """The text outside fenced blocks (links, headings and inline code inside them are not the page's own)."""
    return FENCE.sub("", text)


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")


def headings(page: Path) -> list[tuple[int, str]]:
    found = re.findall(r"^(#{1,4}) (.+)$", prose(page.read_text()), flags=re.MULTILINE)
    return [(len(level), title) for level, title in found]


def anchors(page: Path) -> set[str]:
    return {anchor(title) for _, title in headings(page)}


# ---------------------------------------------------------------------------------------------------- structure


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail into docs/ (at most {README_MAX_LINES})"


def test_every_docs_page_is_linked_from_the_readme():
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", prose(README.read_text())))
    missing = [page_id(p) for p in PAGES[1:] if page_id(p) not in linked]
    assert not missing, f"README.md links to no {missing}; add them to its 'where to go next'"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_resolve(page):
    text = re.sub(r"`[^`\n]*`", "", prose(page.read_text()))  # inline code is not a link
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL: not checked here (no network)
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT) if linked.is_relative_to(ROOT) else linked}")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading with anchor #{fragment} in {page_id(linked)}")
    assert not broken, f"{page_id(page)}: broken links:\n" + "\n".join(broken)


def test_every_docs_page_the_code_names_exists():
    """Docstrings, comments and messages point readers at docs/<page>.md (and #anchors); a renamed or folded page
    must not leave them pointing nowhere (four files named a comparing page after it was folded into training.md)."""
    sources = [p for d in ("src", "tests", "bench", "conf") for p in sorted((ROOT / d).rglob("*"))
               if p.suffix in (".py", ".yaml")] + sorted(ROOT.glob("*.py")) + [ROOT / "pyproject.toml"]
    broken = []
    for source in sources:
        for path, fragment in re.findall(r"\bdocs/([A-Za-z0-9_.-]+\.md)(?:#([a-z0-9-]+))?", source.read_text()):
            page = ROOT / "docs" / path
            if not page.exists():
                broken.append(f"{source.relative_to(ROOT)}: docs/{path} does not exist")
            elif fragment and fragment not in anchors(page):
                broken.append(f"{source.relative_to(ROOT)}: docs/{path} has no heading with anchor #{fragment}")
    assert not broken, "\n".join(broken)


def test_every_figure_in_docs_is_shown_by_a_page():
    shown = {(page.parent / target).resolve() for page in PAGES
             for target in re.findall(r"!\[[^\]]*\]\(([^)\s#]+)\)", prose(page.read_text()))}
    unused = [p.name for p in sorted((ROOT / "docs").glob("*.png")) if p.resolve() not in shown]
    assert not unused, f"figures in docs/ that no page shows: {unused}"


PAGES_WITH_TOC = [p for p in PAGES if "<!-- toc -->" in p.read_text()]


def test_long_pages_have_a_table_of_contents():
    long = [page_id(p) for p in PAGES if len(p.read_text().splitlines()) > 150 and p not in PAGES_WITH_TOC]
    assert not long, f"pages over 150 lines need a table of contents (<!-- toc --> ... <!-- /toc -->): {long}"


@pytest.mark.parametrize("page", PAGES_WITH_TOC, ids=page_id)
def test_table_of_contents_links_to_headings_and_lists_every_section(page):
    text = page.read_text()
    toc = text.split("<!-- toc -->", 1)[1].split("<!-- /toc -->", 1)[0]
    titles = re.findall(r"^(##|###) (.+)$", prose(text.split("<!-- /toc -->", 1)[1]), flags=re.MULTILINE)
    links = re.findall(r"\]\(#([^)]+)\)", toc)
    assert links, f"{page_id(page)}: empty table of contents"
    stale = [a for a in links if a not in {anchor(t) for _, t in titles}]
    assert not stale, f"{page_id(page)}: the table of contents links to no heading: {stale}"
    missing = [f"- [{t.replace('`', '')}](#{anchor(t)})" for level, t in titles
               if level == "##" and anchor(t) not in links]
    assert not missing, f"add to {page_id(page)}'s table of contents:\n" + "\n".join(missing)


# ---------------------------------------------------------------------------------------------------- examples


PYTHON_EXAMPLES = [(p, i, b) for p in PAGES for i, b in enumerate(fenced(p, "python"))]
SHOWN_EXAMPLES = [(p, i, b) for p in PAGES for i, b in enumerate(fenced(p, "py"))]


def test_the_readme_has_a_running_example():
    assert fenced(README, "python"), "README.md's model library section has no ```python example"


@pytest.mark.parametrize("page, index, block", PYTHON_EXAMPLES,
                         ids=[f"{page_id(p)}-{i}" for p, i, _ in PYTHON_EXAMPLES])
def test_python_examples_run(page, index, block):
    exec(compile(block, f"{page_id(page)} (```python block {index})", "exec"), {})


@pytest.mark.parametrize("page, index, block", SHOWN_EXAMPLES,
                         ids=[f"{page_id(p)}-{i}" for p, i, _ in SHOWN_EXAMPLES])
def test_shown_examples_compile_and_their_imports_resolve(page, index, block):
    """A ```py block needs what a run writes (a checkpoint, a model) or would register a variant for the whole test
    session, so it is not run; it must still be valid Python whose imports exist."""
    tree = ast.parse(block, filename=f"{page_id(page)} (```py block {index})")
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports, f"{page_id(page)}: ```py block {index} imports nothing from the package; show where it comes from"
    exec(compile(ast.Module(body=imports, type_ignores=[]), page_id(page), "exec"), {})


# ---------------------------------------------------------------------------------------------------- commands


def commands(page: Path) -> list[str]:
    """The page's commands: lines of ```bash blocks (continuations joined), `$ ` lines of ```console blocks, and
    inline code spans in the prose that start with `python `, or with `... ` and an override (the rest of a sweep's
    command line, as in the launcher table; `... is in use` quotes a message)."""
    found = []
    for body in fenced(page, "bash"):
        found += [c for c in body.replace("\\\n", " ").splitlines() if c.strip() and not c.startswith("#")]
    for body in fenced(page, "console"):
        found += [line[2:] for line in body.splitlines() if line.startswith("$ ")]
    inline = re.findall(r"`((?:python|\.\.\.(?= [^ `]+=)) [^`]+)`", prose(page.read_text()))
    spans = [" ".join(span.split()) for span in inline]
    return found + [re.sub(r"^\.\.\. ", "python train.py -m ", span) for span in spans]  # `... a=b`: a sweep's rest


COMMANDS = sorted({(page_id(p), c) for p in PAGES for c in commands(p)})


def words(command: str) -> list[str]:
    """Shell words with placeholders filled: `<time>` or `<sweep>` becomes `x`, a placeholder of several words
    (`<same overrides>`) and `...` (more overrides) are dropped."""
    command = re.sub(r"<[^<>]* [^<>]*>", " ", command)
    return [w for w in shlex.split(re.sub(r"<[^<> ]*>", "x", command), comments=True) if w != "..."]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def one_value_each(overrides: list[str]) -> list[list[str]]:
    """Sweep overrides (`norm=pre,post`, `seed=0,1,2`, `pos=glob(*)`) as plain overrides: every value of every
    sweep once, the other sweeps at their first value (not the product)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    values = []
    for o in parsed:
        if not o.is_sweep_override():
            values.append([o.input_line])
            continue
        if o.value_type == ValueType.GLOB_CHOICE_SWEEP:
            choices = o.value().filter(options(o.key_or_group))
        else:
            choices = list(o.sweep_string_iterator())
        prefix = {"ADD": "+", "FORCE_ADD": "++", "DEL": "~"}.get(o.type.name, "")
        values.append([f"{prefix}{o.key_or_group}={v}" for v in choices])
    firsts = [v[0] for v in values]
    runs = [firsts]
    for i, vs in enumerate(values):
        runs += [firsts[:i] + [v] + firsts[i + 1:] for v in vs[1:]]
    return runs


def example_options(folder: Path) -> str:
    """The docs' example variant yamls (```yaml blocks starting `# @package model.<axis>`) written as options of a
    config folder, `<axis>/<module>.yaml`, so a command that uses the example composes; the searchpath override."""
    for page in PAGES:
        for block in fenced(page, "yaml"):
            package = re.match(r"# @package model\.(\w+)\n", block)
            target = re.search(r"^_target_: [\w.]*?(\w+)\.\w+$", block, flags=re.MULTILINE)
            if package and target:
                (folder / package[1]).mkdir(parents=True, exist_ok=True)
                (folder / package[1] / f"{target[1]}.yaml").write_text(block)
    return f"hydra.searchpath=[file://{folder}]"


def compose_entry(config: str, overrides: list[str]) -> None:
    """What `python <entry>.py <overrides> --cfg job` checks: the overrides compose (groups, options, keys, types)."""
    searched = [o for o in overrides if o.startswith("hydra.sweeper.params.")]
    overrides = [o for o in overrides if o not in searched]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for run in one_value_each(overrides):
            cfg = compose(config, overrides=run, return_hydra_config=True)
            for o in searched:  # an Optuna search space entry: its key must be a key of the config it tunes
                key = o.split("=", 1)[0].removeprefix("hydra.sweeper.params.")
                assert key in cfg.hydra.sweeper.params, f"{o}: {key} is not in hparams_search's search space"


def check_python(args: list[str], extra: str) -> None:
    if args[0] == "-X":  # an interpreter option and its value (`-X importtime`)
        args = args[2:]
    if args[0] == "-c":
        compile(args[1], "python -c", "exec")
    elif args[0] in ENTRY_CONFIGS:
        flags = ("-m", "--multirun", "--help", "--cfg")  # `--cfg job` prints the config: its value goes too
        overrides = [a for before, a in zip(args, args[1:], strict=False) if a not in flags and before != "--cfg"]
        if args[0] == "evaluate.py":
            overrides = task_overrides_without_plus(overrides)
        compose_entry(ENTRY_CONFIGS[args[0]], overrides + [extra] * (args[0] == "train.py"))
    elif args[0] == "compare.py":
        compare_args(args[1:])  # argparse exits on an unknown flag or a bad choice
    elif args[:2] == ["-m", "archsweep.core.data.fetch"]:
        rest = args[2:]
        flags = {rest[i]: rest[i + 1] for i, a in enumerate(rest) if a.startswith("--")}
        assert set(flags) <= {"--dir", "--timeout"}, f"fetch takes --dir and --timeout, not {set(flags)}"
        corpora = [a for a in rest if a not in flags and a not in flags.values()]
        assert corpora and set(corpora) <= set(CORPORA), f"fetch knows {sorted(CORPORA)}, not {corpora}"
        float(flags.get("--timeout", 0))
    elif args[:2] == ["-m", "pytest"]:
        if "-m" in args[2:]:
            marker = args[args.index("-m", 2) + 1].removeprefix("not ").strip()
            assert f'"{marker}:' in (ROOT / "pyproject.toml").read_text(), f"no pytest marker {marker!r}"
    elif args[0].startswith("bench/"):
        script = ROOT / args[0]
        assert script.exists(), f"no benchmark {args[0]}"
        source = script.read_text()
        unknown = [a for a in args[1:] if a.startswith("--") and f'"{a.split("=")[0]}"' not in source]
        assert not unknown, f"{args[0]} takes no {unknown}"
        overrides = [a for a in args[1:] if "=" in a and not a.startswith("-")]
        if overrides:  # --mfu-check's config
            compose_entry("train", overrides)
    elif args[:2] == ["-m", "archsweep.core.data.prepare"]:
        check_prepare(args[2:])
    elif args[:2] == ["-m", "archsweep.core.eval.export"]:
        check_export(args[2:])
    elif args[0] == "-m" and args[1] == "venv":
        assert "python3 -m venv .venv" in (ROOT / ".ci/run").read_text()
    else:
        raise AssertionError(f"no check for `python {' '.join(args)}`; add one to tests/test_readme.py")


def check_prepare(args: list[str]) -> None:
    """archsweep-prepare's own parser takes the arguments (it exits on an unknown flag or a bad choice); a command
    shown without arguments is the module's entry point, named as such."""
    from archsweep.core.data.prepare import parse_args

    if args:
        parse_args(args)


def check_export(args: list[str]) -> None:
    """archsweep-export's own reader takes the arguments (ckpt= and out=, nothing else)."""
    from archsweep.core.eval.export import parse

    parse(args)


def check_lm_eval(args: list[str]) -> None:
    """lm-eval's own parser takes the arguments (it exits on an unknown flag); the model is ours or its HF one."""
    cli = pytest.importorskip("lm_eval.__main__")  # the module of lm-eval's console script
    import sys

    argv, sys.argv = sys.argv, ["archsweep-lm-eval", *args]
    try:
        parsed = cli.HarnessCLI().parse_args()
    finally:
        sys.argv = argv
    assert parsed.model in ("archsweep", "hf"), f"--model {parsed.model}: the docs show archsweep or hf"


def check_pip(args: list[str]) -> None:
    assert args[0] == "install"
    ci = [shlex.split(line) for line in (ROOT / ".ci/run").read_text().splitlines() if line.startswith("pip install")]
    if args[1:] in [[w for w in c[2:] if w != "-q"] for c in ci]:
        return  # the set-up command, exactly what CI runs
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in re.findall(r"\.\[(\w+)\]", " ".join(args)):
        assert re.search(rf"^{extra} = \[", pyproject, flags=re.MULTILINE), f"pyproject.toml has no extra {extra}"
    assert any(a.startswith(("-e", ".")) for a in args) or "--no-deps" in args, f"pip install {args}: unchecked"


def check_command(command: str, folder: Path) -> None:
    for part in re.split(r"\s*&&\s*", command):
        args = words(part)
        if not args:
            continue
        if args[0] == "timeout":  # `timeout <seconds> <command>`: a time limit on a command that is checked as such
            float(args[1].rstrip("smh"))
            args = args[2:]
        program, args = args[0], args[1:]
        if program in NOT_CHECKED:
            continue
        if program in ("python", "python3"):
            check_python(args, example_options(folder))
        elif program == "torchrun":  # torchrun's own --flags, then the script and its arguments, as python takes them
            script = next(i for i, a in enumerate(args) if not a.startswith("-"))
            check_python(args[script:], example_options(folder))
        elif program == "pip":
            check_pip(args)
        elif program == "archsweep-prepare":
            check_prepare(args)
        elif program == "archsweep-export":
            check_export(args)
        elif program == "archsweep-lm-eval":
            check_lm_eval(args)
        elif program == "archsweep-coordcheck":  # its parser takes the flags; the overrides compose as train.py's
            compose_entry("train", coordcheck_args(args).overrides)
        elif program == ".":
            assert args == [".venv/bin/activate"] and ". .venv/bin/activate" in (ROOT / ".ci/run").read_text()
        else:
            raise AssertionError(f"no check for `{part}`; add one to tests/test_readme.py or to NOT_CHECKED")


def test_the_readme_sets_up_runs_and_tests_as_ci_does():
    ci = (ROOT / ".ci/run").read_text()
    readme = [c for p, c in COMMANDS if p == "README.md"]
    setup = 'pip install torch==2.13.0 -e ".[test]" && pip install --no-deps torchscale==0.3.0 fairscale==0.4.0'
    assert setup in readme, "the README's second set-up command is CI's two pip lines"
    assert all(f"pip install -q {part.removeprefix('pip install ')}" in ci for part in setup.split(" && "))
    assert "python -m pytest -q -n auto" in [c.split("#")[0].strip() for c in readme] and ci.rstrip().endswith(
        "python -m pytest -q -n auto")
    assert any(c.split("#")[0].strip() == "python train.py" for c in readme)


@pytest.mark.parametrize("page, command", COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_command_composes_or_parses(page, command, tmp_path):
    check_command(command, tmp_path)


@pytest.mark.parametrize("wrong, error, match", [
    ("python train.py norm=prenorm", ConfigCompositionException, "prenorm"),
    ("python train.py -m model.d_modle=64,128", ConfigCompositionException, "d_modle"),
    ("python evaluate.py ckpt=x splitz=[val]", ConfigCompositionException, "splitz"),
    ("python compare.py x --sorted val/loss", SystemExit, None),
    ("python bench/decode.py --rounds-of 9", AssertionError, "--rounds-of"),
    ("python -m archsweep.core.data.fetch wikitext", AssertionError, "wikitext"),
    ("pip install -e '.[docs]'", AssertionError, "no extra docs"),
    ("make install", AssertionError, "no check"),
])
def test_a_wrong_command_is_refused(wrong, error, match, tmp_path):
    """The command check can fail: a wrong option, key, flag or program is refused."""
    with pytest.raises(error, match=match):
        check_command(wrong, tmp_path)
