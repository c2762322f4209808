"""The hybrid (dense variables all-reduced, embeddings on parameter servers)
against parameter servers only and MirroredStrategy, on one host.

What it measures
----------------
A wide-and-deep model: ``ids (batch x --seq) -> Embedding(--rows, --dim) ->
mean over seq``, concatenated with 64 dense features, then a dense tower of
``--layers`` layers of ``--hidden`` units (relu) and a 1-unit output; mean
squared error, plain SGD (a sparse update of the table). Trained on
``--replicas`` (default 4) logical CPU replicas of one host by

* ``ps``: ``PSStrategy()``: every variable on the parameter device (the host
  CPU), read by every replica each step;
* ``hybrid``: ``PSStrategy(dense="all_reduce")``: the dense tower replicated
  on the replicas, the table on the parameter device;
* ``mirrored``: ``tf.distribute.MirroredStrategy``: everything replicated,
  the table too (one copy per replica).

Method (as ``step_time_rules.py --mode steps``): each model is built and
warmed up first (tracing excluded); then ``--repeats`` rounds, in each of
which every configuration runs ``--steps`` calls of its compiled
``train_function`` on a persistent distributed iterator, the order rotating
between rounds. Reported per configuration: median examples/s, and the
median over rounds of its step time relative to ``ps`` in the same round.

What it cannot show here: the replicas are logical devices of one CPU, so
no byte crosses a bus or a network, and a replicated variable costs an
optimizer update per replica instead of one. On GPUs (not run: this
project's machines have none) the parameter-server path reads every dense
variable across PCIe each step, which the hybrid avoids.

How to run
----------
From the repository root::

    python benchmarks/hybrid.py --json benchmarks/results/hybrid.json
    python benchmarks/hybrid.py --quick     # smoke run, seconds

Options: ``--replicas``, ``--rows``, ``--dim``, ``--seq``, ``--hidden``,
``--layers``, ``--batch``, ``--steps``, ``--repeats``, ``--quick``,
``--json PATH``.
"""

from __future__ import annotations

import sys
import time

import harness
from harness import Column
from harness import log as _log

harness.prepare_tensorflow()
harness.ensure_importable()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_psdist as kpd  # noqa: E402
from keras_psdist.devices import split_host_cpu  # noqa: E402

CONFIGS = ("ps", "hybrid", "mirrored")
DENSE_FEATURES = 64


def make_dataset(args) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    n = 8 * args.batch
    ids = rng.integers(0, args.rows, size=(n, args.seq)).astype(np.int32)
    dense = rng.standard_normal((n, DENSE_FEATURES)).astype(np.float32)
    y = (dense[:, :1] + (ids[:, :1] % 7) / 7.0).astype(np.float32)
    return (
        tf.data.Dataset.from_tensor_slices(((ids, dense), y))
        .repeat()
        .batch(args.batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def build(strategy, args) -> keras.Model:
    with strategy.scope():
        keras.utils.set_random_seed(0)
        ids = keras.Input((args.seq,), dtype="int32")
        dense = keras.Input((DENSE_FEATURES,))
        wide = keras.layers.GlobalAveragePooling1D()(
            keras.layers.Embedding(args.rows, args.dim)(ids)
        )
        h = keras.layers.Concatenate()([wide, dense])
        for _ in range(args.layers):
            h = keras.layers.Dense(args.hidden, activation="relu")(h)
        model = keras.Model([ids, dense], keras.layers.Dense(1)(h))
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def strategy_for(name, devices):
    if name == "ps":
        return kpd.PSStrategy(devices=devices)
    if name == "hybrid":
        return kpd.PSStrategy(devices=devices, dense="all_reduce")
    return tf.distribute.MirroredStrategy(devices=devices)


class Case:
    def __init__(self, name, args, devices, dataset):
        self.name = name
        strategy = strategy_for(name, devices)
        self.model = build(strategy, args)
        self.dense_params = sum(
            int(np.prod(w.shape)) for w in self.model.trainable_weights[1:]
        )
        self.model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0, shuffle=False)
        self.iterator = iter(strategy.experimental_distribute_dataset(dataset))
        self.step(args.steps)

    def step(self, steps):
        train_function = self.model.train_function
        start = time.perf_counter()
        for _ in range(steps):
            train_function(self.iterator)
        return (time.perf_counter() - start) / steps


def parse_args(argv):
    parser = harness.BenchmarkParser(
        __doc__.split("\n\n")[0],
        name="hybrid",
        quick="tiny model, 3 rounds",
        quick_json=True,
    )
    parser.add_argument("--replicas", type=harness.positive, default=4)
    parser.add_argument("--rows", type=harness.positive, default=1 << 18)
    parser.add_argument("--dim", type=harness.positive, default=64)
    parser.add_argument("--seq", type=harness.positive, default=8)
    parser.add_argument("--hidden", type=harness.positive, default=1024)
    parser.add_argument("--layers", type=harness.positive, default=3)
    parser.add_argument("--batch", type=harness.positive, default=256)
    parser.add_argument("--steps", type=harness.positive, default=5)
    parser.add_rounds(30, "interleaved rounds (default 30)", flag="--repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.hidden, args.layers, args.repeats = 4096, 64, 2, 3
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    devices = split_host_cpu(args.replicas)
    dataset = make_dataset(args)
    wall = time.perf_counter()
    load_start = harness.loadavg()
    cases = {}
    for name in CONFIGS:
        _log(f"building + warming up {name} ...")
        cases[name] = Case(name, args, devices, dataset)
    rounds = harness.interleaved_rounds(
        cases, lambda case, r: case.step(args.steps), args.repeats
    )
    medians = rounds.medians()
    vs_ps = rounds.ratio_medians("ps")
    columns = [
        Column("config", 10, "<"),
        Column("ms/step", 8),
        Column("examples/s", 11),
        Column("step vs ps", 10),
    ]
    rows = [
        [
            name,
            harness.fmt(1e3 * medians[name], ".1f"),
            harness.fmt(args.batch / medians[name], ".0f"),
            harness.times(vs_ps[name]),
        ]
        for name in CONFIGS
    ]
    print(
        f"one host, {args.replicas} logical CPU replicas; table {args.rows} x "
        f"{args.dim}, dense tower {cases['ps'].dense_params:,} parameters; "
        f"global batch {args.batch}; {args.repeats} interleaved rounds of "
        f"{args.steps} steps, medians"
    )
    print("\n".join(harness.text_table(columns, rows)))
    wall = time.perf_counter() - wall
    print(
        f"\nwall time: {wall:.1f}s; load average at start {load_start}, at end "
        f"{harness.loadavg()}"
    )
    if args.json:
        harness.save_json(
            args.json,
            {
                "args": vars(args),
                "environment": harness.environment(),
                "medians_s": medians,
                "step_vs_ps": vs_ps,
                "rounds": rounds.entries(),
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
