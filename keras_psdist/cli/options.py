"""The flags of every `keras-psdist` command, defined once (absl's `FLAGS`),
with what each command reads, the smallest value each takes, how users spell
them (`--num-ps`), and the error a bad value raises (`CliError`).

Kept import-light (`tests/test_quiet_output.py`): no TensorFlow.

Examples:

>>> flag("num_ps")
'--num-ps'
>>> in_flag_words("flag --num_ps=0: must be >= 1")
'flag --num-ps=0: must be >= 1'
>>> in_flag_words("flag --link_mbit=1Gbit: could not convert string to float: '1Gbit'")
"flag --link-mbit=1Gbit: could not convert string to float: '1Gbit' (give a number, without units, e.g. --link-mbit=2)"
"""

import re
import warnings

from absl import flags

from keras_psdist.cli import plan  # (defines `plan`'s flags)
from keras_psdist.cluster.mode_names import IN_GRAPH, LAUNCH_MODES, canonical
from keras_psdist.families import AGGREGATORS, ATTACKS, COMPRESSORS

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
flags.DEFINE_integer("num_ps", 1, "Number of parameter-server tasks.")
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
MINIMUMS = {
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
COMMAND_FLAGS = {
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
COMMAND_ARGS = {
    "launch": " -- COMMAND [ARGS...]",
    "slurm": " -- COMMAND [ARGS...]",
    "k8s": " -- COMMAND [ARGS...]",
}


class CliError(Exception):
    """A user error: printed as one line to stderr, exit code 2."""


def flag(name: str) -> str:
    """How users spell flag `name` (absl's, with underscores): `--num-ps`,
    as `torchrun` and `horovodrun` do. The underscore spelling is still
    accepted (`main._normalise_flag`), but never shown."""
    return "--" + name.replace("_", "-")


def in_flag_words(message: str) -> str:
    """absl's flag errors with our spelling: `flag --num_ps=x: ...` ->
    `flag --num-ps=x: ...`, `Unknown command line flag 'num_pss'. Did you
    mean: num_ps ?` -> `Unknown flag --num-pss. Did you mean --num-ps?`"""
    unknown = re.fullmatch(
        r"Unknown command line flag '([\w-]+)'(?:\. Did you mean: (.+?) \?)?",
        message.strip(),
    )
    if unknown:
        name, guesses = unknown.groups()
        said = f"Unknown flag {flag(name)}."
        if guesses:
            said += f" Did you mean {' or '.join(map(flag, guesses.split(', ')))}?"
        return said
    message = re.sub(r"--(\w+)", lambda m: flag(m.group(1)), message)
    number = re.match(
        r"flag (--[\w-]+)=.*: (could not convert string to float|"
        r"invalid literal for int)",
        message.strip(),
    )
    if number:  # absl's words name Python's conversion, not the fix
        kind = "a number" if "float" in number.group(2) else "a whole number"
        message += f" (give {kind}, without units, e.g. {number.group(1)}=2)"
    return message


def mode_flag(command: str) -> str:
    """`--mode` in its canonical spelling (`ValueError` naming the choices);
    a deprecated spelling is said on the terminal, not hidden."""
    with warnings.catch_warnings():
        warnings.simplefilter("default", DeprecationWarning)
        return canonical(FLAGS.mode, LAUNCH_MODES, f"keras-psdist {command} --mode")


def check_minimum(name: str) -> None:
    """Flag `name` must be at least its `MINIMUMS` value."""
    value = getattr(FLAGS, name)
    minimum = MINIMUMS[name]
    if value < minimum:
        raise CliError(
            f"`{flag(name)}` must be >= {minimum}. Received: {flag(name)}={value}"
        )


def check_positive(*names: str) -> None:
    """Each flag of `names` that is set must be > 0."""
    for name in names:
        value = getattr(FLAGS, name)
        if value is not None and not value > 0:
            raise CliError(
                f"`{flag(name)}` must be > 0. Received: {flag(name)}={value}"
            )
