"""A stand-in training script for the launcher tests (no TensorFlow: fast).

Usage: python fake_trainer.py ACTION REPORT_DIR

Writes REPORT_DIR/<task>.json with its pid, its TF_CONFIG and the pid of a
grandchild it may start, prints "TF_CONFIG=<json>" and "started", then:

- ok: exits 0.
- fail_worker_1: exits 3 if it is worker:1, else hangs like `hang`.
- fail_worker_0: exits 3 if it is worker:0 (the chief), else hangs.
- hang: starts a sleeping grandchild (same process group) and sleeps.
- hang_ignore_term: like `hang`, but ignores SIGTERM (needs SIGKILL).
- flaky_worker_1: worker:1 exits 3 on its first start; started again, it
  writes REPORT_DIR/recovered and exits 0. The others exit 0 once
  `recovered` exists (or after 60 s, exit 1).
- lose_worker_1: worker:1 exits 3 at every start; the others exit 0 after
  2 s.
- listen_briefly: listens on its TF_CONFIG address for 2 s (as a training
  process's own server does), then exits 0.
- elastic: (an elastic launch) trains until its leave file exists (exit 0),
  REPORT_DIR/stop exists (exit 0) or REPORT_DIR/fail-<task> exists (exit 3);
  after 120 s, exit 1.

As the evaluator (`launch(evaluator=True)`, task `evaluator:0`): with `ok`
it waits (up to 60 s) for the launcher's stop file and reports its scheduling policy
and whether the stop file was there; with `evaluator_fails` it exits 5 at
once while the workers exit 0 after 2 s.
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
    if action in ("ok", "evaluator_fails") and task["type"] == "evaluator":
        return _evaluator(action, name, report_dir)
    if action == "evaluator_fails":
        time.sleep(2)  # training goes on after the evaluator failed
        action = "ok"
    if action == "listen_briefly":
        _listen_briefly(tf_config, task)
        action = "ok"
    if action in ("flaky_worker_1", "lose_worker_1"):
        return _faulty(action, name, report_dir)
    if action == "elastic":
        return _elastic(name, tf_config, report_dir)
    fails = (action, name) in (
        ("fail_worker_1", "worker:1"),
        ("fail_worker_0", "worker:0"),
    )
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


def _listen_briefly(tf_config: str, task: dict) -> None:
    import socket

    address = json.loads(tf_config)["cluster"][task["type"]][task["index"]]
    host, _, port = address.rpartition(":")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
        s.listen()
        time.sleep(2)


def _evaluator(action: str, name: str, report_dir: str) -> int:
    print("started", flush=True)
    if action == "evaluator_fails":
        print("failing on purpose", file=sys.stderr)
        return 5
    stop = os.environ["KERAS_PSDIST_EVALUATOR_STOP_FILE"]
    deadline = time.monotonic() + 60
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.05)
    report = {
        "pid": os.getpid(),
        "grandchild": None,
        "tf_config": os.environ["TF_CONFIG"],
        "scheduler": os.sched_getscheduler(0),
        "stopped_by_the_launcher": os.path.exists(stop),
        "workers_done": sorted(
            f for f in os.listdir(report_dir) if f.startswith("worker")
        ),
    }
    with open(os.path.join(report_dir, f"{name}.json"), "w") as f:
        json.dump(report, f)
    return 0


def _faulty(action: str, name: str, report_dir: str) -> int:
    starts = os.path.join(report_dir, f"starts_{name.replace(':', '_')}")
    with open(starts, "a") as f:
        f.write(f"{os.getpid()}\n")
    with open(starts) as f:
        start = len(f.read().split())
    print(f"{name} start {start}", flush=True)
    recovered = os.path.join(report_dir, "recovered")
    if name == "worker:1":
        if action == "lose_worker_1" or start == 1:
            print("failing on purpose", file=sys.stderr)
            return 3
        open(recovered, "w").close()
        return 0
    if action == "lose_worker_1":
        time.sleep(2)
        return 0
    deadline = time.monotonic() + 60
    while not os.path.exists(recovered):
        if time.monotonic() > deadline:
            return 1
        time.sleep(0.05)
    return 0


def _elastic(name: str, tf_config: str, report_dir: str) -> int:
    path = os.path.join(report_dir, f"{name}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "grandchild": None, "tf_config": tf_config}, f)
    os.replace(path + ".tmp", path)
    print("started", flush=True)
    leave = os.environ["KERAS_PSDIST_LEAVE_FILE"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.exists(leave) or os.path.exists(os.path.join(report_dir, "stop")):
            print("leaving", flush=True)
            return 0
        if os.path.exists(os.path.join(report_dir, f"fail-{name}")):
            print("failing on purpose", file=sys.stderr)
            return 3
        time.sleep(0.05)
    return 1


if __name__ == "__main__":
    sys.exit(main())
