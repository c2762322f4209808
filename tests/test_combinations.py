"""The combination matrix (`keras_psdist.testing.combinations`): every
compressor with every rule and pre-aggregation of the registries, and the
axes that multiply.

A cell trains, or is refused when the strategy is built with an error that
names a configuration that works; none may fail (`combinations.verdict`:
below halfway from chance to its rule uncompressed, as `top_k>median` once
was with each replica's own coordinates: 13 % on digits). The default run
takes, under the attack (one replica of 7 sends -10 times its gradient),
every compressor but the casts with a robust rule of each kind and top-k with
every rule and pre-aggregation; `nox -s slow` takes every cell, with and without the
attack, and the axes. `benchmarks/combinations.py` writes the table of
docs/compression.md.
"""

from __future__ import annotations

import functools

import pytest

import keras_psdist as kpd
from keras_psdist.testing import combinations as c

COMPRESSED = [name for name in c.COMPRESSORS if name != "none"]


@functools.cache
def _data():
    return c.digits()


@functools.cache
def _reference(configuration: str, attack: str, extra: str = "") -> c.Cell:
    return c.run_cell(
        "none",
        configuration,
        attack,
        data=_data(),
        extra=extra,
        **c.EXTRA_AXES.get(extra, {}),
    )


def _check(compressors, configuration: str, attack: str, extra: str = "") -> None:
    reference = _reference(configuration, attack, extra)
    assert reference.refused is None, reference.refused
    failures = []
    for compressor in compressors:
        cell = c.run_cell(
            compressor,
            configuration,
            attack,
            data=_data(),
            extra=extra,
            **c.EXTRA_AXES.get(extra, {}),
        )
        failures += _failure(cell, reference, "coordinates='leader'")
    assert not failures, "\n".join(failures)


def _failure(cell, reference, fix: str) -> list[str]:
    """`[why]` if `cell` fails against `reference` or is refused without
    naming `fix` (a refusal must say what to use instead), else `[]`."""
    verdict = c.verdict(cell, reference)
    if verdict == "refused" and fix not in cell.refused:
        return [f"{cell.key}: refused without a fix: {cell.refused}"]
    if verdict == "FAILS":
        return [
            f"{cell.key}: {cell.accuracy:.3f} against {reference.accuracy:.3f} "
            "uncompressed"
        ]
    return []


KINDS_OF_RULES = c.KINDS_OF_RULES


# The casts round each value alone and cannot misalign replicas (within 1.4
# points of every rule uncompressed in the whole matrix): the slow run's.
NOT_CASTS = [name for name in COMPRESSED if name not in ("fp16", "bf16")]


# Under the attack the mean itself falls to chance (10.3 %, docs/compression.md),
# and a cell held to a reference at chance fails only by an error: the
# default run leaves the mean's row to the slow matrix (`test_every_cell`).
# `test_compression.py::test_each_compressor_trains_near_the_uncompressed_accuracy`
# holds every compressor with the mean, unattacked, to 5 points.
ROBUST_KINDS = [name for name in KINDS_OF_RULES if name != "mean"]


@pytest.mark.parametrize("configuration", ROBUST_KINDS)
def test_every_compressor_with_a_rule_of_each_kind(configuration):
    _check(NOT_CASTS, configuration, "scale_-10")


@pytest.mark.parametrize(
    "configuration", [name for name in c.CONFIGURATIONS if name not in KINDS_OF_RULES]
)
def test_top_k_with_every_rule_and_pre_aggregation(configuration):
    _check(["top_k"], configuration, "scale_-10")


@pytest.mark.slow
@pytest.mark.parametrize("attack", c.ATTACKS)
@pytest.mark.parametrize("configuration", c.CONFIGURATIONS)
def test_every_cell(configuration, attack):
    _check(COMPRESSED, configuration, attack)


@pytest.mark.slow
@pytest.mark.parametrize("extra", sorted(c.EXTRA_AXES))
def test_every_compressor_on_each_axis(extra):
    _check(COMPRESSED, "trimmed_mean", "scale_-10", extra)


@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "meamed", "nnm>median"])
def test_top_k_with_its_own_coordinates_before_a_coordinatewise_rule_is_refused(
    rule, cpu_devices
):
    with pytest.raises(ValueError, match=r"coordinates='leader'.*random_k"):
        kpd.PSStrategy(
            devices=cpu_devices[:4],
            aggregator=rule,
            num_byzantine=1,
            compression="top_k(ratio=0.1, coordinates='own')",
        )


@pytest.mark.parametrize(
    "rule, expected",
    [
        ("median", True),
        ("bulyan", True),
        ("bucketing>trimmed_mean", True),
        ("mean", False),
        ("geometric_median", False),
        ("centered_clipping", False),
    ],
)
def test_top_k_shares_the_leaders_coordinates_before_coordinatewise_rules(
    rule, expected, cpu_devices
):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:7],
        aggregator=rule,
        num_byzantine=0 if rule == "mean" else 1,
        compression="top_k",
    )
    (stage,) = [
        s
        for s in strategy.extended._reduction.path.stages
        if type(s).__name__ == "Compression"
    ]
    assert stage.leader_chooses is expected


def test_top_k_with_worker_momentum_before_a_coordinatewise_rule():
    """Worker momentum stands before compression: each replica's momentum is
    what is sparsified (at the leader's coordinates), under the attack."""
    extra = {"strategy_kwargs": {"worker_momentum": 0.9}}
    reference = c.run_cell(
        "none", "trimmed_mean", "scale_-10", data=_data(), extra="wm", **extra
    )
    cell = c.run_cell(
        "top_k", "trimmed_mean", "scale_-10", data=_data(), extra="wm", **extra
    )
    # The defence holds uncompressed (the undefended mean is at chance), and
    # compressed within 3 points of it.
    assert reference.accuracy > 0.8, reference
    assert c.verdict(cell, reference) == "trains", (cell, reference)


def test_random_k_with_worker_momentum_is_refused_naming_top_k(cpu_devices):
    """It trained to 32.5 % under the plain mean (94.7 uncompressed, 90.8
    without momentum) on the matrix's task: refused when built."""
    with pytest.raises(ValueError, match=r"worker_momentum=0\.9.*Use top_k"):
        kpd.PSStrategy(
            devices=cpu_devices[:4], compression="random_k", worker_momentum=0.9
        )
    with pytest.raises(ValueError, match=r"Use top_k"):
        kpd.PSStrategy(devices=cpu_devices[:4], aggregator="random_k>trimmed_mean+wm")


# ------------------------------------------------- across worker processes

# The default run's cells across 3 worker processes (the last one attacked
# in the sync modes): a coordinate-wise rule and an averaging one, each
# uncompressed (the reference) and with the compressors that keep state
# across steps (random-k's step-drawn coordinates, top-k's residuals) and a
# cast (its payload holds a dtype); top-k before the median is refused there. `nox -s slow` runs every
# compressor with a rule of each kind on 5 workers.
ACROSS_WORKERS = [
    ("sync", "none", "median", "scale_-10"),
    ("sync", "random_k", "median", "scale_-10"),
    ("sync", "top_k", "median", "scale_-10"),
    ("sync", "none", "geometric_median", "scale_-10"),
    ("sync", "top_k", "geometric_median", "scale_-10"),
    ("sync", "bf16", "geometric_median", "scale_-10"),
    ("elastic sync", "none", "median", "scale_-10"),
    ("elastic sync", "random_k", "median", "scale_-10"),
    ("async", "none", "mean", "none"),
    ("async", "top_k", "mean", "none"),
]


def _launch_cells(tmp_path, cells, num_workers):
    """Every cell on one cluster of `num_workers` worker processes
    (`tests/cluster_jobs/combination_job.py`): `{worker: [Cell, ...]}`."""
    import json
    from pathlib import Path

    import launching
    from launching import without_progress

    code, log = launching.launch_job(
        Path(__file__).parent / "cluster_jobs" / "combination_job.py",
        [tmp_path, json.dumps({"cells": [list(cell) for cell in cells]})],
        num_ps=1,
        num_workers=num_workers,
        mode="between-graph",
        timeout_s=900,
    )
    assert code == 0, f"launch exited {code}:\n{without_progress(log)[-12000:]}"
    return {
        int(p.stem.split("_")[1]): [
            c.Cell(**cell) for cell in json.loads(p.read_text())["cells"]
        ]
        for p in Path(tmp_path).glob("worker_*.json")
    }


def _check_across_workers(reports, num_workers):
    assert sorted(reports) == list(range(num_workers))
    cells = reports[0]  # the chief's (every worker reads the same weights)
    references = {
        (cell.extra, cell.configuration, cell.attack): cell
        for cell in cells
        if cell.compressor == "none"
    }
    failures = []
    for cell in cells:
        reference = references[(cell.extra, cell.configuration, cell.attack)]
        assert reference.refused is None, reference.refused
        failures += _failure(cell, reference, "Use random_k")
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def cells_across_workers(tmp_path_factory):
    return _launch_cells(tmp_path_factory.mktemp("across_workers"), ACROSS_WORKERS, 3)


@pytest.mark.multiprocess
@pytest.mark.xdist_group("across_workers")
def test_across_workers_every_cell_trains_or_is_refused_with_a_fix(
    cells_across_workers,
):
    """Sync, elastic sync (`max_workers`: at the start only the chief is a
    member, and the median with num_byzantine=1 waits for 3) and async
    between graphs."""
    _check_across_workers(cells_across_workers, 3)


@pytest.mark.multiprocess
@pytest.mark.xdist_group("across_workers")
def test_every_worker_draws_random_k_s_coordinates_at_the_same_step(
    cells_across_workers,
):
    """Random-k's coordinates follow each worker's count of its sends: alike
    on every worker only if every one counts each step once. The sync
    chief's apply of the aggregate once compressed it again, counting twice
    (random_k>median under the attack: 20 % against 85 % uncompressed)."""
    steps = {
        (cell.extra, cell.configuration): {
            worker: cells[i].compression_steps
            for worker, cells in cells_across_workers.items()
        }
        for i, cell in enumerate(cells_across_workers[0])
        if cell.compressor == "random_k"
    }
    assert steps
    steps_per_fit = c.EPOCHS * (len(c.digits()[0]) // c.BATCH)
    for key, per_worker in steps.items():
        assert set(per_worker.values()) == {steps_per_fit}, (key, per_worker)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_across_workers_every_compressor_with_a_rule_of_each_kind(tmp_path):
    """5 workers (Krum's fewest with num_byzantine=1), the last attacked."""
    _check_across_workers(_launch_cells(tmp_path, c.ACROSS_WORKERS_CELLS, 5), 5)
