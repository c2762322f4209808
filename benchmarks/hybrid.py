"""The hybrid (dense variables all-reduced, embeddings on parameter servers)
and ``dense="auto"`` against parameter servers only and MirroredStrategy, on
one host and on an in-graph cluster.

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
* ``auto``: ``PSStrategy(dense="auto")``: per variable, whichever moves
  fewer bytes (``keras_psdist.synchronization.AutoChoice``); the script
  prints what it chose and checks the target: at least as fast as the best
  other configuration, within ``AUTO_TOLERANCE`` (it runs one of their
  placements, so a tie within noise);
* ``mirrored``: ``tf.distribute.MirroredStrategy``: everything replicated,
  the table too (one copy per replica).

Method (as ``step_time_rules.py --mode steps``): each model is built and
warmed up first (tracing excluded); then ``--repeats`` rounds, in each of
which every configuration runs ``--steps`` calls of its compiled
``train_function`` on a persistent distributed iterator, the order rotating
between rounds. Reported per configuration: median examples/s, and the
median over rounds of its step time relative to ``ps`` in the same round.

Then (``--topology cluster``, on by default) the same model on an in-graph
cluster on localhost: this script as the chief, 2 worker tasks (the
replicas, one each) and 2 ps tasks, every task its own process, over gRPC
(``keras_psdist.cluster.launch``). A chief process holds one strategy, so
each configuration is its own launch: ``ps``, ``hybrid`` and ``auto`` alternate for
``--cluster-rounds`` rounds (MirroredStrategy cannot span tasks from one
client). Per launch: median ms/step over ``--timed`` blocks of ``--steps``
steps, and the bytes that crossed the loopback interface per step
(``/proc/net/dev``: run it on an otherwise idle machine).

What one host cannot show: its replicas are logical devices of one CPU, so
no byte crosses a bus or a network, and a replicated variable costs an
optimizer update per replica instead of one. On GPUs (not run: this
project's machines have none) the parameter-server path reads every dense
variable across PCIe each step, which the hybrid avoids.

How to run
----------
From the repository root::

    python benchmarks/hybrid.py --json benchmarks/results/hybrid.json \
        --plot docs/images/hybrid.png
    python benchmarks/hybrid.py --quick     # smoke run, about a minute

Options: ``--topology local,cluster``, ``--replicas``, ``--rows``,
``--dim``, ``--seq``, ``--hidden``, ``--layers``, ``--batch``, ``--steps``,
``--repeats``, ``--cluster-rounds``, ``--timed``, ``--quick``,
``--json PATH``, ``--plot PATH``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

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

CONFIGS = ("ps", "hybrid", "auto", "mirrored")
CLUSTER_CONFIGS = ("ps", "hybrid", "auto")
# dense= for each keras_psdist configuration.
DENSE = {"ps": "ps", "hybrid": "all_reduce", "auto": "auto"}
# "auto" passes when its step is within this factor of the best other
# configuration's (it makes one of their choices, so it ties within noise).
AUTO_TOLERANCE = 1.05
DENSE_FEATURES = 64
CLUSTER_TIMEOUT_S = 600


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


def strategy_for(name, devices=None):
    """The strategy of configuration `name`: on `devices` of this host, or on
    the in-graph cluster this process was launched into (`devices=None`)."""
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(devices=devices)
    if devices is None:
        return kpd.PSStrategy(mode="in-graph", dense=DENSE[name])
    return kpd.PSStrategy(devices=devices, dense=DENSE[name])


def auto_summary(strategy) -> str:
    """What `dense="auto"` chose, variable by variable, in one line."""
    decisions = strategy.extended.dense_decisions
    replicated = sum(d.choice == "all_reduce" for d in decisions)
    reasons = sorted({d.reason.split(" (")[0] for d in decisions})
    return f"auto replicated {replicated} of {len(decisions)} variables; " + "; ".join(
        reasons
    )


class Case:
    def __init__(self, name, args, devices, dataset):
        self.name = name
        strategy = strategy_for(name, devices)
        self.model = build(strategy, args)
        self.auto = auto_summary(strategy) if name == "auto" else None
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


def auto_check(step_vs_ps: dict, summary: str | None) -> list[str]:
    """The issue's target: "auto" at least as fast as the best other
    configuration (within `AUTO_TOLERANCE`), and what it chose."""
    others = {k: v for k, v in step_vs_ps.items() if k != "auto" and v is not None}
    if step_vs_ps.get("auto") is None or not others:
        return ["auto: no measurement"]
    best = min(others, key=others.get)
    ok = step_vs_ps["auto"] <= others[best] * AUTO_TOLERANCE
    return [
        f"{'PASS' if ok else 'FAIL'} auto: step {step_vs_ps['auto']:.2f}x ps, the "
        f"best other ({best}) {others[best]:.2f}x (bar: within {AUTO_TOLERANCE:.2f}x)",
        f"  {summary}",
    ]


def loopback_bytes() -> int | None:
    """Bytes received on the loopback interface so far (None if unknown)."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, counters = line.partition(":")
                if name.strip() == "lo":
                    return int(counters.split()[0])
    except OSError:
        pass
    return None


def cluster_child(args) -> int:
    """The chief of one launch: one configuration, timed blocks of steps."""
    strategy = strategy_for(args.config)
    # After the strategy: a dataset made before it connected would live on
    # the process's local device, which the cluster does not know.
    dataset = make_dataset(args)
    model = build(strategy, args)
    model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0, shuffle=False)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    train_function = model.train_function
    train_function(iterator)
    blocks = []
    for _ in range(args.timed):
        before, start = loopback_bytes(), time.perf_counter()
        for _ in range(args.steps):
            train_function(iterator)
        seconds = (time.perf_counter() - start) / args.steps
        after = loopback_bytes()
        moved = None if before is None else (after - before) / args.steps
        blocks.append({"s_per_step": seconds, "bytes_per_step": moved})
    report = {
        "config": args.config,
        "s_per_step": harness.median_or_none(b["s_per_step"] for b in blocks),
        "bytes_per_step": harness.median_or_none(
            b["bytes_per_step"] for b in blocks if b["bytes_per_step"] is not None
        ),
        "replicated": len(strategy.extended.placement.replicated()),
        "auto": auto_summary(strategy) if args.config == "auto" else None,
    }
    (Path(args.out_dir) / "chief.json").write_text(json.dumps(report))
    return 0


def run_cluster(args) -> harness.Rounds:

    work = Path(tempfile.mkdtemp(prefix="hybrid_cluster_"))

    def one(config, round_):
        out_dir, log = harness.run_dir(work, f"{config}_{round_}_")
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--role",
            "chief",
            "--out-dir",
            str(out_dir),
            "--config",
            config,
            *_model_flags(args),
        ]
        _log(f"cluster round {round_ + 1}: {config} ...")
        code = harness.launch_logged(
            command,
            log,
            num_ps=2,
            num_workers=2,
            mode="in-graph",
            timeout_s=CLUSTER_TIMEOUT_S,
        )
        (report,) = harness.read_reports(out_dir, 1, log, code)
        return report

    return harness.interleaved_rounds(
        CLUSTER_CONFIGS,
        one,
        args.cluster_rounds,
        on_error=harness.log_failure,
    )


def _model_flags(args) -> list[str]:
    return [
        f"--rows={args.rows}",
        f"--dim={args.dim}",
        f"--seq={args.seq}",
        f"--hidden={args.hidden}",
        f"--layers={args.layers}",
        f"--batch={args.batch}",
        f"--steps={args.steps}",
        f"--timed={args.timed}",
    ]


def parse_args(argv):
    parser = harness.BenchmarkParser(
        __doc__.split("\n\n")[0],
        name="hybrid",
        quick="tiny model, 3 rounds",
        quick_json=True,
        plot="write a PNG bar chart of examples/s per configuration and topology",
    )
    parser.add_argument("--replicas", type=harness.positive, default=4)
    parser.add_argument("--rows", type=harness.positive, default=1 << 20)
    parser.add_argument("--dim", type=harness.positive, default=64)
    parser.add_argument("--seq", type=harness.positive, default=8)
    parser.add_argument("--hidden", type=harness.positive, default=1024)
    parser.add_argument("--layers", type=harness.positive, default=3)
    parser.add_argument("--batch", type=harness.positive, default=256)
    parser.add_argument("--steps", type=harness.positive, default=5)
    parser.add_rounds(30, "interleaved rounds (default 30)", flag="--repeats")
    parser.add_argument(
        "--topology",
        type=harness.name_list(("local", "cluster"), "topology"),
        default=["local", "cluster"],
    )
    parser.add_argument("--cluster-rounds", type=harness.positive, default=3)
    parser.add_argument("--timed", type=harness.positive, default=5)
    parser.add_child_role(("chief",))
    parser.add_argument("--config", choices=CLUSTER_CONFIGS, help=argparse.SUPPRESS)

    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.hidden, args.layers, args.repeats = 4096, 64, 2, 3
        args.cluster_rounds, args.timed = 1, 2
    return args


def run_local(args) -> tuple[list[str], dict]:
    devices = split_host_cpu(args.replicas)
    dataset = make_dataset(args)
    cases = {}
    for name in CONFIGS:
        _log(f"building + warming up {name} ...")
        cases[name] = Case(name, args, devices, dataset)
    rounds = harness.interleaved_rounds(
        cases, lambda case, r: case.step(args.steps), args.repeats
    )
    medians = rounds.medians()
    vs_ps = rounds.ratio_medians("ps")
    rows = [
        [
            name,
            harness.fmt(1e3 * medians[name], ".1f"),
            harness.fmt(args.batch / medians[name], ".0f"),
            harness.times(vs_ps[name]),
            "",
        ]
        for name in CONFIGS
    ]
    checks = auto_check(vs_ps, cases["auto"].auto)
    title = (
        f"one host, {args.replicas} logical CPU replicas; table {args.rows} x "
        f"{args.dim}, dense tower {cases['ps'].dense_params:,} parameters; "
        f"global batch {args.batch}; {args.repeats} interleaved rounds of "
        f"{args.steps} steps, medians"
    )
    return [title, *harness.text_table(COLUMNS, rows), *checks], {
        "medians_s": medians,
        "step_vs_ps": vs_ps,
        "rounds": rounds.entries(),
    }


def cluster_table(args, rounds: harness.Rounds) -> tuple[list[str], dict]:
    medians = rounds.medians("s_per_step")
    bytes_ = rounds.medians("bytes_per_step")
    vs_ps = rounds.ratio_medians("ps", "s_per_step")
    rows = []
    for name in CLUSTER_CONFIGS:
        if medians[name] is None:
            rows.append(f"{name}: failed in every round")
            continue
        rows.append(
            [
                name,
                harness.fmt(1e3 * medians[name], ".1f"),
                harness.fmt(args.batch / medians[name], ".0f"),
                harness.times(vs_ps[name]),
                harness.fmt(
                    None if bytes_[name] is None else bytes_[name] / 1e6, ".1f"
                ),
            ]
        )
    title = (
        "in-graph cluster on localhost: chief + 2 workers (the replicas) + 2 ps; "
        f"{args.cluster_rounds} rounds of one launch per configuration, each "
        f"the median of {args.timed} blocks of {args.steps} steps"
    )
    summaries = [
        res["auto"].get("auto")
        for res in rounds.results
        if isinstance(res.get("auto"), dict)
    ]
    checks = auto_check(vs_ps, next((s for s in summaries if s), None))
    return [title, *harness.text_table(COLUMNS, rows), *checks], {
        "cluster_medians_s": medians,
        "cluster_bytes_per_step": bytes_,
        "cluster_step_vs_ps": vs_ps,
        "cluster_rounds": rounds.entries(),
    }


def write_plot(path: str, args, payload: dict) -> None:
    """Examples/s per configuration, one panel per topology measured."""
    panels = [
        (f"one host, {args.replicas} logical CPU replicas", payload.get("medians_s")),
        (
            "in-graph cluster: 2 workers + 2 ps on localhost",
            payload.get("cluster_medians_s"),
        ),
    ]
    panels = [(title, m) for title, m in panels if m]
    with harness.figure(path, 1, len(panels), figsize=(5 * len(panels), 3.6)) as (
        fig,
        axes,
    ):
        for ax, (title, medians) in zip(np.atleast_1d(axes), panels, strict=True):
            names = [n for n in medians if medians[n]]
            rates = [args.batch / medians[n] for n in names]
            ax.bar(names, rates, color=["C0" if n != "auto" else "C2" for n in names])
            ax.set_title(title, fontsize=10)
            ax.set_ylabel("examples/s (higher is better)")
        fig.suptitle(
            f"table {args.rows:,} x {args.dim}, dense tower of {args.layers} x "
            f"{args.hidden}; global batch {args.batch}",
            fontsize=10,
        )


COLUMNS = [
    Column("config", 10, "<"),
    Column("ms/step", 8),
    Column("examples/s", 11),
    Column("step vs ps", 10),
    Column("MB/step", 8),
]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.role == "chief":
        return cluster_child(args)
    wall = time.perf_counter()
    load_start = harness.loadavg()
    lines, payload = [], {}
    if "local" in args.topology:
        table, results = run_local(args)
        lines += [*table, ""]
        payload.update(results)
    if "cluster" in args.topology:
        table, results = cluster_table(args, run_cluster(args))
        lines += [*table, ""]
        payload.update(results)
    print("\n".join(lines))
    wall = time.perf_counter() - wall
    print(
        f"wall time: {wall:.1f}s; load average at start {load_start}, at end "
        f"{harness.loadavg()}"
    )
    harness.write_results(args.json, {"args": vars(args), **payload})
    print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, args, payload)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
