"""Reproduces TensorFlow 2.21's race between a remote variable's initial value
and the first function that writes it (see `keras_psdist.devices.device_variable`).

    python tests/scripts/remote_init_race.py --runs 400 --make plain
    python tests/scripts/remote_init_race.py --runs 400 --make device_variable
    python tests/scripts/remote_init_race.py --runs 400 --make shared_variables
    python tests/scripts/remote_init_race.py --make device_variable shared_variables  # both, one ps

Starts one ps task and connects to it as `chief:0`. Two threads run remote
functions on the ps all along (as the chief's training thread does while its
update service works). The main thread, `--runs` times, makes three new
`[256, 64]` variables of zeros on the ps (`--make plain`: a bare
`ResourceVariable`; `device_variable`: keras_psdist's, which waits for the
initial value; `shared_variables`: the chief's
`keras_psdist.cluster.shared_variables.SharedVariables.create`), writes ones
into them with one `tf.function`, and reads them back with another. Prints
how many reads did not see the ones, and exits 1 if any did
(`tests/test_remote_init.py` runs it). Measured on a 2-core machine, two such
processes at once: `plain` 2, 2, 3 and 6 of 400, 400, 600 and 300;
`device_variable` 0 of 1,700. `shared_variables`, one process, before
`SharedVariables.create` waited for its write: 112 of 200 and 68 of 100;
since: 0 of 300.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SHAPE = [256, 64]


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(cluster):
    import tensorflow as tf

    spec = tf.train.ClusterSpec(cluster)
    tf.distribute.Server(spec, job_name="ps", task_index=0, protocol="grpc").join()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument(
        "--make",
        choices=("plain", "device_variable", "shared_variables"),
        nargs="+",
        default=["plain"],
        help="the makers to check, one after another against the same ps",
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(json.loads(args.serve))
        return
    cluster = {
        "ps": [f"127.0.0.1:{_free_port()}"],
        "chief": [f"127.0.0.1:{_free_port()}"],
    }
    ps = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(cluster)])
    try:
        import tensorflow as tf

        from keras_psdist._tf import resource_variable_ops
        from keras_psdist.cluster.shared_variables import SharedVariables
        from keras_psdist.devices import device_variable

        time.sleep(4)  # the ps's server up
        tf.config.experimental_connect_to_cluster(
            tf.train.ClusterSpec(cluster), job_name="chief", task_index=0
        )
        device = "/job:ps/replica:0/task:0/device:CPU:0"
        with tf.device(device):
            busy_variable = tf.Variable(tf.zeros([512, 512]))
        stop = threading.Event()

        @tf.function
        def busy_step():
            with tf.device(device):
                busy_variable.assign_add(tf.ones([512, 512]))
                return tf.reduce_sum(busy_variable)

        def busy():
            while not stop.is_set():
                busy_step().numpy()

        @tf.function
        def write(variables):
            with tf.device(device):
                for v in variables:
                    v.assign(tf.ones(SHAPE), read_value=False)

        @tf.function
        def total(variables):
            with tf.device(device):
                return tf.add_n([tf.reduce_sum(v.read_value()) for v in variables])

        def make(kind, name):
            if kind == "device_variable":
                return device_variable(tf.zeros(SHAPE), device, name)
            if kind == "shared_variables":
                return shared.create(
                    device, tf.zeros(SHAPE), tf.TensorShape(SHAPE), tf.float32, name
                )
            with tf.init_scope(), tf.device(device):
                return resource_variable_ops.ResourceVariable(
                    tf.zeros(SHAPE), trainable=False, name=name
                )

        shared = SharedVariables(is_chief=True, chief="chief:0", init_timeout=10)
        threads = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()
        missed = 0
        for kind in args.make:
            missed_now = 0
            for run in range(args.runs):
                variables = [make(kind, f"{kind}_v{run}_{c}") for c in range(3)]
                write(variables)
                missed_now += float(total(variables).numpy()) != 3 * SHAPE[0] * SHAPE[1]
            print(
                f"{kind}: {missed_now} of {args.runs} reads missed the write",
                flush=True,
            )
            missed += missed_now
        stop.set()
        for thread in threads:
            thread.join()
    finally:
        ps.kill()
        ps.wait()
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
