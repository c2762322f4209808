"""The commands `keras-psdist` runs: `demo`, `serve`, `launch`, `slurm`,
`k8s` (`plan` is in plan.py). Each takes the arguments after `--` and reads
its flags from `options.FLAGS`, checked here before anything heavy loads:
TensorFlow is imported only inside the command that needs it, after the
process environment (log level, logical CPU devices) is set up.
"""

import contextlib
import os
import sys
from collections.abc import Sequence

from keras_psdist import spelling
from keras_psdist.cli.options import (
    ATTACKS,
    FLAGS,
    PROG,
    CliError,
    check_minimum,
    check_positive,
    flag,
    mode_flag,
)
from keras_psdist.cluster.launcher import banner


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
        raise CliError(str(e)) from e


def demo_command(args: Sequence[str] = ()) -> int:
    """Train a small MLP on the bundled digits dataset with PSStrategy."""
    for name in ("replicas", "epochs", "batch_size", "num_byzantine", "seed"):
        check_minimum(name)
    try:
        spelling.parse(FLAGS.aggregator)
        if FLAGS.compression:
            spelling.parse_compression(FLAGS.compression)
    except ValueError as e:
        raise CliError(str(e)) from e
    if FLAGS.attack and FLAGS.attack not in ATTACKS.names():
        raise CliError(ATTACKS.unknown_message(FLAGS.attack))
    if FLAGS.attack and not FLAGS.num_byzantine:
        raise CliError(
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
        raise CliError(str(e)) from e
    return 0


def serve_command(args: Sequence[str] = ()) -> int:
    """Run this task's TensorFlow gRPC server (TF_CONFIG) until SIGTERM/SIGINT."""
    # No TensorFlow import until the server starts: a bad TF_CONFIG is
    # rejected at once.
    from keras_psdist.cluster import config as cluster_config
    from keras_psdist.errors import PortInUseError

    if FLAGS.task is not None:
        check_minimum("task")
    try:
        config = cluster_config.from_environment()
    except ValueError as e:
        raise CliError(str(e)) from e
    if config is None:
        raise CliError(
            '`serve` needs the cluster in TF_CONFIG, e.g. TF_CONFIG=\'{"cluster": '
            '{"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}, "task": '
            '{"type": "ps", "index": 0}}\'. To run a whole cluster on this '
            "machine, use `keras-psdist launch` instead."
        )
    if FLAGS.job is not None or FLAGS.task is not None:
        task_type = config.task_type if FLAGS.job is None else FLAGS.job
        task_id = config.task_id if FLAGS.task is None else FLAGS.task
        if task_type is None or task_id is None:
            raise CliError(
                "`serve` needs both the task type and index: TF_CONFIG has no "
                f'"task", so pass both --job and --task. Received: --job='
                f"{FLAGS.job}, --task={FLAGS.task}"
            )
        value = config.to_tf_config()
        value["task"] = {"type": task_type, "index": task_id}
        try:
            config = cluster_config.from_tf_config(value, source="--job/--task")
        except ValueError as e:
            raise CliError(str(e)) from e
    if config.is_evaluator:
        raise CliError(
            "`serve` runs a server of the training cluster; the evaluator "
            "(TF_CONFIG task evaluator:0) serves nothing: run the training "
            "script in it, which evaluates the chief's checkpoints "
            "(keras_psdist.SidecarEvaluator, docs/evaluator.md)."
        )
    if config.task_type is None:
        raise CliError(
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
        check_minimum(name)
    for name in ("max_workers", "min_workers"):
        if getattr(FLAGS, name) is not None:
            check_minimum(name)
    check_positive("timeout", "startup_timeout")
    try:
        mode = mode_flag("launch")
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
        raise CliError(str(e)) from e


def slurm_command(args: Sequence[str] = ()) -> int:
    """Run this Slurm rank's task (under srun): a server, or the command."""
    from keras_psdist.cluster.slurm import from_slurm, run_task

    check_minimum("num_ps")
    check_minimum("port")
    if not args:
        raise CliError(
            "`slurm` needs the training command after `--`, e.g. `srun --ntasks 3 "
            f"{PROG} slurm --num-ps 1 --mode between-graph -- python train.py`."
        )
    check_positive("serve_idle_timeout", "serve_start_timeout")
    try:
        mode = mode_flag("slurm")
        config = from_slurm(FLAGS.num_ps, mode, FLAGS.port)
    except ValueError as e:
        raise CliError(str(e)) from e
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
        check_minimum(name)
    for name in ("name", "image"):
        if not getattr(FLAGS, name):
            raise CliError(
                f"`k8s` needs {flag(name)}, e.g. `{PROG} k8s --name digits --image "
                "registry.example/train:1 --num-ps 1 --num-workers 2 -- python "
                "train.py`."
            )
    if not args:
        raise CliError(
            "`k8s` needs the training command after `--`, e.g. `-- python train.py`."
        )
    try:
        mode = mode_flag("k8s")
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
        raise CliError(str(e)) from e
    print(to_json(manifests))
    return 0
