"""Starting the test clusters' Python processes without importing
TensorFlow in each: a zygote imports it once, and forks a process per task.

Importing TensorFlow, Keras and keras_psdist takes ~6 CPU-seconds, and the
multiprocess tests start some two hundred task processes (ps servers,
workers, chiefs) on a 2-core machine: most of their cost was that import.
The zygote (`python zygote.py serve DIR`) imports them once, without
starting TensorFlow's runtime (no device, no context, no thread pool: a fork
is then as safe as a fresh start), with the rest of keras_psdist and its
objects frozen out of the forks' garbage collections (`preload`), and
listens on a Unix socket. A task's command is then `python -S -E zygote.py
run script.py args...` instead of `python script.py args...` (`command`):
that client sends its arguments, environment, working directory and standard
streams to the zygote, which forks; the fork enters the client's network
namespace (a test host's, `ip netns exec`), its scheduling class and its
streams, and runs the script as `__main__`. The client stays as the task's
process for the launcher: it passes on the signals it gets (SIGTERM, SIGINT,
SIGCONT, ...) to the fork's process group (the zygote tells it the fork's
pid), and exits with the fork's status (killed by signal N: it kills itself
with N). When the client dies (SIGKILL), the zygote sees its socket close
and kills the fork's group; when the zygote dies, its forks get SIGKILL
(`PR_SET_PDEATHSIG`).

Only what the zygote can run exactly as a fresh `python` would is sent to
it: `script.py ...` or `-m module ...`, with the same environment variables
that take effect at import (`IMPORT_TIME_ENV`, e.g. `TF_CPP_MIN_LOG_LEVEL`,
fixed by TensorFlow's first log line). Anything else, or no zygote running,
and the client `exec`s the real interpreter with the same arguments. One
difference is on purpose: a fork's temporary files go in the zygote's
directory, not /tmp, so that `stop` removes those of a task the test killed.

For the tests only (`launching.launch_job` uses it); the library's launcher
is unchanged, and the benchmarks run fresh interpreters.
"""

import hashlib
import json
import os
import signal
import socket
import struct
import sys

# Set to "0" to start every task of the tests as a fresh interpreter
# instead of a fork of the zygote.
FORKS_ENV = "KERAS_PSDIST_TEST_ZYGOTE_FORKS"

# The directory of the running zygote's socket (set by `start` for the
# processes the test process starts).
DIR_ENV = "KERAS_PSDIST_TEST_ZYGOTE"

# Variables read when TensorFlow, Keras or numpy are imported (or on
# TensorFlow's first log line, which the import writes): a task whose values
# differ from the zygote's runs a fresh interpreter.
IMPORT_TIME_ENV = (
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_CPP_MAX_VLOG_LEVEL",
    "TF_CPP_VMODULE",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_XLA_FLAGS",
    "CUDA_VISIBLE_DEVICES",
    "KERAS_BACKEND",
    "KERAS_HOME",
    "PYTHONHASHSEED",
    "PYTHONPATH",
    "PYTHONWARNINGS",
    "PYTHONDONTWRITEBYTECODE",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
)

# The signals the client passes on to the fork's process group.
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGCONT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
)

_HEADER = struct.Struct("!I")
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1


def _key(environ) -> str:
    values = {name: environ.get(name) for name in IMPORT_TIME_ENV}
    text = json.dumps([sys.executable, values], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def socket_path(directory: str, environ=os.environ) -> str:
    """Where the zygote for `environ`'s import-time variables listens."""
    return os.path.join(directory, f"zygote-{_key(environ)}.sock")


def python(environ=None) -> list:
    """The words that stand for `python` in a command run in `environ`
    (default this process's): the zygote's client when a zygote is running
    for it (`ensure_running`), else the plain interpreter."""
    environ = os.environ if environ is None else environ
    directory = environ.get(DIR_ENV)
    if directory and os.path.exists(socket_path(directory, environ)):
        return [sys.executable, "-S", "-E", os.path.abspath(__file__), "run"]
    return [sys.executable]


def command(args, environ=None) -> list:
    """`[python, *args]` (`python`)."""
    return [*python(environ), *args]


def enabled() -> bool:
    """Whether the tests fork their tasks from a zygote (`FORKS_ENV`)."""
    return os.environ.get(FORKS_ENV, "1") != "0"


def python_in(environ) -> tuple:
    """`(environment, words for python)` to run a test's command in
    `environ`: a zygote started for it and its client, or, with `FORKS_ENV`
    = 0, `environ` as given and the plain interpreter."""
    if not enabled():
        return dict(environ), [sys.executable]
    environ = ensure_running(environ)
    return environ, python(environ)


_servers = {}  # socket path -> the Popen of a zygote this process started
_made_directory = None  # the sockets' directory, if this process made it


def ensure_running(environ=None, timeout_s: float = 120.0) -> dict:
    """Starts a zygote for `environ` (default: this process's environment)
    unless one is running for its import-time variables (this process's or
    a parent test process's, `DIR_ENV`); stopped by `stop`, or when this
    process exits. Returns `environ` with `DIR_ENV` set: the environment to
    run `command(args, environ)` in. Raises RuntimeError, with the zygote's
    log, if it does not come up."""
    import atexit
    import subprocess
    import tempfile
    import time

    global _made_directory
    directory = os.environ.get(DIR_ENV)
    if not directory:
        directory = _made_directory = tempfile.mkdtemp(prefix="kpd-zygote-")
        os.environ[DIR_ENV] = directory
    environ = dict(os.environ if environ is None else environ, **{DIR_ENV: directory})
    path = socket_path(directory, environ)
    if os.path.exists(path):
        return environ
    log_path = path[: -len(".sock")] + ".log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", directory],
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    if not _servers:
        atexit.register(stop)
    _servers[path] = proc
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(log_path, errors="replace") as f:
                text = f.read()[-4000:]
            _stop_one(path)
            raise RuntimeError(f"the test zygote did not start:\n{text}")
        time.sleep(0.05)
    return environ


def forks() -> set:
    """The pids of the running forks of the zygotes this process started
    (read from `/proc`: each zygote's children)."""
    return {int(pid) for text in _per_thread("children") for pid in text.split()}


def thread_names() -> list:
    """The names of the threads of the zygotes this process started (from
    `/proc`)."""
    return [text.strip() for text in _per_thread("comm")]


def _per_thread(name: str) -> list:
    """The text of `/proc/PID/task/TID/<name>` for every thread of every
    zygote this process started (those gone in between left out)."""
    texts = []
    for proc in _servers.values():
        try:
            threads = os.listdir(f"/proc/{proc.pid}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{proc.pid}/task/{thread}/{name}") as f:
                    texts.append(f.read())
            except OSError:
                pass
    return texts


def _stop_one(path: str) -> None:
    import subprocess

    proc = _servers.pop(path)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop() -> None:
    """Stops the zygotes this process started (their running forks too)."""
    import shutil

    global _made_directory
    for path in list(_servers):
        _stop_one(path)
    if _made_directory is not None:
        if os.environ.get(DIR_ENV) == _made_directory:
            del os.environ[DIR_ENV]
        shutil.rmtree(_made_directory, ignore_errors=True)
        _made_directory = None


# The client: the task's process, as the launcher sees it.


def _fresh(args) -> None:
    os.execv(sys.executable, [sys.executable, *args])


def _runnable(args) -> bool:
    if not args:
        return False
    if args[0] == "-m":
        return len(args) >= 2
    return not args[0].startswith("-")


def _recv_exactly(conn, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return data
        data += chunk
    return data


def run_client(args) -> None:
    directory = os.environ.get(DIR_ENV)
    path = socket_path(directory) if directory else None
    if not _runnable(args) or path is None or not os.path.exists(path):
        _fresh(args)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        _fresh(args)
    request = json.dumps(
        {"args": list(args), "env": dict(os.environ), "cwd": os.getcwd()}
    ).encode()
    socket.send_fds(conn, [_HEADER.pack(len(request))], [0, 1, 2])
    conn.sendall(request)

    lines = conn.makefile("rb")

    def answer() -> list:
        line = lines.readline()
        if not line.endswith(b"\n"):
            sys.stderr.write(
                "zygote: the zygote went away; the task's state is unknown\n"
            )
            os._exit(70)
        return line.decode().split()

    # The fork's pid first, then "exit N" or "signal N" when it ends.
    _, pid = answer()
    pid = int(pid)

    def forward(signum, _frame) -> None:
        _signal_fork(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    kind, value = answer()
    if kind == "signal":
        signum = int(value)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(int(value))


# The zygote.


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _enter_client(conn, request, fds) -> None:
    """In the fork: become the client's task (its namespace, scheduling,
    streams, environment, directory)."""
    import ctypes
    import io

    os.setsid()
    libc = _libc()
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    pid, _, _ = struct.unpack(
        "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    )
    theirs = f"/proc/{pid}/ns/net"
    if os.stat(theirs).st_ino != os.stat("/proc/self/ns/net").st_ino:
        fd = os.open(theirs, os.O_RDONLY)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {theirs} failed")
        os.close(fd)
    policy = os.sched_getscheduler(pid)
    if policy != os.sched_getscheduler(0):
        os.sched_setscheduler(0, policy, os.sched_getparam(pid))
    nice = os.getpriority(os.PRIO_PROCESS, pid)
    if nice != os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), line_buffering=True, write_through=unbuffered
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()


def _run_task(conn, request, fds, base_path, imports_set) -> None:
    """In the fork: run the script or module as `__main__`; never returns."""
    import atexit
    import runpy
    import threading
    import traceback

    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _enter_client(conn, request, fds)
        for name, value in imports_set.items():
            os.environ.setdefault(name, value)
        conn.close()
        args = request["args"]
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[:] = [os.getcwd(), *extra, *base_path]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(args[0])
            sys.argv = list(args)
            sys.path[:] = [os.path.dirname(script), *extra, *base_path]
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code & 0xFF)


def serve(directory: str) -> None:
    """Imports what the tasks import, then forks one process per request on
    `socket_path(directory)` until SIGTERM."""
    import select
    import tempfile

    # The socket's name is the environment's before the imports, which set
    # variables of their own (TF2_BEHAVIOR, KMP_INIT_AT_FORK, ...): each
    # fork gets those on top of its client's environment, as a fresh
    # interpreter would after the same imports.
    path = socket_path(directory)
    # A test process that dies without stopping its zygote stops it too.
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    before = dict(os.environ)
    import keras  # noqa: F401
    import numpy  # noqa: F401
    import sklearn.datasets  # noqa: F401
    import sklearn.model_selection  # noqa: F401
    import tensorflow  # noqa: F401

    import keras_psdist
    import keras_psdist.cli.main  # noqa: F401

    preload(keras_psdist)
    # The forks' temporary files (autograph's converted functions, which a
    # task removes at exit, but not one the tests kill) go in the sockets'
    # directory, which `stop` removes: a killed task leaves none in /tmp.
    tempfile.tempdir = os.path.join(directory, f"tmp-{os.getpid()}")
    os.makedirs(tempfile.tempdir, exist_ok=True)
    imports_set = {k: v for k, v in os.environ.items() if before.get(k) != v}
    base_path = list(sys.path[1:])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    children = {}  # pid -> the connection to answer when it ends
    print(f"zygote pid {os.getpid()} listening on {path}", flush=True)
    gone = set()  # forks whose client went away (killed: no one to answer)
    while not stop:
        waiting = {conn: pid for pid, conn in children.items() if pid not in gone}
        try:
            readable, _, _ = select.select([listener, *waiting], [], [], 0.05)
        except InterruptedError:
            readable = []
        for conn in readable:
            if conn is listener:
                _fork_one(listener, children, base_path, imports_set)
            elif not conn.recv(16):
                # The client is gone (SIGKILL): so is its task.
                gone.add(waiting[conn])
                _signal_fork(waiting[conn], signal.SIGKILL)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            gone.discard(pid)
            conn = children.pop(pid, None)
            if conn is None:
                continue
            if os.WIFSIGNALED(status):
                answer = f"signal {os.WTERMSIG(status)}\n"
            else:
                answer = f"exit {os.waitstatus_to_exitcode(status)}\n"
            try:
                conn.sendall(answer.encode())
            except OSError:
                pass
            conn.close()
    listener.close()
    os.unlink(path)
    for pid in children:
        _signal_fork(pid, signal.SIGKILL)


def preload(package) -> None:
    """Imports every public module of `package` (keras_psdist, whose
    `__getattr__` imports them on first use), then moves every object the
    zygote holds to the garbage collector's permanent generation
    (`gc.freeze`).

    Both spare each fork work that a fresh interpreter would do alike:
    - the imports: a training task imports the strategies, rules, attacks
      and compressors (about 0.3 CPU-seconds after what `serve` imports
      first). They start no TensorFlow runtime: they build no tensor and
      list no device, so a fork is still as safe as a fresh start
      (`test_zygote` checks that the zygote runs no thread of TensorFlow's
      runtime).
    - the collections: the zygote holds about 370,000 objects that the
      collector tracks (TensorFlow, Keras), and each full collection in a
      fork went through all of them (about 0.25 CPU-seconds each, and it
      touched each object's page, which the fork then copied). Frozen, they
      are never collected: they live as long as the fork anyway.
    """
    import gc

    for name in package.__all__:
        getattr(package, name)
    gc.collect()
    gc.freeze()


def _signal_fork(pid: int, signum: int) -> None:
    """`signum` to the fork's process group (to the fork alone if it has
    not made its group yet)."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _fork_one(listener, children, base_path, imports_set) -> None:
    """Reads a client's request and forks its task; tells the client the
    fork's pid."""
    conn, _ = listener.accept()
    try:
        head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
        request = json.loads(_recv_exactly(conn, _HEADER.unpack(head)[0]))
    except Exception as e:  # a client that died while asking
        print(f"zygote: dropped a request: {e!r}", flush=True)
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in children.values():
            other.close()
        _run_task(conn, request, fds, base_path, imports_set)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    try:
        conn.sendall(f"pid {pid}\n".encode())
    except OSError:
        pass


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "run":
        run_client(sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit("usage: zygote.py serve DIR | zygote.py run script.py args...")
