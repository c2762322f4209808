"""The combination matrix: every compressor with every rule and
pre-aggregation, without and under an attack, and the axes that multiply.

What it measures
----------------
For each cell of `keras_psdist.testing.combinations` (a compressor or none,
an aggregator id from the registry, no attack or one replica of 7 sending
-10 times its gradient, `num_byzantine=1`): one training run on digits
(MLP 64-32-10, SGD 0.3, 8 epochs, global batch 112 over 7 logical CPU
replicas) and its held-out accuracy, or the error that refused it when the
strategy was built. Each cell is compared with its rule uncompressed under
the same attack: "trains" within 3 points, "slower" above halfway from
chance to it, else "FAILS" (`combinations.verdict`). Then each compressor with a robust rule
(`trimmed_mean`) under the attack, on the axes that multiply: variables
partitioned over two parameter devices, `dense="all_reduce"`,
`jit_compile=True`, `mixed_float16`.

How to run
----------
From the repository root::

    python benchmarks/combinations.py          # ~15 min on 2 cores

It writes ``benchmarks/results/combinations.json`` and replaces the
generated block of ``docs/compression.md``. ``tests/test_combinations.py``
runs every compressor but the casts with a robust rule of each kind and top-k with every
rule in the default suite, the whole matrix in ``nox -s slow``: no cell may fail.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import harness
from harness import REPO_ROOT
from harness import log as _log

harness.prepare_tensorflow()
harness.ensure_importable()

from keras_psdist.devices import split_host_cpu  # noqa: E402

split_host_cpu(8)

from keras_psdist.testing import combinations as c  # noqa: E402

DOC = REPO_ROOT / "docs" / "compression.md"
BEGIN = "<!-- BEGIN GENERATED: benchmarks/combinations.py -->"
END = "<!-- END GENERATED: benchmarks/combinations.py -->"


def main(argv=None) -> int:
    parser = harness.BenchmarkParser(__doc__.split("\n")[0], name="combinations")
    parser.add_argument(
        "--configurations", type=harness.name_list(c.CONFIGURATIONS, "aggregator")
    )
    parser.add_argument(
        "--compressors", type=harness.name_list(c.COMPRESSORS, "compressor")
    )
    parser.add_argument("--output", default=str(DOC))
    parser.add_argument(
        "--across-workers",
        action="store_true",
        help="instead: the matrix across 5 worker processes "
        "(combinations.ACROSS_WORKERS_CELLS; default JSON "
        "benchmarks/results/combinations_across_workers.json)",
    )
    parser.add_argument(
        "--top-k-coordinates",
        action="store_true",
        help="instead: top-k (its default 1 %%) with each replica's own "
        "coordinates against the leader's, before a rule of each kind "
        "(default JSON benchmarks/results/top_k_coordinates.json)",
    )
    args = parser.parse_args(argv)
    if args.top_k_coordinates:
        return top_k_coordinates(args)
    if args.across_workers:
        return across_workers(args)
    configurations = args.configurations or list(c.CONFIGURATIONS)
    compressors = args.compressors or list(c.COMPRESSORS)
    data = c.digits(args.seed)
    cells, rows = [], []
    for attack in c.ATTACKS:
        for configuration in configurations:
            row = _row(cells, compressors, configuration, attack, data)
            rows.append({"attack": attack, "rule": configuration, **row})
    table = harness.markdown_table(rows, ["attack", "rule", *compressors])
    axes_rows = []
    for label, kwargs in c.EXTRA_AXES.items():
        row = _row(
            cells, compressors, "trimmed_mean", "scale_-10", data, label, **kwargs
        )
        axes_rows.append({"axis": label, **row})
    axes = harness.markdown_table(axes_rows, ["axis", *compressors])
    print(table)
    print()
    print(axes)
    harness.write_results(
        args.json,
        {"cells": [vars(cell) for cell in cells], "epochs": c.EPOCHS},
    )
    if args.configurations is None and args.compressors is None:
        _replace_block(Path(args.output), table, axes)
    return 0


def _row(cells, compressors, configuration, attack, data, extra="", **kwargs):
    """One row of a table: the rule uncompressed, then each compressor with
    its verdict; every run appended to `cells`."""
    reference = c.run_cell(
        "none", configuration, attack, data=data, extra=extra, **kwargs
    )
    cells.append(reference)
    row = {"none": _fmt(reference)}
    for compressor in compressors:
        if compressor == "none":
            continue
        cell = c.run_cell(
            compressor, configuration, attack, data=data, extra=extra, **kwargs
        )
        cells.append(cell)
        cell_verdict = c.verdict(cell, reference)
        row[compressor] = (
            f"{_fmt(cell)} {'' if cell_verdict == 'trains' else cell_verdict}".strip()
        )
        _log(
            f"{cell.key}: {_fmt(cell)} ({cell_verdict}; "
            f"{reference.accuracy:.3f} uncompressed)"
        )
    return row


TOP_K_RULES = (
    "mean",
    "median",
    "trimmed_mean",
    "krum",
    "geometric_median",
    "centered_clipping",
)


def top_k_coordinates(args) -> int:
    """Top-k at its default ratio with `coordinates="own"` and `"leader"`
    before a rule of each kind, each against the rule uncompressed."""
    data = c.digits(args.seed)
    cells, rows = [], []
    for attack in c.ATTACKS:
        for rule in TOP_K_RULES:
            reference = c.run_cell("none", rule, attack, data=data)
            cells.append(reference)
            row = {"attack": attack, "rule": rule, "none": _fmt(reference)}
            for coordinates in ("own", "leader"):
                compressor = f"top_k(ratio=0.01, coordinates='{coordinates}')"
                cell = c.run_cell(compressor, rule, attack, data=data)
                cells.append(cell)
                row[coordinates] = _fmt(cell)
                _log(f"{cell.key}: {_fmt(cell)}")
            rows.append(row)
    print(harness.markdown_table(rows, ["attack", "rule", "none", "own", "leader"]))
    json_path = args.json
    if Path(json_path).name == "combinations.json":
        json_path = str(Path(json_path).with_name("top_k_coordinates.json"))
    harness.write_results(json_path, {"cells": [vars(cell) for cell in cells]})
    return 0


ACROSS_WORKERS = 5
JOB = REPO_ROOT / "tests" / "cluster_jobs" / "combination_job.py"
BEGIN_ACROSS = "<!-- BEGIN GENERATED: benchmarks/combinations.py --across-workers -->"
END_ACROSS = "<!-- END GENERATED: benchmarks/combinations.py --across-workers -->"


def across_workers(args) -> int:
    """`combinations.ACROSS_WORKERS_CELLS` on one local cluster of 5
    worker processes and a ps task, every cell a strategy of its own in the
    same job; each compared with its rule uncompressed in the same mode."""
    import json
    import tempfile

    from keras_psdist import cluster

    with tempfile.TemporaryDirectory() as work:
        code = cluster.launch(
            [
                sys.executable,
                str(JOB),
                work,
                json.dumps({"cells": c.ACROSS_WORKERS_CELLS}),
            ],
            num_ps=1,
            num_workers=ACROSS_WORKERS,
            mode="between-graph",
            timeout_s=3600,
        )
        if code != 0:
            raise SystemExit(f"the launch exited {code}")
        report = json.loads((Path(work) / "worker_0.json").read_text())
    cells = [c.Cell(**cell) for cell in report["cells"]]
    references = {
        (cell.extra, cell.configuration): cell
        for cell in cells
        if cell.compressor == "none"
    }
    rows = {}
    for cell in cells:
        row = rows.setdefault(
            (cell.extra, cell.configuration),
            {"mode": cell.extra, "rule": cell.configuration},
        )
        reference = references[(cell.extra, cell.configuration)]
        cell_verdict = c.verdict(cell, reference)
        quiet = cell_verdict in ("trains", "refused") or cell is reference
        row[cell.compressor] = f"{_fmt(cell)} {'' if quiet else cell_verdict}".strip()
    table = harness.markdown_table(
        list(rows.values()), ["mode", "rule", *c.COMPRESSORS]
    )
    print(table)
    json_path = args.json
    if Path(json_path).name == "combinations.json":
        json_path = str(Path(json_path).with_name("combinations_across_workers.json"))
    harness.write_results(
        json_path,
        {"cells": [vars(cell) for cell in cells], "workers": ACROSS_WORKERS},
    )
    text = Path(args.output).read_text()
    block = (
        f"{BEGIN_ACROSS}\n\n"
        f"Held-out accuracy (%) on digits after 8 epochs across {ACROSS_WORKERS} "
        "worker processes and a ps task on this machine, `num_byzantine=1`; sync: "
        "`SyncReplicaStrategy`, the last worker sending -10 times its gradient; "
        'async: `PSStrategy(mode="between-graph")`, no attack. Marks as in the '
        "table above. (`python benchmarks/combinations.py --across-workers`, "
        "`benchmarks/results/combinations_across_workers.json`.)\n\n"
        f"{table}\n\n{END_ACROSS}"
    )
    if BEGIN_ACROSS in text:
        text = re.sub(
            re.escape(BEGIN_ACROSS) + ".*?" + re.escape(END_ACROSS),
            lambda _: block,
            text,
            flags=re.S,
        )
        Path(args.output).write_text(text)
    return 0


def _fmt(cell: c.Cell) -> str:
    if cell.refused is not None:
        return "refused"
    return f"{100 * cell.accuracy:.1f}"


def _replace_block(path: Path, table: str, axes: str) -> None:
    text = path.read_text()
    block = (
        f"{BEGIN}\n\n"
        "Held-out accuracy (%) on digits after 8 epochs, 7 replicas, "
        "`num_byzantine=1`; `scale_-10`: replica 6 sends -10 times its "
        "gradient; `top_k` and `random_k` send 10 % of the coordinates. "
        "Beside a number, `slower`: more than 3 points below the rule "
        "uncompressed (column `none`) but above halfway from chance (10 %) "
        "to it; `FAILS`: below that; `refused`: the "
        "strategy refuses the pair when it is built. "
        "(`python benchmarks/combinations.py`, "
        "`benchmarks/results/combinations.json`.)\n\n"
        f"{table}\n\n"
        "The axes that multiply, each compressor with `trimmed_mean` under the "
        "attack:\n\n"
        f"{axes}\n\n{END}"
    )
    if BEGIN in text:
        text = re.sub(
            re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S
        )
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
