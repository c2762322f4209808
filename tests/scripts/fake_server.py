"""A stand-in for `keras-psdist serve` without TensorFlow, for launcher tests.

Listens on its TF_CONFIG task's port like the real server would; exits 75
(`PORT_IN_USE_EXIT_CODE`) when the port is taken; stops on SIGTERM.
"""

import json
import os
import signal
import socket
import sys


def main() -> int:
    tf_config = json.loads(os.environ["TF_CONFIG"])
    task = tf_config["task"]
    address = tf_config["cluster"][task["type"]][task["index"]]
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    try:
        sock.bind((host, int(port)))
    except OSError as e:
        print(f"fake server: port {port} is in use ({e})", file=sys.stderr)
        return 75
    sock.listen()
    name = f"{task['type']}:{task['index']}"
    # The launcher waits for the line `keras-psdist serve` prints when ready.
    print(
        f"keras-psdist serve: {name} listening on {address} (pid {os.getpid()})",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        sock.accept()[0].close()


if __name__ == "__main__":
    sys.exit(main())
