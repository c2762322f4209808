"""A stand-in training script for the launcher tests (no TensorFlow: fast).

Usage: python fake_trainer.py ACTION REPORT_DIR

Writes REPORT_DIR/<task>.json with its pid, its TF_CONFIG and the pid of a
grandchild it may start, prints "TF_CONFIG=<json>" and "started", then:

- ok: exits 0.
- fail_worker_1: exits 3 if it is worker:1, else hangs like `hang`.
- hang: starts a sleeping grandchild (same process group) and sleeps.
- hang_ignore_term: like `hang`, but ignores SIGTERM (needs SIGKILL).
"""

import json
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    action, report_dir = sys.argv[1], sys.argv[2]
    tf_config = os.environ["TF_CONFIG"]
    task = json.loads(tf_config)["task"]
    name = f"{task['type']}:{task['index']}"
    fails = action == "fail_worker_1" and name == "worker:1"
    grandchild = None
    if action != "ok" and not fails:
        if action == "hang_ignore_term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        grandchild = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"]
        ).pid
    report = {"pid": os.getpid(), "grandchild": grandchild, "tf_config": tf_config}
    path = os.path.join(report_dir, f"{name}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)
    print(f"TF_CONFIG={tf_config}")
    print("started", flush=True)
    if action == "ok":
        return 0
    if fails:
        print("failing on purpose", file=sys.stderr)
        return 3
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
