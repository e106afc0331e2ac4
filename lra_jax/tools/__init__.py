"""Commands for experiments, each a thin CLI (flags, `main`, `cli`) over its library in
`lra_jax.research` (and `lra_jax.measure`): `python -m lra_jax.tools.<name>`.

Nothing in attention/, kernels/, models/ or data/ imports this package or the trainer.

Every command reads its command line the one way defined here: absl flags, parsed by `parse_command_line`.
Each command defines its flags in a `define_flags(values)` of its own on a fresh `absl.flags.FlagValues`
(never the global `flags.FLAGS`), so the modules import side by side and `main(["--targets=h100", ...])`
runs a command in-process as often as a test likes:

    def main(argv: list[str] | None = None) -> int:
        args, files = parse_command_line("lra_jax.tools.fits", __doc__, define_flags, argv, positionals="[FILE ...]")

absl's syntax throughout: `--name=value` or `--name value`, `--flag`/`--noflag` for a boolean, flags and
positionals in any order, `--` ends the flags. `-h`/`--help` (also `--helpshort`, `--helpfull`) prints the
command's docstring and its flags and exits 0; an unknown flag, a bad value or an unexpected argument is one
line on stderr naming it, and exit 2.

`lra_jax.train` does not parse here: its `--config` is ml_collections' `config_flags` file flag with
`--config.KEY=VALUE` overrides, which it parses under `absl.app.run` on the global flags (through
`lra_jax.config.checks.parse_flags` for its one-line errors), as the Flax examples do; it is absl flags
all the same. Nor does `lra_jax.data.prepare` (absl's app.run too), which sits below this layer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from absl import flags

HELP = ("-h", "--help", "--helpshort", "--helpfull")


def command_arguments(argv: Sequence[str] | None) -> list[str]:
    """The command's arguments: `argv` as given (in-process calls, tests), else the process's own."""
    return list(sys.argv[1:] if argv is None else argv)


def usage(command: str, positionals: str = "") -> str:
    """The usage line of `python -m <command>`."""
    return " ".join(filter(None, [f"usage: python -m {command} [flags]", positionals]))


def help_text(command: str, doc: str, values: flags.FlagValues, positionals: str = "") -> str:
    """The module docstring, the usage line and every flag with its help and default."""
    listing = [line for line in values.get_help(prefix="", include_special_flags=False).splitlines()
               if line.startswith(" ")]  # absl groups flags under their module's name: one list here
    return "\n".join([(doc or "").strip(), "", usage(command, positionals), "", "flags:", *listing,
                      "  -h, --help: show this help and exit (also --helpshort, --helpfull)"])


def bad_input(message: str) -> NoReturn:
    """Bad input: one line on stderr and exit 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_command_line(command: str, doc: str, define: Callable[[flags.FlagValues], None],
                       argv: Sequence[str] | None = None, *, positionals: str = "", pass_unknown: bool = False,
                       check: Callable[[list[str]], str | None] | None = None) -> tuple[flags.FlagValues, list[str]]:
    """Parses `argv` (default `sys.argv[1:]`) with the flags `define` puts on a FlagValues of the command's own.

    Args:
        command: the module run by `python -m` (e.g. "lra_jax.tools.fits"), for the usage line and messages.
        doc: the module docstring, printed by --help.
        define: defines the command's flags on the FlagValues it is given (`flag_values=values`).
        argv: the arguments without the program name; None: the process's.
        positionals: what may follow the flags, for the usage line (e.g. "[FILE ...]"); empty: nothing may, and
            any argument left over is an error.
        pass_unknown: unknown `--flags` are left over with the positionals instead of refused (the
            `--config.KEY=VALUE` overrides that compile and lower check themselves).
        check: a one-line message for arguments that absl would report with a traceback, else None, asked
            before parsing (`lra_jax.config.checks.check`: a missing --config file, an unknown config key).

    Returns:
        The parsed flag values (`values.name`, or `values["a-name"].value` for a hyphenated one) and the
        arguments left over, in order: positionals, those after `--`, and with `pass_unknown` unknown flags.
    """
    args = command_arguments(argv)
    values = flags.FlagValues()
    define(values)
    flag_part = args[:args.index("--")] if "--" in args else args
    if any(arg in HELP for arg in flag_part):
        print(help_text(command, doc, values, positionals))
        sys.exit(0)
    problem = check(args) if check else None
    if problem:
        bad_input(problem)
    try:
        rest = values([f"python -m {command}", *args], known_only=pass_unknown)[1:]
    except flags.Error as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        bad_input(f"{lines[-1]} (python -m {command} --help lists the flags)")
    if rest and not positionals:
        bad_input(f"unexpected arguments: {' '.join(rest)} (python -m {command} takes flags only; --help lists them)")
    return values, rest
