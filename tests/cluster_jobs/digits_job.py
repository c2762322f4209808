"""A Keras training job on digits, run as one process of a cluster.

Run by `tests/test_cluster_training.py` under `keras-psdist launch` (its
TF_CONFIG says which task it is), and imported by the tests for the
one-process reference runs with the same replicas.

    python digits_job.py OUT_DIR MODE [SEED [then_partial_batches]]

writes `OUT_DIR/<task>.json` (what the test checks) and, in-graph,
`OUT_DIR/weights.npz`. In-graph it then trains a second model, with an
embedding table large enough for the strategy's partitioner to split it
over the ps tasks (`EMBEDDING_PARTITIONER`), and writes
`OUT_DIR/embedding_weights.npz`; and a third, `layer_zoo`'s layer types on
global batches smaller than the replica count (`OUT_DIR/zoo_weights.npz`),
trains a small model with `jit_compile=True` and without (the report's
`xla_max_weight_difference`), and runs every pattern of `tutorial_patterns` (the report's
`tutorial_patterns`). Between graphs, each worker then runs a custom loop
whose model and optimizer are built by its first traced step (the report's
`lazy_loop`).
With `then_partial_batches` the script then runs `partial_batches_job`'s
async and sync runs, writing into `OUT_DIR/partial_batches`.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import layer_zoo  # noqa: E402  (this directory: sys.path[0] or conftest.py)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

EPOCHS = 8
BATCH_SIZE = 60


def digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int32)


def build(strategy, seed=0, sgd_learning_rate=None, jit_compile="auto"):
    """The digits MLP under `strategy`, with Adam(0.003), or with a plain
    (momentum-free) `SGD(sgd_learning_rate)`: what worker momentum is meant
    to run with (docs/robustness.md); `jit_compile` as `compile`'s."""
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(0.003)
            if sgd_learning_rate is None
            else keras.optimizers.SGD(sgd_learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=jit_compile,
        )
    return model


# Splits tables of 32 KiB or more in two: the embedding model's table
# (1088 x 8 floats, 34 KiB), not the digits MLP's kernels (16 KiB at most).
EMBEDDING_PARTITIONER = {"num_shards": 2, "min_variable_bytes": 32 << 10}
INTENSITIES = 17


def build_embedding(strategy, seed=0):
    """A model with sparse gradients and a table worth splitting: each
    (pixel, intensity) pair has its own embedding row."""
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [
                keras.Input((64,), dtype="int32"),
                keras.layers.Embedding(64 * INTENSITIES, 8),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def embedding_digits():
    """Digits as row ids: pixel p at intensity v (0..16) is row 17 p + v."""
    x, y = digits()
    intensity = np.rint(x * (INTENSITIES - 1)).astype(np.int32)
    return np.arange(64, dtype=np.int32) * INTENSITIES + intensity, y


def _fit(model, x, y, seed, callbacks):
    """Trains on the first 1500 examples, seeded."""
    keras.utils.set_random_seed(seed)
    return model.fit(
        x[:1500],
        y[:1500],
        batch_size=BATCH_SIZE,
        epochs=EPOCHS,
        verbose=2,
        callbacks=list(callbacks),
    )


def build_layer_zoo(strategy):
    """`layer_zoo.build` without BatchNormalization and Dropout (exact)."""
    with strategy.scope():
        return layer_zoo.build(seed=0, stochastic=False)


def train_embedding(model, callbacks=()):
    return _fit(model, *embedding_digits(), 0, callbacks)


def train(model, seed=0, callbacks=()):
    x, y = digits()
    history = _fit(model, x, y, seed, callbacks)
    _, accuracy = model.evaluate(x[1500:], y[1500:], verbose=0)
    return history, float(accuracy)


def main(out_dir, mode, seed=0):
    import keras_psdist as kpd

    strategy = kpd.PSStrategy(
        mode=mode, partitioner=kpd.partitioners.Fixed(**EMBEDDING_PARTITIONER)
    )
    topology = strategy.extended.topology
    task = topology.config.task_name
    if topology.mode == "between-graph":
        # A different seed per worker: equal initial weights then show that
        # the workers share the chief's variables.
        seed += topology.worker_index
    # Between-graph, worker 1 compiles its replica's pass with XLA; worker 0
    # does not (both train the shared variables).
    jit_compile = topology.mode == "between-graph" and topology.worker_index == 1
    xla_traces = count_xla_traces()
    model = build(strategy, seed, jit_compile=jit_compile or "auto")
    initial = [w.numpy() for w in model.weights]
    if topology.mode == "between-graph":
        _wait_until_every_worker_has_read(out_dir, topology)
    callbacks = [
        keras.callbacks.ModelCheckpoint(
            os.path.join(out_dir, f"checkpoint_{task.replace(':', '_')}.weights.h5"),
            save_weights_only=True,
        ),
        # One file per epoch: what the evaluator (`launch --evaluator`)
        # follows; the chief alone writes it.
        keras.callbacks.ModelCheckpoint(
            os.path.join(out_dir, "epochs", "epoch{epoch:02d}.weights.h5"),
            save_weights_only=True,
        ),
    ]
    history, accuracy = train(model, seed, callbacks)
    if topology.mode == "between-graph":
        # `evaluate` in async mode sees only this worker's shard of the test
        # set; score the shared model on all of it.
        x, y = digits()
        logits = model(x[1500:], training=False)
        accuracy = float(np.mean(np.argmax(logits, axis=1) == y[1500:]))
    report = {
        "task": task,
        "mode": topology.mode,
        "compute_devices": list(topology.compute_devices),
        "variable_devices": {
            p.name: p.device for p in strategy.extended.placement.variables
        },
        "steps": len(history.history["loss"]) * _steps_per_epoch(history),
        "iterations": int(model.optimizer.iterations.numpy()),
        "accuracy": accuracy,
        "initial_checksum": float(sum(np.abs(w).sum() for w in initial)),
        "is_chief": strategy.extended.should_checkpoint,
        "jit_compile": model.jit_compile,
        "xla_traced_replicas": len(xla_traces),
    }
    if topology.mode == "between-graph":
        report["lazy_loop"] = lazy_custom_loop(strategy)
    if topology.mode == "in-graph":
        np.savez(
            os.path.join(out_dir, "weights.npz"), *[w.numpy() for w in model.weights]
        )
        embedding = build_embedding(strategy)
        train_embedding(embedding)
        np.savez(
            os.path.join(out_dir, "embedding_weights.npz"),
            *[w.numpy() for w in embedding.weights],
        )
        # Partial batches of 1 on 2 replicas: worker 1 runs on a stand-in.
        zoo = build_layer_zoo(strategy)
        zoo.fit(layer_zoo.partial_batches(2), epochs=2, verbose=0)
        np.savez(
            os.path.join(out_dir, "zoo_weights.npz"), *[w.numpy() for w in zoo.weights]
        )
        report["step_device"] = strategy.extended.step_device
        report["step_output_devices"] = step_output_devices(zoo, strategy)
        report["custom_step"] = custom_step_on_step_device(strategy)
        report["xla_max_weight_difference"] = xla_against_no_xla(strategy)
        # Every pattern of the distribute tutorials, on the cluster.
        import tutorial_patterns

        report["tutorial_patterns"] = tutorial_patterns.run_all(
            lambda: strategy, skip=tutorial_patterns.IN_GRAPH_CRASHES
        )
        report["shards"] = [
            [p.name, p.device, list(p.shape)]
            for p in strategy.extended.placement.variables
            if p.shard is not None and p.slot_of is None
        ]
    with open(os.path.join(out_dir, f"{task.replace(':', '_')}.json"), "w") as f:
        json.dump(report, f)
    print(f"{task}: accuracy {accuracy:.3f} after {report['steps']} steps")


def step_output_devices(model, strategy) -> list:
    """The devices of what one call of Keras's train function returns: the
    device the call ran on (`extended.step_device` in-graph)."""
    model.make_train_function()
    dataset = strategy.experimental_distribute_dataset(layer_zoo.partial_batches(2))
    logs = model.train_function(iter(dataset))
    return sorted({t.device for t in tf.nest.flatten(logs)})


def custom_step_on_step_device(strategy) -> list:
    """docs/cluster.md's custom loop, called on `extended.step_device`: the
    device its result is on, and the result (12.0)."""
    with strategy.scope():
        weight = tf.Variable(2.0)
    data = tf.data.Dataset.range(8).map(lambda x: tf.cast(x, tf.float32)).batch(4)
    iterator = iter(strategy.experimental_distribute_dataset(data))

    @tf.function
    def train_steps(iterator):
        per_replica = strategy.run(
            lambda x: tf.reduce_sum(x * weight), (next(iterator),)
        )
        return strategy.reduce("SUM", per_replica, axis=None)

    with tf.device(strategy.extended.step_device):
        total = train_steps(iterator)
    return [total.device, float(total)]


def lazy_custom_loop(strategy) -> dict:
    """TensorFlow's custom-training tutorial with its model and Adam built by
    the first traced step (no `Input`, optimizer not built): where each of
    their variables lives, the steps' losses, and the shared optimizer's
    step count."""
    before = {p.name for p in strategy.extended.placement.variables}
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)]
        )
        optimizer = keras.optimizers.Adam(0.01)
    x, y = digits()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=None
    )

    def replica_step(inputs):
        xb, yb = inputs
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(
                loss_fn(yb, model(xb, training=True)), global_batch_size=64
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def step(inputs):
        losses = strategy.run(replica_step, args=(inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x[:1280], y[:1280])).batch(64)
    )
    losses = [float(step(inputs)) for inputs in dataset]  # 20 steps
    return {
        "devices": sorted(
            {
                p.device
                for p in strategy.extended.placement.variables
                if p.name not in before
            }
        ),
        "created": len(strategy.extended.placement.variables) - len(before),
        "losses": losses,
        "iterations": int(optimizer.iterations.numpy()),
    }


def count_xla_traces() -> list:
    """A list that grows by one each time a replica's forward and backward
    pass is traced for XLA (`keras_psdist.integration.xla`) from now on."""
    from keras_psdist.integration import xla

    traces = []
    forward = xla._forward

    def counted(*args, **kwargs):
        traces.append(1)
        return forward(*args, **kwargs)

    xla._forward = counted
    return traces


def xla_against_no_xla(strategy):
    """The digits MLP trained 2 epochs with `jit_compile=True` and without,
    from the same weights: the largest difference of a weight."""
    x, y = digits()
    trained = []
    for jit_compile in (False, True):
        model = build(strategy, sgd_learning_rate=0.1, jit_compile=jit_compile)
        model.fit(
            x[:600], y[:600], batch_size=BATCH_SIZE, epochs=2, shuffle=False, verbose=0
        )
        trained.append([w.numpy() for w in model.weights])
    return max(float(np.max(np.abs(a - b))) for a, b in zip(*trained, strict=True))


def _wait_until_every_worker_has_read(out_dir, topology, timeout_s=120):
    """The chief starts training only once every worker has read the initial
    weights (else a slow worker would read weights the chief already
    trained)."""
    import time

    with open(os.path.join(out_dir, f"ready_{topology.worker_index}"), "w"):
        pass
    if not topology.is_chief:
        return
    deadline = time.monotonic() + timeout_s
    expected = topology.num_training_processes
    while len([p for p in os.listdir(out_dir) if p.startswith("ready_")]) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"not every worker read the initial weights in {timeout_s} s"
            )
        time.sleep(0.05)


def _steps_per_epoch(history):
    return history.params["steps"]


def evaluate_checkpoints(out_dir):
    """The evaluator task: the chief's per-epoch checkpoints evaluated on the
    held-out digits until the launcher says training has ended; what it saw
    goes to OUT_DIR/evaluator.json."""
    import tensorflow as tf

    import keras_psdist as kpd

    try:  # What a script that forgot to branch would meet.
        kpd.PSStrategy(mode="between-graph")
        refusal = None
    except ValueError as e:
        refusal = str(e)
    model = build(tf.distribute.get_strategy())  # no strategy: one device
    x, y = digits()
    evaluations = kpd.SidecarEvaluator(
        model,
        (x[1500:], y[1500:]),
        checkpoint_dir=os.path.join(out_dir, "epochs"),
        log_dir=os.path.join(out_dir, "evaluator_logs"),
        poll_s=0.5,
    ).start()
    report = {
        "task": kpd.cluster.from_environment().task_name,
        "strategy_refusal": refusal,
        "evaluations": [
            [os.path.basename(e.checkpoint), e.step, e.results] for e in evaluations
        ],
    }
    with open(os.path.join(out_dir, "evaluator.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    from keras_psdist import cluster

    if cluster.is_evaluator():
        evaluate_checkpoints(sys.argv[1])
        sys.exit(0)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    if sys.argv[4:] == ["then_partial_batches"]:
        # The same launch goes on with `partial_batches_job`'s runs (more
        # strategies of the same script), into OUT_DIR/partial_batches.
        import partial_batches_job

        partial_batches_job.main(
            os.path.join(sys.argv[1], "partial_batches"), "async,sync"
        )
