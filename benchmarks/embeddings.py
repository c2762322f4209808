"""Embedding tables on parameter servers: what each step moves, and its time.

What it measures
----------------
One model, ``ids (batch x seq) -> Embedding(rows, 64) -> mean over seq ->
Dense(1)``, mean squared error, plain SGD (a sparse update: only the touched
rows change), trained with ``model.fit`` by ``PSStrategy()`` as the chief of a
local in-graph cluster: 2 worker tasks (the replicas, one each) and 2 ps tasks
(the variables), every task its own process, talking gRPC over localhost
(``keras_psdist.cluster.launch``). Four ways to hold and read the table, all
in the same run:

* ``whole_read``: unpartitioned, looked up as Keras's TensorFlow backend does
  by itself (``take`` converts the variable to a tensor first): every step
  each worker reads the *whole* table from its ps. Its gradient is still
  sparse (``IndexedSlices``).
* ``dense_gradient``: the same read, and the gradient densified to the
  table's shape before it is sent (what strategies that all-reduce
  embeddings densely do, e.g. Horovod's ``sparse_as_dense``).
* ``rows``: unpartitioned, looked up by ``PSStrategy`` (``keras_psdist.partitioners``):
  the rows are gathered on the ps, and only they travel.
* ``partitioned``: the table split over the 2 ps tasks
  (``partitioner=``), each row gathered on the shard that owns it.

Two sweeps: the table size (``--rows``, default 65536, 262144, 1048576 rows of
64 float32: 16, 64, 256 MiB) at ``--seq`` 8 ids per example (batch 128: 1024
ids per step, about 1k distinct rows), and the ids per step (``--touch``,
default seq 2, 8, 32, 128: 256 to 16384 ids) at the largest table.

For each configuration, one ``fit`` runs a warm-up epoch of ``--steps``
steps (tracing excluded), then ``--epochs`` timed epochs; per timed epoch it
records the wall time and the bytes that crossed the loopback interface
(``/proc/net/dev``, ``lo``: every gRPC byte between the tasks, both ways,
counted once). Reported: median ms/step, median MB/step, and both as ratios
to the ``rows`` path of the same table and ids. Run it on an otherwise idle
machine: any other loopback traffic is counted too.

A second, smaller table compares one host's strategies: 2 replicas on
logical CPUs, ``tf.distribute.MirroredStrategy`` (a table copy per replica)
against ``PSStrategy`` with the table on one parameter device, and split
over two, at each table size (``--only local`` runs just this). In one
process no byte crosses a network: it shows what each strategy costs
besides the transfer.

How to run
----------
From the repository root, on an idle machine::

    python benchmarks/embeddings.py            # about 8 minutes on 2 cores
    python benchmarks/embeddings.py --quick    # smoke run, about 2 minutes

Options: ``--rows`` (table sizes, comma-separated), ``--touch`` (seq values
for the second sweep), ``--batch`` (128), ``--seq`` (8), ``--steps`` (steps
per epoch, 6), ``--epochs`` (timed epochs, 3), ``--only cluster|local``,
``--json PATH`` (default ``benchmarks/results/embeddings.json``). The exit
code is 1 if a configuration failed (its error is in the JSON).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import harness
from harness import (
    Column,
    RunFailed,
    finish,
    format_row,
    read_reports,
    run_dir,
    run_process,
    text_table,
    use_checkout,
)
from harness import log as _log
from harness import median_or_none as _median
from harness import positive as _positive

# Before TensorFlow is imported anywhere in this process.
harness.prepare_tensorflow()

PATHS = ("whole_read", "dense_gradient", "rows", "partitioned")
LOCAL_PATHS = ("mirrored", "ps_rows", "ps_partitioned")
DIM = 64
RUN_TIMEOUT_S = 1800.0


# ----------------------------------------------------------------- models


def _layers():
    """The two baseline lookups, as Keras layers (built when Keras loads)."""
    import keras
    import tensorflow as tf

    class WholeReadEmbedding(keras.layers.Embedding):
        """Keras's own lookup without the strategy's routing: the table is
        read whole into a tensor, then gathered. (`keras.ops.convert_to_tensor`
        would hand the variable through unread: `tf.convert_to_tensor`.)"""

        def call(self, inputs):
            table = tf.convert_to_tensor(self.embeddings)
            return keras.ops.take(table, inputs, axis=0)

    @tf.custom_gradient
    def densify(table):
        def grad(upstream):
            return tf.convert_to_tensor(upstream)

        return tf.identity(table), grad

    class DenseGradientEmbedding(keras.layers.Embedding):
        """The whole-table read, with the gradient made dense (table-sized)."""

        def call(self, inputs):
            table = densify(tf.convert_to_tensor(self.embeddings))
            return tf.gather(table, inputs)

    return {
        "whole_read": WholeReadEmbedding,
        "dense_gradient": DenseGradientEmbedding,
    }


def build_model(strategy, path: str, rows: int, seq: int):
    import keras

    layer = _layers().get(path, keras.layers.Embedding)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((seq,), dtype="int32"),
                layer(rows, DIM),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def make_dataset(rows: int, batch: int, seq: int):
    """Uniform random ids, made by the input pipeline itself (in-graph, each
    worker runs it): nothing but the step's own traffic crosses the network."""
    import tensorflow as tf

    def example(seed):
        seeds = tf.stack([seed, seed + 1])
        ids = tf.random.stateless_uniform([seq], seeds, 0, rows, tf.int32)
        return ids, tf.cast(ids[:1] % 2, tf.float32)

    return (
        tf.data.Dataset.random(seed=0)
        .map(example)
        .batch(batch, drop_remainder=True)
        .repeat()
    )


class SwitchPartitioner:
    """Splits every variable of at least 1 MiB in `shards` (set per model),
    so one strategy builds both the whole and the partitioned table."""

    def __init__(self):
        self.shards = 1

    def __call__(self, shape, dtype):
        big = shape.num_elements() * dtype.size >= 1 << 20
        return self.shards if big and shape[0] >= self.shards else 1


# ---------------------------------------------------- one configuration


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


def _epoch_meter():
    import keras

    class EpochMeter(keras.callbacks.Callback):
        """Wall time and loopback bytes of every epoch."""

        def __init__(self):
            super().__init__()
            self.epochs = []
            self._begin = None

        def on_epoch_begin(self, epoch, logs=None):
            self._begin = (time.perf_counter(), loopback_bytes())

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self._begin[0]
            end_bytes, begin_bytes = loopback_bytes(), self._begin[1]
            moved = None if end_bytes is None else end_bytes - begin_bytes
            self.epochs.append((seconds, moved))

    return EpochMeter()


def measure(strategy, path, rows, seq, args, partitioner=None) -> dict:
    """Builds, warms up and times one configuration; frees it after."""
    import gc

    if partitioner is not None:
        partitioner.shards = 2 if path.endswith("partitioned") else 1
    model = build_model(strategy, path, rows, seq)
    meter = _epoch_meter()
    model.fit(
        make_dataset(rows, args.batch, seq),
        epochs=1 + args.epochs,
        steps_per_epoch=args.steps,
        verbose=0,
        callbacks=[meter],
    )
    timed = meter.epochs[1:]
    ms = [1e3 * s / args.steps for s, _ in timed]
    moved = [b / args.steps for _, b in timed if b is not None]
    result = {
        "path": path,
        "rows": rows,
        "seq": seq,
        "ids_per_step": args.batch * seq,
        "ms_per_step": ms,
        "bytes_per_step": moved,
        "table_devices": _table_devices(strategy, model.layers[0].embeddings),
    }
    del model
    gc.collect()
    return result


def _table_devices(strategy, table) -> list[str]:
    """Where the table lives: its shards' devices, its device, or (for
    MirroredStrategy) every replica's copy."""
    placement = getattr(strategy.extended, "placement", None)
    if placement is None:
        return [v.device for v in table.value.values]
    shards = placement.shards_of(table.path)
    return [r.device for r in shards] or [placement.device_of(table.path)]


def _configurations(args):
    """(path, rows, seq) in measuring order: the table sweep, then the ids."""
    largest = max(args.rows)
    configs = [(rows, args.seq) for rows in args.rows]
    configs += [(largest, seq) for seq in args.touch if seq != args.seq]
    return configs


def _child_main(args) -> int:
    import tensorflow as tf

    import keras_psdist as kpd

    results = []
    if args.role == "chief":
        partitioner = SwitchPartitioner()
        strategy = kpd.PSStrategy(partitioner=partitioner)
        paths = PATHS
    else:
        from keras_psdist.devices import split_host_cpu

        cpus = split_host_cpu(4)
        partitioner = SwitchPartitioner()
        strategies = {
            "mirrored": tf.distribute.MirroredStrategy(cpus[:2]),
            "ps_rows": kpd.PSStrategy(
                devices=cpus[:2], parameter_devices=cpus[2:], partitioner=partitioner
            ),
        }
        strategies["ps_partitioned"] = strategies["ps_rows"]
        paths = LOCAL_PATHS
    for rows, seq in _configurations(args):
        for path in paths:
            _log(f"{args.role}: {path}, {rows} rows, seq {seq} ...")
            try:
                s = strategy if args.role == "chief" else strategies[path]
                results.append(measure(s, path, rows, seq, args, partitioner))
            except Exception as e:  # noqa: BLE001 - recorded, the rest go on
                results.append(
                    {"path": path, "rows": rows, "seq": seq, "error": repr(e)[:2000]}
                )
    (Path(args.out_dir) / f"{args.role}.json").write_text(json.dumps(results))
    return 0


# ------------------------------------------------------------ orchestration


def _child_command(role: str, out_dir: Path, args) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--role",
        role,
        "--out-dir",
        str(out_dir),
        "--rows",
        ",".join(map(str, args.rows)),
        "--touch",
        ",".join(map(str, args.touch)),
        "--seq",
        str(args.seq),
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--epochs",
        str(args.epochs),
    ]


def run_cluster(work: Path, args) -> list[dict]:

    out_dir, log = run_dir(work, "cluster_")
    code = harness.launch_logged(
        _child_command("chief", out_dir, args),
        log,
        num_ps=2,
        num_workers=2,
        mode="in-graph",
        timeout_s=RUN_TIMEOUT_S,
    )
    (results,) = read_reports(out_dir, 1, log, code)
    return results


def run_local(work: Path, args) -> list[dict]:
    out_dir, log = run_dir(work, "local_")
    code = run_process(_child_command("local", out_dir, args), log, RUN_TIMEOUT_S)
    (results,) = read_reports(out_dir, 1, log, code)
    return results


def summarize(results: list[dict], baseline: str, bytes_: bool) -> list[dict]:
    """Medians per configuration, and ratios to `baseline` of the same one.
    `bytes_`: whether the loopback bytes mean anything (not in one process)."""
    rows = []
    for r in results:
        row = {k: r[k] for k in ("path", "rows", "seq")}
        if "error" in r:
            rows.append({**row, "error": r["error"]})
            continue
        row["ids_per_step"] = r["ids_per_step"]
        row["ms_per_step"] = _median(r["ms_per_step"])
        row["mb_per_step"] = (
            _median([b / 1e6 for b in r["bytes_per_step"]]) if bytes_ else None
        )
        row["table_devices"] = r["table_devices"]
        rows.append(row)
    for row in rows:
        base = next(
            (
                b
                for b in rows
                if b["path"] == baseline
                and (b["rows"], b["seq"]) == (row["rows"], row["seq"])
                and "error" not in b
            ),
            None,
        )
        if base is None or "error" in row:
            continue
        row["time_vs_" + baseline] = row["ms_per_step"] / base["ms_per_step"]
        if row["mb_per_step"] is not None and base["mb_per_step"]:
            row["bytes_vs_" + baseline] = row["mb_per_step"] / base["mb_per_step"]
    return rows


def print_table(title: str, rows: list[dict], baseline: str, batch: int) -> None:
    columns = [
        Column("path", 16, "<"),
        Column("table rows", 10),
        Column("ids/step", 8),
        Column("ms/step", 9),
        Column("x " + baseline, 10),
        Column("MB/step", 9),
        Column("x " + baseline, 10),
    ]
    table = []
    for row in rows:
        head = [row["path"], row["rows"], row["seq"] * batch]
        if "error" in row:
            table.append(f"{format_row(columns, head)}  failed: {row['error'][:100]}")
            continue
        mb = row["mb_per_step"]
        nan = float("nan")
        table.append(
            [
                *head,
                f"{row['ms_per_step']:.1f}",
                f"{row.get('time_vs_' + baseline, nan):.2f}",
                "" if mb is None else f"{mb:.2f}",
                "" if mb is None else f"{row.get('bytes_vs_' + baseline, nan):.1f}",
            ]
        )
    print(f"\n{title}")
    print("\n".join(text_table(columns, table, rule=False)))


def parse_args(argv=None):
    p = harness.BenchmarkParser(
        __doc__.split("\n\n")[0],
        name="embeddings",
        quick="smoke run: 2 table sizes, 2 id counts, 2 timed epochs of 3 steps",
        quick_json=True,
        seed=False,
    )
    p.add_argument("--rows", type=harness.int_list, default=[1 << 16, 1 << 18, 1 << 20])
    p.add_argument("--touch", type=harness.int_list, default=[2, 8, 32, 128])
    p.add_argument("--seq", type=_positive, default=8)
    p.add_argument("--batch", type=_positive, default=128)
    p.add_argument("--steps", type=_positive, default=6)
    p.add_argument("--epochs", type=_positive, default=3)
    p.add_argument("--only", choices=("cluster", "local"))
    p.add_child_role(("chief", "local"))
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.touch, args.steps, args.epochs = (
            [1 << 14, 1 << 18],
            [2, 32],
            3,
            2,
        )
    return args


def main() -> int:
    args = parse_args()
    use_checkout()
    if args.role is not None:
        return _child_main(args)
    import tempfile

    load_start, start = harness.loadavg(), time.perf_counter()
    rounds = {"cluster": [], "local": []}
    summary = {}
    with tempfile.TemporaryDirectory(prefix="kpd_embeddings_") as work:
        for name, run, baseline in (
            ("cluster", run_cluster, "rows"),
            ("local", run_local, "ps_rows"),
        ):
            if args.only not in (None, name):
                continue
            _log(f"running the {name} measurements ...")
            try:
                results = run(Path(work), args)
            except RunFailed as e:
                rounds[name].append({"run": {"error": str(e)}})
                print(f"{name}: failed\n{e}")
                continue
            rounds[name] = [{"config": r} for r in results]
            summary[name] = summarize(results, baseline, bytes_=name == "cluster")
            title = (
                "in-graph cluster (2 workers, 2 ps; bytes = loopback traffic)"
                if name == "cluster"
                else "one host (2 replicas on logical CPUs)"
            )
            print_table(title, summary[name], baseline, args.batch)
    settings = ("rows", "touch", "seq", "batch", "steps", "epochs", "only", "quick")
    return finish(
        args, settings, load_start, time.perf_counter() - start, summary, rounds
    )


if __name__ == "__main__":
    sys.exit(main())
