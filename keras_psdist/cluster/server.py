"""`keras-psdist serve`: run one task's TensorFlow gRPC server until stopped."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import signal
import sys
import threading
import types
from typing import TextIO

from keras_psdist.cluster.config import ClusterConfig
from keras_psdist.cluster.ports import check_port_free
from keras_psdist.errors import PortInUseError

# The line `serve` prints once the server accepts connections; a launcher
# waits for it (a port that accepts connections may belong to someone else).
READY_LINE = "keras-psdist serve: {name} listening on {address} (pid {pid})"

# Printed once the server runs: TensorFlow cannot be told to bind one interface.
SECURITY_NOTE = (
    "keras-psdist serve: note: TensorFlow's gRPC server takes unauthenticated "
    "connections on port {port} of every interface of this machine; keep the "
    "port on a private network (see docs/security.md)."
)
# The same, said once by `keras-psdist launch` for all the servers it starts
# (`{ports}`: "port 2222" or "ports 2222, 2223"; `{them}`: "it" or "them").
LAUNCH_SECURITY_NOTE = (
    "note: TensorFlow's gRPC servers take unauthenticated connections on "
    "{ports} of every interface of this machine; keep {them} on a private "
    "network (see docs/security.md)."
)
# Set by `keras-psdist launch` in the servers it starts, which then leave the
# note to it: one note per launch, not one per server.
NOTE_SAID_ENV = "KERAS_PSDIST_SECURITY_NOTE_SAID"

# A ps task runs each op on one thread (`start_server`); the variable
# overrides it, e.g. for a ps of few, very large variables (0: TensorFlow's
# default, one per core).
PS_INTRA_OP_THREADS_ENV = "KERAS_PSDIST_PS_INTRA_OP_THREADS"

# Exit code of `keras-psdist serve` when its port is taken: sysexits.h's
# EX_TEMPFAIL ("try again later"), so a launcher can retry with other ports.
PORT_IN_USE_EXIT_CODE = 75


def serve(
    config: ClusterConfig, out: TextIO | None = None, security_note: bool = True
) -> int:
    """Serves `config`'s own task over gRPC until SIGTERM or SIGINT.

    Starts the task's TensorFlow gRPC server (`start_server`), prints one
    line

        keras-psdist serve: ps:0 listening on 127.0.0.1:2222 (pid 4242)

    and, with `security_note`, a note on what the open port allows (below),
    and waits. A chief or
    worker process then places variables and ops on
    this task (`/job:ps/replica:0/task:0/...`) through TensorFlow's own
    runtime; nothing else needs to run here.

    Which address the server binds: TensorFlow's gRPC server listens on
    **every interface** on the task's port, whatever host the cluster spec
    gives. `GrpcServer::Init` in
    `tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc` calls
    `builder.AddListeningPort(strings::StrCat("0.0.0.0:", requested_port), ...)`.
    On TF 2.21 gRPC makes that a dual-stack socket (`[::]:PORT` in
    `/proc/net/tcp6`, so IPv4 too), and a failed bind logs "No address added
    out of total 1 resolved for '0.0.0.0:PORT'". The host in the task's
    address only names the server (its `target`, and how it addresses
    itself); `ServerDef.port` can override the port, never the host; no
    option or environment variable picks the interface (`TF_GRPC_REUSE_PORT`
    only toggles `SO_REUSEPORT`, `TF_GRPC_DEFAULT_OPTIONS` only configures
    client channels). So a server started for `127.0.0.1:2222` accepts
    connections from other machines on port 2222, and whoever reaches that
    port can run ops in this process. Outside a trusted network, block the
    ports with a firewall, or run the cluster in a private network, its own
    network namespace or a container.

    Args:
        config: The cluster, with this process's task set.
        out: Where the status lines go. Defaults to `sys.stdout`.
        security_note: Print the note on the open port. Defaults to `True`;
            `keras-psdist launch` says it once for all its servers instead.

    Returns:
        0 once stopped by SIGTERM or SIGINT.

    Raises:
        ValueError: If `config` has no task.
        RuntimeError: If called outside the main thread.
        PortInUseError: If another process holds the task's port.

    Examples:

    From a shell (the launcher does this for every ps and worker task):

        TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:2222"],
                                "worker": ["127.0.0.1:2223"]},
                    "task": {"type": "ps", "index": 0}}' keras-psdist serve
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "`serve` must run in the main thread: it waits for SIGTERM/SIGINT, "
            "and Python delivers signals to the main thread only."
        )
    out = sys.stdout if out is None else out
    name = config.task_name
    address = config.task_address
    check_port_free(address)

    # Handlers first: a SIGTERM during TensorFlow's slow import still stops us.
    stop = threading.Event()
    received: list[int] = []

    def _on_signal(signum, frame):
        received.append(signum)
        stop.set()

    previous = {
        signum: signal.signal(signum, _on_signal)
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        tf = import_tensorflow_without_keras()

        try:
            # Kept referenced until we return; TF cannot stop a started gRPC
            # server cleanly, so process exit is what ends it.
            _server = start_server(tf, config)
        except tf.errors.UnknownError as e:
            # What TF says when the bind fails, e.g. a port taken since the check.
            _, port = address.rsplit(":", 1)
            raise PortInUseError(
                f"TensorFlow could not start the gRPC server for {name} on port "
                f"{port} ({e.message}): most likely another process took the port. "
                "Free the port or give this task another port in TF_CONFIG.",
                int(port),
            ) from e
        print(
            READY_LINE.format(name=name, address=address, pid=os.getpid()),
            file=out,
            flush=True,
        )
        if security_note:
            print(
                SECURITY_NOTE.format(port=address.rsplit(":", 1)[1]),
                file=out,
                flush=True,
            )
        # Wake up now and then: Python runs signal handlers only between
        # bytecodes of the main thread, never inside TF's `server.join()`.
        while not stop.wait(timeout=0.5):
            pass
        why = signal.Signals(received[0]).name if received else "stop"
        print(f"keras-psdist serve: stopping {name} ({why})", file=out, flush=True)
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def start_server(tf: types.ModuleType, config: ClusterConfig) -> object | None:
    """Starts `config`'s own task's gRPC server.

    A worker task gets `tf.distribute.Server(config.cluster_spec(), ...)`.
    A ps task's server is started by this process's eager context instead
    (`tf.config.experimental_connect_to_cluster` on a cluster of the task
    alone), which registers that context with its own server before the
    port opens. A ps with no eager context of its own crashes now and then
    when several workers connect to it at once, as those of a between-graph
    run do (TensorFlow 2.21; about 1 launch in 300 on a loaded 2-core
    machine):

    `EagerServiceImpl::CreateContext`, for a request that finds the server
    with no eager context, replaces the server-wide collective executor
    manager (`WorkerEnv::collective_executor_mgr`, made for the client's
    cluster by `CreateProdRpcCollectiveExecutorMgr`) and deletes the old
    one; the new `EagerContext` keeps a raw pointer to its manager. The
    request looks for a context when it starts but adds its own only at
    the end, so two requests that overlap both replace, and the first
    one's context is left with a deleted manager. That context uses it for
    every kernel it creates on the ps (`GetOrCreateKernelAndDevice` →
    `CollectiveExecutorMgr::FindOrCreate`, a virtual call, a lock and a
    map insert): SIGSEGV there, unless the freed block was handed out again
    to an object of the same kind. A server that holds a context of its
    own never replaces the manager: every remote context shares its first
    one. `tests/scripts/serve_race.py` reproduces the crash and counts the
    replacements.

    Worker tasks are served as before: an in-graph worker has one client,
    the chief (no overlap), and the collectives it runs need the manager
    made for the chief's cluster, which a context of its own would keep it
    from getting.

    A ps task runs each op on one thread (TensorFlow's default is one per
    core), unless `KERAS_PSDIST_PS_INTRA_OP_THREADS` says otherwise. Its
    ops are a step's reads and updates, elementwise and over tensors of a
    few MB at most: split over threads, each op paid a hand-off and a
    wake-up, and between steps the idle threads spun. Independent ops, and
    the requests of several workers, still run in parallel (the inter-op
    pool). Measured on the scaling MLP, async, one worker: 20 % less ps
    CPU per update, and no fewer updates/s (docs/benchmarks.md, "The ps
    task's threads and the optimizer's step counter").

    Returns:
        The `tf.distribute.Server` of a worker task, to keep referenced;
        `None` for a ps task (its eager context holds its server).

    Raises:
        tf.errors.UnknownError: If the server cannot bind its port.
        ValueError: If `KERAS_PSDIST_PS_INTRA_OP_THREADS` is not a whole
            number (0 or more).
    """
    if config.task_type != "ps":
        return tf.distribute.Server(
            config.cluster_spec(),
            job_name=config.task_type,
            task_index=config.task_id,
            protocol="grpc",
            start=True,
        )
    tf.config.threading.set_intra_op_parallelism_threads(ps_intra_op_threads())
    # Only this task: the context would otherwise open one on every other
    # task of the cluster, and wait for them to start.
    tf.config.experimental_connect_to_cluster(
        config.cluster_spec({config.task_type: [config.task_id]}),
        job_name=config.task_type,
        task_index=config.task_id,
        make_master_device_default=False,
    )
    # The context starts the server when it initializes; listing the
    # devices initializes it.
    tf.config.list_logical_devices()
    return None


def ps_intra_op_threads(environ=None) -> int:
    """The intra-op threads of a ps task: `KERAS_PSDIST_PS_INTRA_OP_THREADS`,
    or 1 (see `start_server`); 0 is TensorFlow's default (one per core), as
    in `tf.config.threading.set_intra_op_parallelism_threads`.

    Examples:

    >>> ps_intra_op_threads({})
    1
    >>> ps_intra_op_threads({"KERAS_PSDIST_PS_INTRA_OP_THREADS": "4"})
    4
    """
    environ = os.environ if environ is None else environ
    text = environ.get(PS_INTRA_OP_THREADS_ENV, "1")
    try:
        threads = int(text)
    except ValueError:
        threads = -1
    if threads < 0:
        raise ValueError(
            f"{PS_INTRA_OP_THREADS_ENV} must be a whole number of threads (0 "
            f"for TensorFlow's default, one per core); received {text!r}. "
            "Unset it for one thread per op, or set e.g. 4 for a ps of few, "
            "very large variables."
        )
    return threads


class _KerasRefused(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the `keras` package (so its location is known) but refuses to
    run it."""

    def find_spec(self, name, path=None, target=None):
        if name != "keras":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = self
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError("Keras is not loaded in a `keras-psdist serve` process")


def import_tensorflow_without_keras():
    """`import tensorflow`, without the Keras import TensorFlow starts itself.

    `tensorflow/__init__.py` imports Keras's optimizers eagerly (and with
    it all of Keras, and what Keras imports when installed: scikit-learn,
    matplotlib), inside a `try` that passes over an `ImportError`. A server
    process runs no Python of ours or of Keras's once started (remote
    workers run ops in it), so it skips that: `python -c` of the import
    takes about 4 s instead of 7 (TF 2.21 on a 2-core x86 machine; the
    server is up in about 3 s instead of 5), on the path of every launch,
    whose workers wait until the servers are up. `tf.keras` is the one name
    that would not work in this process; `import keras` still does (the
    refusal ends with this call).

    Examples:

    >>> import sys
    >>> tf = import_tensorflow_without_keras()
    >>> tf.distribute.Server.__name__
    'Server'
    """
    refuse = _KerasRefused()
    sys.meta_path.insert(0, refuse)
    try:
        import tensorflow as tf
    finally:
        sys.meta_path.remove(refuse)
    return tf
