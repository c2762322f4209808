"""A small Keras job for a real Slurm step (tests/test_slurm_real.py):

    srun --ntasks 3 keras-psdist slurm --num-ps 1 --mode between-graph \\
        -- python slurm_job.py OUT_DIR

Every worker rank builds a linear model under
`PSStrategy(mode="between-graph")`, seeded differently (equal initial weights
then show the variables are the chief's, on the ps), trains it a few steps on
made-up data, waits until every worker has trained, reads the shared weights
and writes OUT_DIR/worker_<index>.json with what the test checks.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_psdist as kpd  # noqa: E402

BARRIER_TIMEOUT_S = 120


def made_up_data():
    """y = x . w + 1 with a fixed w, 256 examples of 8 features."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = x @ np.arange(1, 9, dtype=np.float32)[:, None] + 1.0
    return x, y


def checksum(model) -> float:
    return float(sum(np.abs(w.numpy()).sum() for w in model.weights))


def wait_for_every_worker(out_dir, stage, topology):
    """Marks this worker at `stage` and waits until every worker is."""
    with open(os.path.join(out_dir, f"{stage}_{topology.worker_index}"), "w"):
        pass
    expected = topology.num_training_processes
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while len([f for f in os.listdir(out_dir) if f.startswith(f"{stage}_")]) < (
        expected
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"not every worker reached {stage!r} in {BARRIER_TIMEOUT_S} s"
            )
        time.sleep(0.05)


def main(out_dir) -> int:
    strategy = kpd.PSStrategy(mode="between-graph")
    topology = strategy.extended.topology
    keras.utils.set_random_seed(topology.worker_index)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    initial = checksum(model)
    # The chief trains only once every worker has read the initial weights.
    wait_for_every_worker(out_dir, "built", topology)
    x, y = made_up_data()
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    steps = len(history.history["loss"]) * history.params["steps"]
    # Every worker reads the shared weights once all have trained.
    wait_for_every_worker(out_dir, "trained", topology)
    report = {
        "task": topology.config.task_name,
        "slurm_procid": os.environ.get("SLURM_PROCID"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "variable_devices": sorted(
            {p.device for p in strategy.extended.placement.variables}
        ),
        "is_chief": strategy.extended.should_checkpoint,
        "initial_checksum": initial,
        "final_checksum": checksum(model),
        "steps": steps,
        "iterations": int(model.optimizer.iterations.numpy()),
        "losses": history.history["loss"],
    }
    path = os.path.join(out_dir, f"worker_{topology.worker_index}.json")
    with open(path, "w") as f:
        json.dump(report, f)
    print(f"{report['task']}: trained {steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
