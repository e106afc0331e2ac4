"""One-line explanations of bad `--config` flags (missing file, bad task/scale, unknown key).

ml_collections reports these as tracebacks while parsing flags (or later, when the
config is first read); `check` finds them first and says what is wrong and how to fix it.
`apply_overrides` gives `--config.*` flags to a config the command builds itself (compile,
lower), parsed as `train` parses them, with the same messages.
"""

from __future__ import annotations

import difflib
import os
import sys

from absl import flags
from ml_collections import config_flags

from lra_jax.config import paths as config_paths
from lra_jax.errors import ConfigError


def unknown_key(config, dotted: str) -> str | None:
    """A message if `dotted` (e.g. 'model.num_layer') is not a key of `config`, else None."""
    node, walked = config, []
    for part in dotted.split("."):
        keys = list(node.keys()) if hasattr(node, "keys") else []
        if part not in keys:
            where = ".".join(walked) or "the config"
            hint = difflib.get_close_matches(part, keys, n=1)
            did_you_mean = f"; did you mean --config.{'.'.join(walked + hint)}?" if hint else ""
            known = f" (keys of {where}: {', '.join(sorted(keys))})" if keys else ""
            return f"unknown config key --config.{dotted}{did_you_mean}{known}"
        node = node[part]
        walked.append(part)
    return None


def check(argv: list[str]) -> str | None:
    """A one-line message if `argv`'s --config file or overrides are bad, else None."""
    spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if spec is None:
        return None
    path = spec.partition(":")[0]
    if not os.path.isfile(path):
        return config_paths.missing_file_message(path)
    try:
        config = config_paths.load(spec)
    except Exception as error:  # noqa: BLE001 - reported to the user in one line
        lines = str(error).strip().splitlines() or [type(error).__name__]
        return f"could not load {spec}: {lines[-1]}"
    for arg in argv:
        if arg.startswith("--config."):
            message = unknown_key(config, arg[len("--config."):].split("=", 1)[0])
            if message:
                return message
    return None


def check_override_form(overrides: list[str]) -> None:
    """ConfigError (one line) for an argument that is not of the form --config.KEY=VALUE."""
    for arg in overrides:
        key, equals, _ = arg.partition("=")
        if not key.startswith("--config.") or not equals:
            raise ConfigError(f"unexpected argument {arg!r}: only config overrides --config.KEY=VALUE may follow "
                              "the flags, e.g. --config.attention.mode=factorized_random")


def apply_overrides(config, overrides: list[str], variant: str = ""):
    """A copy of `config` with `overrides` (['--config.attention.mode=factorized_random', ...]) applied,
    each value parsed as the type of the field it replaces, as `train` parses them; ConfigError (one line,
    naming `variant`'s config where given) for a flag not of that form, an unknown key or a value of the
    wrong type."""
    check_override_form(overrides)
    if not overrides:
        return config
    whose = f"{variant}'s config: " if variant else ""
    for arg in overrides:
        message = unknown_key(config, arg.partition("=")[0][len("--config."):])
        if message:
            raise ConfigError(whose + message)
    argv = ["overrides", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_dict("config", config.copy_and_resolve_references(), "the config",
                                    flag_values=values, lock_config=True, sys_argv=argv)
    try:
        values(argv)
    except flags.Error as error:
        raise ConfigError(whose + str(error).strip().splitlines()[-1]) from None
    return values.config


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing for a CLI with a --config flag that takes flags only; a bad config or flag, or an
    argument that is not a flag, exits 2 with one line."""
    problem = check(argv)
    if problem is None:
        try:
            rest = flags.FLAGS(argv)
        except flags.Error as error:
            problem = f"{str(error).strip().splitlines()[-1]} (pass --helpshort to see the flags)"
        else:
            if len(rest) == 1:
                return rest
            problem = (f"unexpected arguments: {' '.join(rest[1:])} (this command takes flags only, e.g. "
                       "--config=configs/linformer.py:listops,mini --config.model.num_layers=2; --helpshort lists them)")
    print(f"error: {problem}", file=sys.stderr)
    sys.exit(2)
