"""Hydra's composition errors as one line naming the argument that caused them.

Hydra's own message for `norm=prex` lists the options but not which argument gave the value; for a sweep
(`-m norm=pre,pst`) it comes after a sweep directory was made; for a misspelt key (`model.d_modle=3`) it suggests
`+model.d_modle=3`, which adds a key nothing reads. The entry points compose the config once with Hydra's compose API
before Hydra's main runs (about 0.1 s a composition; a sweep adds one for each further value of a swept setting,
at most `MAX_EXTRA`), and reword what fails: the argument, a did-you-mean (difflib) and Hydra's list of the valid
options or settings. The first composition is also asked for the mandatory values (`???`) left unset. Hydra's own
overrides (`hydra.*`, `hydra/...`) are left to Hydra, but for `hydra.searchpath`, which adds config folders.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

SEARCHPATH = "hydra.searchpath"  # more config folders: the one Hydra setting the composition needs
MAX_EXTRA = 12  # compositions for a sweep's further values; the rest are Hydra's to check when the job starts
NOT_CHECKED = ("--help", "-h", "--hydra-help", "--version", "--info", "-i", "--shell-completion", "-sc",
               "--config-path", "-cp", "--config-dir", "-cd", "--config-name", "-cn", "--experimental-rerun")


def near(value: str, valid: list[str]) -> str:
    """The did-you-mean: the one option that begins the value or that the value begins (`prenorm`: pre), else the
    closest by difflib (`sandwch`: sandwich)."""
    prefix = [v for v in valid if min(len(v), len(value)) >= 2 and (value.startswith(v) or v.startswith(value))]
    close = prefix if len(prefix) == 1 else difflib.get_close_matches(value, valid, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def parsed(args: list[str]) -> list[tuple[str, Override]]:
    """(argument, override) for each argument Hydra's grammar reads, Hydra's own settings left out."""
    parser, out = OverridesParser.create(), []
    for arg in args:
        try:
            override = parser.parse_overrides([arg])[0]
        except HydraException:
            continue  # the argument check (cli.check_overrides) names these
        if override.key_or_group.split("/")[0].split(".")[0] != "hydra" or override.key_or_group == SEARCHPATH:
            out.append((arg, override))
    return out


def values(arg: str, override: Override) -> list[str] | None:
    """The overrides one argument stands for: itself, or `key=value` for each value of a sweep; None for a sweep
    whose values cannot be listed (an Optuna interval)."""
    if not override.is_sweep_override():
        return [arg]
    try:
        return [f"{override.get_key_element()}={v}" for v in override.sweep_string_iterator()]
    except HydraException:
        return None


def combinations(args: list[tuple[str, list[str]]]) -> Iterator[list[tuple[str, str]]]:
    """The first value of every argument together, then each further value of a sweep with the others at their
    first: (the argument typed, the override composed) pairs."""
    first = [(arg, vals[0]) for arg, vals in args]
    yield first
    extra = 0
    for i, (arg, vals) in enumerate(args):
        for value in vals[1:]:
            if extra == MAX_EXTRA:
                return
            extra += 1
            yield [*first[:i], (arg, value), *first[i + 1:]]


def composition_error(args: list[str], config_dir: str, config_name: str,
                      missing: Callable[[DictConfig, dict[str, str], set[str]], str | None] | None = None
                      ) -> str | None:
    """One line for the first composition of `args` (override arguments, no flags) that Hydra refuses, or, from
    `missing`, for the mandatory values (`???`) the first leaves unset (`experiment=rope_scaling` without
    `init_from` would train from scratch); None when every one composes."""
    checked = [(arg, vals) for arg, o in parsed(args) if (vals := values(arg, o)) is not None]
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        for pairs in combinations(checked):
            try:
                cfg = compose(config_name, overrides=[o for _, o in pairs], return_hydra_config=missing is not None)
            except (HydraException, OmegaConfBaseException) as e:
                return reword(e, pairs, config_name)
            if missing is not None and (problem := missing(*job_config(cfg))):
                return problem
            missing = None  # the first composition's: the others set the same settings
    return None


def job_config(cfg: DictConfig) -> tuple[DictConfig, dict[str, str], set[str]]:
    """(the job's config, the option chosen in each group, the settings a sweeper sets: `hydra.sweeper.params`, as
    a preset's grid or Optuna search) of a composition made with Hydra's config."""
    choices = {str(k): str(v) for k, v in (OmegaConf.select(cfg, "hydra.runtime.choices") or {}).items()
               if v is not None and not str(k).startswith("hydra")}
    swept = {str(k) for k in (OmegaConf.select(cfg, "hydra.sweeper.params") or {})}
    return OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), choices, swept


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~").split("@")[0]


def argument_for(key: str, pairs: list[tuple[str, str]]) -> str:
    """The argument the user typed for `key` (a whole sweep where the value came from one)."""
    return next((arg for arg, o in pairs if key_of(o) == key), key)


def reword(error: Exception, pairs: list[tuple[str, str]], config_name: str) -> str:
    cause = error.__cause__
    if isinstance(error, MissingConfigException) and error.missing_cfg_file and "/" in error.missing_cfg_file:
        group, option = error.missing_cfg_file.rsplit("/", 1)
        options = sorted(error.options or [])
        return (f"{argument_for(group, pairs)}: {group} has no option {option!r}{near(option, options)}; the options "
                f"of {group}: {', '.join(options)}")
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:
        return unknown_key(cause.full_key, pairs, config_name)
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        return f"{argument_for(cause.full_key, pairs)}: {str(cause.msg).splitlines()[0]}"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()][:3]
    named = next((arg for arg, o in pairs if f"'{key_of(o)}'" in str(error)), None)
    return f"{named or ' '.join(a for a, _ in pairs)}: {' '.join(lines) or type(error).__name__}"


def unknown_key(full_key: str, pairs: list[tuple[str, str]], config_name: str) -> str:
    """`model.d_modle=3`: the settings the key's parent has, composed without the argument."""
    arg = argument_for(full_key, pairs)
    parent, _, leaf = full_key.rpartition(".")
    try:
        others = [o for a, o in pairs if a != arg]
        node = OmegaConf.select(compose(config_name, overrides=others), parent) if parent else None
    except (HydraException, OmegaConfBaseException):
        node = None
    keys = sorted(str(k) for k in node.keys()) if isinstance(node, DictConfig) else []
    listed = f"; the settings of {parent}: {', '.join(keys)}" if keys else ""
    return f"{arg}: {parent or config_name} has no setting {leaf!r}{near(leaf, keys)}{listed}"
