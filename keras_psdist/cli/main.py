"""Command-line entry point: `keras-psdist COMMAND [--flags]`.

The command table, the usage text, and the parsing of flags (absl's, spelled
with hyphens) before a command runs; the flags are defined in options.py,
the commands in commands.py and plan.py.

The module is kept import-light on purpose (`tests/test_quiet_output.py`
checks it): TensorFlow is imported only inside the command that needs it,
after the flags are checked and the process environment (log level, logical
CPU devices) has been set up, so `--help` and flag errors answer at once.
"""

import os
import sys
from collections.abc import Callable, Sequence

# Before anything in this process imports TensorFlow or Keras.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from absl import app, flags  # noqa: E402

from keras_psdist.cli import commands, plan  # noqa: E402
from keras_psdist.cli.options import (  # noqa: E402, F401  (the ids: re-exported)
    AGGREGATOR_IDS,
    ATTACK_IDS,
    COMMAND_ARGS,
    COMMAND_FLAGS,
    COMPRESSOR_IDS,
    FLAGS,
    PROG,
    CliError,
    flag,
    in_flag_words,
)


def _usage(command: str | None = None) -> str:
    """The whole usage text, or one command's when `command` is given."""
    if command in COMMANDS:
        return "\n".join(
            [
                f"usage: {PROG} {command} [--flags]{COMMAND_ARGS.get(command, '')}",
                "",
                _summary(COMMANDS[command]),
                "",
                "Flags:",
                *_flag_lines(command),
            ]
        )
    width = max(len(name) for name in COMMANDS)
    lines = [
        f"usage: {PROG} COMMAND [--flags]    ({PROG} --version: the version)",
        "",
        "Commands:",
        *(
            f"  {name.ljust(width)}  {_summary(fn)}"
            for name, fn in sorted(COMMANDS.items())
        ),
    ]
    for name in sorted(COMMANDS):
        lines += [
            "",
            f"{name} flags ({PROG} {name} [--flags]{COMMAND_ARGS.get(name, '')}):",
            *_flag_lines(name),
        ]
    return "\n".join(lines)


def _flag_lines(command: str) -> list[str]:
    # Defaults a command reads otherwise than the flag's own value says.
    from keras_psdist.planning.planner import ps_counts_tried

    shown = {("plan", "num_ps"): ps_counts_tried()}
    lines = []
    for name in COMMAND_FLAGS.get(command, ()):
        default = shown.get((command, name), repr(FLAGS[name].default))
        lines.append(f"  {flag(name)} (default: {default})  {FLAGS[name].help}")
    return lines


def _summary(fn: Callable) -> str:
    doc = (fn.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


# Command name -> function taking the arguments after `--` (only commands in
# _TAKES_ARGS get any) and returning the process exit code; flags are in FLAGS.
COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "demo": commands.demo_command,
    "launch": commands.launch_command,
    "serve": commands.serve_command,
    "slurm": commands.slurm_command,
    "k8s": commands.k8s_command,
    "plan": plan.plan_command,
}

# Commands that take a command line after `--`.
_TAKES_ARGS = ("launch", "slurm", "k8s")

_HELP_ARGS = ("-h", "--help", "-help", "--helpshort", "--helpfull", "help")


def _parse_flags(argv: list[str]) -> list[str]:
    """Parses `argv` into FLAGS; returns `[prog, *positional]`.

    Flag names are spelled with hyphens (`--num-ps`); absl's underscores
    (`--num_ps`) are accepted too, for older scripts. Everything after
    the first `--` is returned untouched, after a `--` marker, for `launch`.
    Flag errors and help requests are handled here so they never reach absl's
    default usage printer (which documents the `__main__` module instead).
    """
    own, rest = argv, None
    if "--" in argv:
        split = argv.index("--")
        own, rest = argv[:split], argv[split + 1 :]
    own = [own[0], *(_normalise_flag(arg) for arg in own[1:])]
    if own[1:2] in (["--version"], ["version"]):
        from keras_psdist import __version__

        print(f"{PROG} {__version__}")
        sys.exit(0)
    if any(arg in _HELP_ARGS for arg in own[1:]):
        command = next((a for a in own[1:] if a in COMMANDS), None)
        print(_usage(command))
        sys.exit(0)
    try:
        positional = FLAGS(own)
    except flags.Error as e:
        print(f"{PROG}: error: {in_flag_words(str(e))}", file=sys.stderr)
        sys.exit(2)
    # absl raises the default verbosity to INFO after parsing; keep WARNING
    # unless the user asked for something else.
    if FLAGS["verbosity"].using_default_value:
        FLAGS.verbosity = -1
    return positional if rest is None else [*positional, "--", *rest]


def _normalise_flag(arg: str) -> str:
    """`--num-ps=2` -> `--num_ps=2`: hyphens in a flag's name, not its value."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return arg
    dashes = len(arg) - len(arg.lstrip("-"))
    name, eq, value = arg[dashes:].partition("=")
    return arg[:dashes] + name.replace("-", "_") + eq + value


def _main(argv: list[str]) -> int:
    args = argv[1:]
    if not args or args[0] not in COMMANDS:
        if args:
            print(f"{PROG}: error: unknown command {args[0]!r}", file=sys.stderr)
        print(_usage(), file=sys.stderr)
        return 2
    command, extra, rest = args[0], args[1:], []
    if "--" in extra:
        split = extra.index("--")
        extra, rest = extra[:split], extra[split + 1 :]
    if command in _TAKES_ARGS and extra:
        print(
            f"{PROG}: error: unexpected arguments before `--`: {' '.join(extra)}. "
            f"Put the command to run after `--`: {PROG} {command} --num-ps 1 "
            "--num-workers 2 -- python train.py",
            file=sys.stderr,
        )
        return 2
    if command not in _TAKES_ARGS and (extra or rest):
        print(
            f"{PROG}: error: unexpected arguments: {' '.join(extra + rest)}",
            file=sys.stderr,
        )
        return 2
    misplaced = [
        (name, other)
        for other, names in COMMAND_FLAGS.items()
        if other != command
        for name in names
        if name not in COMMAND_FLAGS[command] and FLAGS[name].present
    ]
    if misplaced:
        name, other = misplaced[0]
        print(
            f"{PROG}: error: `{flag(name)}` is a flag of `{PROG} {other}`, not of "
            f"`{PROG} {command}`. See `{PROG} {command} --help`.",
            file=sys.stderr,
        )
        return 2
    try:
        return COMMANDS[command](rest)
    except CliError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


def run(argv: list[str] | None = None) -> None:
    """Console-script entry point (`keras-psdist`)."""
    app.run(_main, argv=argv, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
