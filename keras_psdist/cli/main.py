"""Command-line entry point: `keras-psdist COMMAND [--flags]`.

The module is kept import-light on purpose (`tests/test_quiet_output.py`
checks it): TensorFlow is imported only inside the command that needs it,
after the flags are checked and the process environment (log level, logical
CPU devices) has been set up, so `--help` and flag errors answer at once.
"""

import contextlib
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence

# Before anything in this process imports TensorFlow or Keras.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from absl import app, flags  # noqa: E402

from keras_psdist import spelling  # noqa: E402
from keras_psdist.cli import plan  # noqa: E402  (defines `plan`'s flags)
from keras_psdist.cluster.launcher import banner  # noqa: E402
from keras_psdist.cluster.mode_names import (  # noqa: E402
    IN_GRAPH,
    LAUNCH_MODES,
    canonical,
)
from keras_psdist.families import AGGREGATORS, ATTACKS, COMPRESSORS  # noqa: E402

PROG = "keras-psdist"

FLAGS = flags.FLAGS

# The ids `--aggregator` and `--attack` take, read from the families'
# registries (listing them imports no TensorFlow).
AGGREGATOR_IDS = tuple(AGGREGATORS.names())
ATTACK_IDS = tuple(ATTACKS.names())
COMPRESSOR_IDS = tuple(COMPRESSORS.names())

flags.DEFINE_integer(
    "replicas", 4, "Number of logical CPU replicas (ignored when a GPU is present)."
)
flags.DEFINE_integer("epochs", 10, "Number of training epochs.")
flags.DEFINE_integer("batch_size", 128, "Global batch size, split over the replicas.")
flags.DEFINE_string(
    "aggregator",
    "mean",
    "Gradient aggregation rule used across replicas, one of: "
    f"{', '.join(AGGREGATOR_IDS)} (see keras_psdist.aggregators); or a "
    "configuration, [pre-aggregation>...>]rule[+wm[BETA]], e.g. "
    "nnm>trimmed_mean, arc>median+wm (see keras_psdist.spelling).",
)
flags.DEFINE_integer(
    "num_byzantine",
    0,
    "Replicas that may be faulty (f), for robust aggregators; with --attack, "
    "the last this many replicas attack. With --aggregator mean and --attack, "
    "the mean guards against none of them: the undefended baseline.",
)
flags.DEFINE_string(
    "attack",
    "",
    "Simulated attack on the last --num-byzantine replicas, one of: "
    f"{', '.join(ATTACK_IDS)} (see keras_psdist.attacks; the demo prints the "
    "attack it runs, with its strength).",
)
flags.DEFINE_string(
    "compression",
    "",
    "What each replica sends instead of its gradient, one of: "
    f"{', '.join(COMPRESSOR_IDS)}, optionally with arguments, e.g. "
    "top_k(ratio=0.01) (see keras_psdist.compression). Or write it first in "
    "--aggregator: top_k>trimmed_mean.",
)
flags.DEFINE_integer("seed", 0, "Random seed for Keras, NumPy and Python.")
flags.DEFINE_bool(
    "verbose",
    False,
    "Show TensorFlow's start-up banner and its INFO/WARNING log (by default "
    "the known banner lines are left out and TF_CPP_MIN_LOG_LEVEL defaults "
    "to 2).",
)

# `serve`
flags.DEFINE_string(
    "job", None, "Task type to serve (ps or worker), instead of TF_CONFIG's."
)
flags.DEFINE_integer("task", None, "Task index to serve, instead of TF_CONFIG's.")

# `launch`
flags.DEFINE_integer("num_ps", 1, "Number of parameter-server tasks (plan: 1-8 tried).")
flags.DEFINE_integer("num_workers", 1, "Number of worker tasks.")
flags.DEFINE_string(
    "mode",
    IN_GRAPH,
    f"One of {', '.join(LAUNCH_MODES)}. in-graph: servers for every ps and "
    "worker task, the command runs once as the chief; between-graph: servers "
    "for the ps tasks, the command runs once per worker.",
)
flags.DEFINE_string(
    "host",
    "127.0.0.1",
    "Host in the tasks' addresses (TensorFlow's servers listen on every "
    "interface regardless).",
)
flags.DEFINE_float(
    "timeout",
    None,
    "Stop everything and exit 124 once training has run this many seconds.",
)
flags.DEFINE_float(
    "startup_timeout", 60.0, "Seconds the servers may take to accept connections."
)
flags.DEFINE_integer(
    "max_restarts",
    0,
    "between-graph: restart a failed worker (not the chief) up to this many "
    "times in all; it rejoins through the shared variables.",
)
flags.DEFINE_integer(
    "max_worker_failures",
    0,
    "between-graph: go on when up to this many workers (not the chief) are "
    "lost for good, for modes that tolerate it (between-graph PSStrategy, "
    "SyncReplicaStrategy with backup workers).",
)
flags.DEFINE_bool(
    "evaluator",
    False,
    "Also run the command as the side-car evaluator (TF_CONFIG task "
    "evaluator:0), which evaluates the chief's checkpoints "
    "(keras_psdist.SidecarEvaluator); it never stops training.",
)
flags.DEFINE_integer(
    "max_workers",
    None,
    "between-graph (PSStrategy without max_staleness, SyncReplicaStrategy): "
    "workers may join and leave the running job, up to this many; the "
    "launcher logs a control directory where `touch add-worker` starts one "
    "and `touch remove-worker-K` asks worker:K to leave.",
)
flags.DEFINE_integer(
    "min_workers",
    None,
    "with --max-workers: the fewest workers the job keeps; a failed worker "
    "(not the chief) is lost and the job goes on while at least this many "
    "train; removals below it are refused.",
)
flags.DEFINE_string(
    "host_discovery_script",
    None,
    "with --max-workers: an executable printing the hosts that may run "
    "workers now (`host` or `host:slots`, one per line), polled every 2 s: "
    "workers start on hosts that appear and leave hosts that go.",
)
flags.DEFINE_integer(
    "port",
    8888,
    "slurm: the port of a node's first task (its other tasks use the next ones); k8s: every task's port.",
)
flags.DEFINE_float(
    "serve_idle_timeout",
    40.0,
    "slurm: a server rank stops once the training tasks, seen up, have all "
    "been gone this many seconds.",
)
flags.DEFINE_float(
    "serve_start_timeout",
    600.0,
    "slurm: a server rank stops (exit 1) once no training task has come up "
    "this many seconds after it started.",
)
flags.DEFINE_string("name", None, "k8s: the job's name (a DNS label).")
flags.DEFINE_string("image", None, "k8s: the container image with the script.")

# Flags each command reads, with the smallest value each accepts.
_MINIMUMS = {
    "replicas": 1,
    "epochs": 1,
    "batch_size": 1,
    "num_byzantine": 0,
    "seed": 0,
    "task": 0,
    "num_ps": 1,
    "num_workers": 1,
    "max_restarts": 0,
    "max_worker_failures": 0,
    "max_workers": 1,
    "min_workers": 1,
    "port": 1,
}

# The flags each command reads, in the order `--help` lists them.
_COMMAND_FLAGS = {
    "demo": (
        "replicas",
        "epochs",
        "batch_size",
        "aggregator",
        "num_byzantine",
        "attack",
        "compression",
        "seed",
        "verbose",
    ),
    "serve": ("job", "task"),
    "launch": (
        "num_ps",
        "num_workers",
        "mode",
        "host",
        "timeout",
        "startup_timeout",
        "max_restarts",
        "max_worker_failures",
        "max_workers",
        "min_workers",
        "host_discovery_script",
        "evaluator",
        "verbose",
    ),
    "slurm": ("num_ps", "mode", "port", "serve_idle_timeout", "serve_start_timeout"),
    "k8s": ("name", "image", "num_ps", "num_workers", "mode", "evaluator", "port"),
    "plan": plan.FLAG_NAMES,
}

# What follows the flags on each command's usage line.
_COMMAND_ARGS = {
    "launch": " -- COMMAND [ARGS...]",
    "slurm": " -- COMMAND [ARGS...]",
    "k8s": " -- COMMAND [ARGS...]",
}


class _CliError(Exception):
    """A user error: printed as one line to stderr, exit code 2."""


def _usage(command: str | None = None) -> str:
    """The whole usage text, or one command's when `command` is given."""
    if command in COMMANDS:
        return "\n".join(
            [
                f"usage: {PROG} {command} [--flags]{_COMMAND_ARGS.get(command, '')}",
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
            f"{name} flags ({PROG} {name} [--flags]{_COMMAND_ARGS.get(name, '')}):",
            *_flag_lines(name),
        ]
    return "\n".join(lines)


def _flag_lines(command: str) -> list[str]:
    return [
        f"  {_flag(name)} (default: {FLAGS[name].default!r})  {FLAGS[name].help}"
        for name in _COMMAND_FLAGS.get(command, ())
    ]


def _flag(name: str) -> str:
    """How users spell flag `name` (absl's, with underscores): `--num-ps`,
    as `torchrun` and `horovodrun` do. The underscore spelling is still
    accepted (`_normalise_flag`), but never shown."""
    return "--" + name.replace("_", "-")


def _in_flag_words(message: str) -> str:
    """absl's flag errors with our spelling: `flag --num_ps=x: ...` ->
    `flag --num-ps=x: ...`, `Unknown command line flag 'num_pss'. Did you
    mean: num_ps ?` -> `Unknown flag --num-pss. Did you mean --num-ps?`"""
    unknown = re.fullmatch(
        r"Unknown command line flag '([\w-]+)'(?:\. Did you mean: (.+?) \?)?",
        message.strip(),
    )
    if unknown:
        name, guesses = unknown.groups()
        said = f"Unknown flag {_flag(name)}."
        if guesses:
            said += f" Did you mean {' or '.join(map(_flag, guesses.split(', ')))}?"
        return said
    return re.sub(r"--(\w+)", lambda m: _flag(m.group(1)), message)


def _summary(fn: Callable) -> str:
    doc = (fn.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def _mode_flag(command: str) -> str:
    """`--mode` in its canonical spelling (`ValueError` naming the choices);
    a deprecated spelling is said on the terminal, not hidden."""
    with warnings.catch_warnings():
        warnings.simplefilter("default", DeprecationWarning)
        return canonical(FLAGS.mode, LAUNCH_MODES, f"keras-psdist {command} --mode")


def _check_minimum(name: str) -> None:
    value = getattr(FLAGS, name)
    minimum = _MINIMUMS[name]
    if value < minimum:
        raise _CliError(
            f"`{_flag(name)}` must be >= {minimum}. Received: {_flag(name)}={value}"
        )


def _split_host_cpu(replicas: int) -> None:
    """Splits the host CPU into `replicas` logical devices when no GPU is present.

    Must run before the TensorFlow runtime is initialized.
    """
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        print(
            f"GPU present: using the visible GPUs; `--replicas={replicas}` is ignored.",
            file=sys.stderr,
        )
        return
    from keras_psdist.devices import split_host_cpu

    try:
        split_host_cpu(replicas)
    except RuntimeError as e:
        raise _CliError(str(e)) from e


def demo_command(args: Sequence[str] = ()) -> int:
    """Train a small MLP on the bundled digits dataset with PSStrategy."""
    for name in ("replicas", "epochs", "batch_size", "num_byzantine", "seed"):
        _check_minimum(name)
    try:
        spelling.parse(FLAGS.aggregator)
        if FLAGS.compression:
            spelling.parse_compression(FLAGS.compression)
    except ValueError as e:
        raise _CliError(str(e)) from e
    if FLAGS.attack and FLAGS.attack not in ATTACKS.names():
        raise _CliError(ATTACKS.unknown_message(FLAGS.attack))
    if FLAGS.attack and not FLAGS.num_byzantine:
        raise _CliError(
            "`--attack` needs the attacked replicas: set --num-byzantine to how "
            f"many of the last replicas attack. Received: --attack={FLAGS.attack} "
            "with --num-byzantine=0."
        )

    if FLAGS.verbose:
        hide_banner = contextlib.nullcontext()
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        hide_banner = banner.hidden_on_stderr()
    with hide_banner:
        import tensorflow  # noqa: F401  (here, where its banner is caught)

        _split_host_cpu(FLAGS.replicas)

    from keras_psdist.cli.demo import run_demo

    try:
        run_demo(
            replicas=FLAGS.replicas,
            epochs=FLAGS.epochs,
            batch_size=FLAGS.batch_size,
            aggregator=FLAGS.aggregator,
            seed=FLAGS.seed,
            num_byzantine=FLAGS.num_byzantine,
            attack=FLAGS.attack or None,
            compression=FLAGS.compression or None,
        )
    except ValueError as e:
        raise _CliError(str(e)) from e
    return 0


def serve_command(args: Sequence[str] = ()) -> int:
    """Run this task's TensorFlow gRPC server (TF_CONFIG) until SIGTERM/SIGINT."""
    # No TensorFlow import until the server starts: a bad TF_CONFIG is
    # rejected at once.
    from keras_psdist.cluster import config as cluster_config
    from keras_psdist.errors import PortInUseError

    if FLAGS.task is not None:
        _check_minimum("task")
    try:
        config = cluster_config.from_environment()
    except ValueError as e:
        raise _CliError(str(e)) from e
    if config is None:
        raise _CliError(
            '`serve` needs the cluster in TF_CONFIG, e.g. TF_CONFIG=\'{"cluster": '
            '{"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}, "task": '
            '{"type": "ps", "index": 0}}\'. To run a whole cluster on this '
            "machine, use `keras-psdist launch` instead."
        )
    if FLAGS.job is not None or FLAGS.task is not None:
        task_type = config.task_type if FLAGS.job is None else FLAGS.job
        task_id = config.task_id if FLAGS.task is None else FLAGS.task
        if task_type is None or task_id is None:
            raise _CliError(
                "`serve` needs both the task type and index: TF_CONFIG has no "
                f'"task", so pass both --job and --task. Received: --job='
                f"{FLAGS.job}, --task={FLAGS.task}"
            )
        value = config.to_tf_config()
        value["task"] = {"type": task_type, "index": task_id}
        try:
            config = cluster_config.from_tf_config(value, source="--job/--task")
        except ValueError as e:
            raise _CliError(str(e)) from e
    if config.is_evaluator:
        raise _CliError(
            "`serve` runs a server of the training cluster; the evaluator "
            "(TF_CONFIG task evaluator:0) serves nothing: run the training "
            "script in it, which evaluates the chief's checkpoints "
            "(keras_psdist.SidecarEvaluator, docs/evaluator.md)."
        )
    if config.task_type is None:
        raise _CliError(
            '`serve` needs to know which task to serve: TF_CONFIG has no "task". '
            'Set it (e.g. "task": {"type": "ps", "index": 0}) or pass --job and '
            "--task."
        )

    from keras_psdist.cluster.server import NOTE_SAID_ENV, PORT_IN_USE_EXIT_CODE, serve

    # Before `serve` imports TensorFlow (`launch --verbose` sets it to 0).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        code = serve(config, security_note=not os.environ.get(NOTE_SAID_ENV))
    except PortInUseError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return PORT_IN_USE_EXIT_CODE
    # Tearing down an interpreter with a started TF server takes a second or
    # two (longer on a busy host) and saves nothing: leave at once, so that a
    # launcher's shutdown is quick.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch_command(args: Sequence[str] = ()) -> int:
    """Run a command on a parameter-server cluster of local processes."""
    from keras_psdist.cluster.launcher import launch
    from keras_psdist.cluster.launcher.arguments import (
        check_fault_tolerance,
        check_max_workers,
    )

    for name in ("num_ps", "num_workers", "max_restarts", "max_worker_failures"):
        _check_minimum(name)
    for name in ("max_workers", "min_workers"):
        if getattr(FLAGS, name) is not None:
            _check_minimum(name)
    for name in ("timeout", "startup_timeout"):
        value = getattr(FLAGS, name)
        if value is not None and not value > 0:
            raise _CliError(
                f"`{_flag(name)}` must be > 0. Received: {_flag(name)}={value}"
            )
    try:
        mode = _mode_flag("launch")
        # Here too, before `launch` checks it in its arguments' words: the
        # error then names the flags.
        check_fault_tolerance(
            mode,
            FLAGS.num_workers,
            FLAGS.max_restarts,
            FLAGS.max_worker_failures,
            as_flags=True,
        )
        check_max_workers(
            mode,
            FLAGS.num_workers,
            FLAGS.max_workers,
            min_workers=FLAGS.min_workers,
            host_discovery=FLAGS.host_discovery_script,
            as_flags=True,
        )
        return launch(
            list(args),
            num_ps=FLAGS.num_ps,
            num_workers=FLAGS.num_workers,
            mode=mode,
            host=FLAGS.host,
            timeout_s=FLAGS.timeout,
            startup_timeout_s=FLAGS.startup_timeout,
            max_restarts=FLAGS.max_restarts,
            max_worker_failures=FLAGS.max_worker_failures,
            verbose=FLAGS.verbose,
            evaluator=FLAGS.evaluator,
            max_workers=FLAGS.max_workers,
            min_workers=FLAGS.min_workers,
            host_discovery=FLAGS.host_discovery_script,
        )
    except ValueError as e:
        raise _CliError(str(e)) from e


def slurm_command(args: Sequence[str] = ()) -> int:
    """Run this Slurm rank's task (under srun): a server, or the command."""
    from keras_psdist.cluster.slurm import from_slurm, run_task

    _check_minimum("num_ps")
    _check_minimum("port")
    if not args:
        raise _CliError(
            "`slurm` needs the training command after `--`, e.g. `srun --ntasks 3 "
            f"{PROG} slurm --num-ps 1 --mode between-graph -- python train.py`."
        )
    for name in ("serve_idle_timeout", "serve_start_timeout"):
        value = getattr(FLAGS, name)
        if not value > 0:
            raise _CliError(
                f"`{_flag(name)}` must be > 0. Received: {_flag(name)}={value}"
            )
    try:
        mode = _mode_flag("slurm")
        config = from_slurm(FLAGS.num_ps, mode, FLAGS.port)
    except ValueError as e:
        raise _CliError(str(e)) from e
    return run_task(
        config,
        mode,
        list(args),
        gone_s=FLAGS.serve_idle_timeout,
        never_s=FLAGS.serve_start_timeout,
    )


def k8s_command(args: Sequence[str] = ()) -> int:
    """Print Kubernetes manifests for a job (kubectl apply -f)."""
    from keras_psdist.cluster.kubernetes import render, to_json

    for name in ("num_ps", "num_workers", "port"):
        _check_minimum(name)
    for name in ("name", "image"):
        if not getattr(FLAGS, name):
            raise _CliError(
                f"`k8s` needs {_flag(name)}, e.g. `{PROG} k8s --name digits --image "
                "registry.example/train:1 --num-ps 1 --num-workers 2 -- python "
                "train.py`."
            )
    if not args:
        raise _CliError(
            "`k8s` needs the training command after `--`, e.g. `-- python train.py`."
        )
    try:
        mode = _mode_flag("k8s")
        manifests = render(
            FLAGS.name,
            FLAGS.image,
            list(args),
            FLAGS.num_ps,
            FLAGS.num_workers,
            mode=mode,
            evaluator=FLAGS.evaluator,
            port=FLAGS.port,
        )
    except ValueError as e:
        raise _CliError(str(e)) from e
    print(to_json(manifests))
    return 0


# Command name -> function taking the arguments after `--` (only commands in
# _TAKES_ARGS get any) and returning the process exit code; flags are in FLAGS.
COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "demo": demo_command,
    "launch": launch_command,
    "serve": serve_command,
    "slurm": slurm_command,
    "k8s": k8s_command,
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
        print(f"{PROG}: error: {_in_flag_words(str(e))}", file=sys.stderr)
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
        for other, names in _COMMAND_FLAGS.items()
        if other != command
        for name in names
        if name not in _COMMAND_FLAGS[command] and FLAGS[name].present
    ]
    if misplaced:
        name, other = misplaced[0]
        print(
            f"{PROG}: error: `{_flag(name)}` is a flag of `{PROG} {other}`, not of "
            f"`{PROG} {command}`. See `{PROG} {command} --help`.",
            file=sys.stderr,
        )
        return 2
    try:
        return COMMANDS[command](rest)
    except _CliError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


def run(argv: list[str] | None = None) -> None:
    """Console-script entry point (`keras-psdist`)."""
    app.run(_main, argv=argv, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
