"""Reproduces the ps crash of TensorFlow 2.21's gRPC server when several
between-graph workers connect to it at once (see
`keras_psdist.cluster.server.start_server` for the cause).

    python tests/scripts/serve_race.py --check gdb --server bare --runs 10
    python tests/scripts/serve_race.py --check valgrind --server serve

Each run starts one ps task, then `--workers` clients that import TensorFlow
and connect to it at the same instant (each with the cluster `{ps, itself}`,
as a between-graph worker does), and run a few ops on the ps that each need a
new kernel there. `--server` picks the ps: `bare`, a plain
`tf.distribute.Server` (what `keras-psdist serve` ran before), or `serve`,
`keras-psdist serve` from this checkout. `--check` picks what is looked at:

- `none`: only whether the ps dies (SIGSEGV) during the run.
- `gdb`: gdb, attached to the ps before the clients connect, counts the calls
  to `tensorflow::CreateProdRpcCollectiveExecutorMgr`: the server replaces its
  collective executor manager (deleting the old one) once per connection that
  finds it with no eager context. Two or more replacements in a run leave the
  earlier context with a deleted manager. gdb's stops widen the race's window,
  so overlapping connections, and the crash, are more frequent than without.
- `valgrind`: the ps runs under valgrind's memcheck (a run takes minutes);
  the count is of invalid accesses in `CollectiveExecutorMgr::FindOrCreate`
  to memory freed by `EagerServiceImpl::CreateContext`. The server may also
  die of SIGSEGV.

Prints one line per run and the totals. `--check gdb` and `valgrind` need
the tool on PATH (`apt-get install gdb valgrind`). Each run starts
`--workers` + 1 TensorFlow processes at once.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY = "listening on"
# Exit code when gdb may not attach (no ptrace permission, e.g. in some
# containers): the check cannot run there.
EXIT_CANNOT_ATTACH = 3
# Seconds from the ps being up to the clients connecting: their TensorFlow
# import must be over by then.
CONNECT_AFTER_S = {"none": 15.0, "gdb": 15.0, "valgrind": 25.0}
PS = "/job:ps/replica:0/task:0/device:CPU:0"


def run_bare_server() -> None:
    """The ps as `keras-psdist serve` ran it before: a bare tf.distribute.Server."""
    import tensorflow as tf

    tf_config = json.loads(os.environ["TF_CONFIG"])
    server = tf.distribute.Server(
        tf.train.ClusterSpec(tf_config["cluster"]),
        job_name="ps",
        task_index=0,
        protocol="grpc",
        start=True,
    )
    print(f"bare server: ps:0 {READY} {server.target}", flush=True)
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    signal.sigwait(stop)
    os._exit(0)


def run_client(connect_at: float) -> None:
    """A between-graph worker: connects at `connect_at` (wall clock), then
    creates a few variables on the ps (each a new kernel there)."""
    import tensorflow as tf
    from tensorflow.python.ops import gen_resource_variable_ops as gen

    tf_config = json.loads(os.environ["TF_CONFIG"])
    index = tf_config["task"]["index"]
    spec = tf.train.ClusterSpec(
        {
            "ps": {0: tf_config["cluster"]["ps"][0]},
            "worker": {index: tf_config["cluster"]["worker"][index]},
        }
    )
    time.sleep(max(0.0, connect_at - time.time()))
    tf.config.experimental_connect_to_cluster(
        spec, job_name="worker", task_index=index, make_master_device_default=True
    )
    for k in range(20):
        with tf.device(PS):
            handle = gen.var_handle_op(
                shape=[], dtype=tf.float32, shared_name=f"v{index}_{k}", name="v"
            )
            gen.assign_variable_op(handle, tf.constant(1.0))
            gen.read_variable_op(handle, tf.float32).numpy()
    print("client done", flush=True)


def _free_ports(n: int) -> list[int]:
    from keras_psdist.cluster.ports import pick_free_ports

    return pick_free_ports(n)


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no {text!r} in {path}:\n{path.read_text()[-3000:]}")
        time.sleep(0.1)


def one_run(args, work: Path) -> dict:
    ports = _free_ports(1 + args.workers)
    cluster = {
        "ps": [f"127.0.0.1:{ports[0]}"],
        "worker": [f"127.0.0.1:{p}" for p in ports[1:]],
    }
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    def task_env(kind, index):
        task = {"type": kind, "index": index}
        return dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": task}))

    if args.server == "bare":
        command = [sys.executable, __file__, "--role", "bare-server"]
    else:
        command = [sys.executable, "-m", "keras_psdist", "serve"]
    if args.check == "valgrind":
        command = [
            "valgrind",
            "--tool=memcheck",
            "--undef-value-errors=no",
            "--leak-check=no",
            "--num-callers=30",
            f"--log-file={work}/valgrind.%p.log",
            *command,
        ]
    server_log = work / "server.log"
    server = subprocess.Popen(
        command,
        env=dict(task_env("ps", 0), PYTHONMALLOC="malloc"),
        stdout=server_log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    gdb = None
    try:
        _wait_for(server_log, READY, server, 600)
        if args.check == "gdb":
            gdb = _attach_gdb(server.pid, work / "gdb.log")
        connect_at = time.time() + CONNECT_AFTER_S[args.check]
        clients = [
            subprocess.Popen(
                [sys.executable, __file__, "--role", "client", str(connect_at)],
                env=task_env("worker", i),
                stdout=(work / f"worker{i}.log").open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for i in range(args.workers)
        ]
        deadline = time.monotonic() + 600
        while any(c.poll() is None for c in clients) and server.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        died = server.poll()
        for c in clients:
            if c.poll() is None:
                os.killpg(c.pid, signal.SIGKILL)
            c.wait()
    finally:
        if gdb is not None:
            gdb.send_signal(signal.SIGINT)  # Detaches (see _attach_gdb).
            try:
                gdb.wait(60)
            except subprocess.TimeoutExpired:
                gdb.kill()
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(300)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    result = {
        "server died": died,
        "clients": [c.returncode for c in clients],
    }
    if args.check == "gdb":
        text = (work / "gdb.log").read_text(errors="replace")
        result["replacements"] = text.count("REPLACED")
    elif args.check == "valgrind":
        result["use after free"] = sum(
            _uses_after_free(p.read_text(errors="replace"))
            for p in work.glob("valgrind.*.log")
        )
    return result


# The breakpoint also resolves to the function's PLT stub, which every call
# passes through first: only the function itself counts.
GDB_SCRIPT = """\
set pagination off
handle SIGPIPE nostop noprint pass
python
replaced = gdb.Breakpoint("tensorflow::CreateProdRpcCollectiveExecutorMgr")
for location in replaced.locations:
    if "@plt" in gdb.execute(f"info symbol {location.address}", to_string=True):
        location.enabled = False
end
commands 1
silent
printf "REPLACED\\n"
continue
end
printf "ATTACHED\\n"
continue
printf "STOPPED\\n"
bt 12
"""


class CannotAttach(RuntimeError):
    pass


def _attach_gdb(pid: int, log: Path) -> subprocess.Popen:
    """gdb on `pid`, printing REPLACED at each manager replacement."""
    script = log.with_suffix(".gdb")
    script.write_text(GDB_SCRIPT)
    gdb = subprocess.Popen(
        ["gdb", "-q", "-batch", "-p", str(pid), "-x", str(script)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_for(log, "ATTACHED", gdb, 300)
    except RuntimeError as e:
        gdb.kill()
        raise CannotAttach(log.read_text(errors="replace")[-1000:]) from e
    return gdb


def _uses_after_free(text: str) -> int:
    """Invalid accesses in CollectiveExecutorMgr::FindOrCreate to a block
    freed by EagerServiceImpl::CreateContext."""
    count = 0
    for error in re.split(r"==\d+== (?=Invalid)", text)[1:]:
        accessed, _, rest = error.partition("free'd")
        if "CollectiveExecutorMgr::FindOrCreate" in accessed and (
            "EagerServiceImpl::CreateContext" in rest.split("alloc'd")[0]
        ):
            count += 1
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", choices=("none", "gdb", "valgrind"), default="gdb")
    parser.add_argument("--server", choices=("bare", "serve"), default="serve")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--keep", help="Keep each run's logs under this directory.")
    parser.add_argument("--json", help="Also write the runs' results to this file.")
    parser.add_argument("--role", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        if args.role[0] == "bare-server":
            run_bare_server()
        else:
            run_client(float(args.role[1]))
        return 0
    tool = args.check
    if tool != "none" and shutil.which(tool) is None:
        sys.exit(f"{tool} is not on PATH: apt-get install {tool}")
    results = []
    for i in range(args.runs):
        work = Path(args.keep or tempfile.mkdtemp(prefix="serve_race_")) / f"run{i}"
        work.mkdir(parents=True, exist_ok=True)
        try:
            result = one_run(args, work)
        except CannotAttach as e:
            print(f"gdb cannot attach to the ps: {e}", file=sys.stderr)
            return EXIT_CANNOT_ATTACH
        results.append(result)
        print(f"run {i} ({args.server}, {args.check}): {result}", flush=True)
        if not args.keep:
            shutil.rmtree(work.parent, ignore_errors=True)
    died = [r["server died"] for r in results]
    summary = (
        f"{args.server}, {args.check}, {args.workers} workers, {len(results)} "
        f"runs: the ps died in {sum(d is not None for d in died)} ({died})"
    )
    if args.check == "gdb":
        counts = [r["replacements"] for r in results]
        summary += (
            f"; manager replacements per run {counts}, two or more (a context "
            f"left with a deleted manager) in {sum(c >= 2 for c in counts)}"
        )
    elif args.check == "valgrind":
        counts = [r["use after free"] for r in results]
        summary += f"; uses after free per run {counts}"
    print(summary, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
