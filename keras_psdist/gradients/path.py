"""The strategy's gradient path, in its one order.

    worker momentum -> (compression) -> attack -> pre-aggregations -> rule

- `Momentum` (`momentum_stage.py`): each replica's momentum of its gradients
  (`worker_momentum=`), kept per replica.
- `Compression` (`compression.py`): what a replica sends, compressed on
  its own device (`compression=`), e.g. top-k with error feedback (a
  residual per replica, kept as the momenta are), decompressed where the
  rest runs.
- `Attacked` (`attack.py`): a simulated attack replaces what the attacked
  replicas send (their momenta, with worker momentum).
- `Transform`s (`pre_aggregation_stages.py`): the configuration's pre-aggregations,
  in the order written (`"nnm>arc>median"`: mix, then clip).
- `Rule` (`rule.py`): the aggregate.

`configure` reads the strategy's `aggregator=` (a configuration string may
end with worker momentum, `"nnm>median+wm"`), `configure_compression` its
`compression=` (or a compressor the string starts with,
`"top_k>median"`), `gradient_path` builds the chain from the strategy's
arguments;
`GradientReduction` (`keras_psdist.distribute.reduction`) runs it each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist import aggregators, spelling
from keras_psdist import compression as compression_lib
from keras_psdist.aggregators.base import Aggregator
from keras_psdist.aggregators.mean import Mean
from keras_psdist.compression.base import Compressor
from keras_psdist.compression.casts import NoCompression
from keras_psdist.compression.random_k import RandomK
from keras_psdist.gradients.attack import Attacked
from keras_psdist.gradients.compression import Compression
from keras_psdist.gradients.momentum_stage import Momentum
from keras_psdist.gradients.pre_aggregation_stages import stages_of
from keras_psdist.gradients.rule import Rule
from keras_psdist.gradients.stage import Chain, Stage, chain


def configure(
    aggregator: Any, worker_momentum: float = 0.0
) -> tuple[Aggregator, float]:
    """A strategy's `aggregator=` and `worker_momentum=`, resolved.

    Args:
        aggregator: What `aggregators.get` takes, or a configuration string
            ending with `+wm[BETA]` (`keras_psdist.spelling`).
        worker_momentum: The strategy's `worker_momentum=` (checked).

    Returns:
        `(aggregator, worker_momentum)`: the (unbound) aggregator, and the
        string's momentum, else the argument's.

    Raises:
        ValueError: as `aggregators.get`, or for a `+wm` suffix that
            disagrees with `worker_momentum=`.
    """
    if spelling.is_spelled(aggregator):
        configuration = spelling.parse(aggregator)
        beta = configuration.worker_momentum
        if beta:
            if worker_momentum and worker_momentum != beta:
                raise ValueError(
                    f"aggregator={aggregator!r} sets worker momentum {beta}, but "
                    f"worker_momentum={worker_momentum}. Set it in one place."
                )
            return aggregators.get(configuration.aggregator), beta
        if configuration.compression is not None:
            # The compressor is `configure_compression`'s.
            return aggregators.get(configuration.aggregator), worker_momentum
    return aggregators.get(aggregator), worker_momentum


def configure_compression(aggregator: Any, compression: Any = None) -> Any:
    """A strategy's `compression=`, resolved.

    Args:
        aggregator: The strategy's `aggregator=`; a configuration string may
            start with a compressor (`"top_k(ratio=0.01)>median"`).
        compression: The strategy's `compression=`: what
            `keras_psdist.compression.get` takes, or `None`.

    Returns:
        The `Compressor`, or `None` for no compression (`"none"` included:
        the gradients travel as they are).

    Raises:
        ValueError: as `keras_psdist.compression.get`, or when the string's compressor
            and `compression=` disagree.
    """
    if isinstance(aggregator, str) and aggregator in compression_lib.names():
        raise ValueError(
            f"aggregator={aggregator!r} is a compressor, not an aggregation "
            f"rule: pass compression={aggregator!r} beside the aggregator, or "
            f"write it first in the configuration, e.g. '{aggregator}>mean'."
        )
    compressor = compression_lib.get(compression)
    if spelling.is_spelled(aggregator):
        written = spelling.parse(aggregator).compression
        if written is not None:
            from_string = compression_lib.get(written)
            if compressor is not None and (
                compression_lib.serialize(compressor)
                != compression_lib.serialize(from_string)
            ):
                raise ValueError(
                    f"aggregator={aggregator!r} starts with the compressor "
                    f"{spelling.spell_config(written)!r}, but compression={compression!r}. "
                    "Set it in one place."
                )
            compressor = from_string
    if type(compressor) is NoCompression:
        return None
    return compressor


def gradient_path(
    aggregator: Aggregator,
    *,
    num_replicas: int,
    attack: Any = None,
    worker_momentum: float = 0.0,
    replica_devices: Sequence[str] | None = None,
    compression: Compressor | None = None,
    compute_devices: Sequence[str] | None = None,
) -> Chain:
    """The chain a strategy runs on each step's gradients.

    Args:
        aggregator: The bound rule, with its pre-aggregations
            (`aggregators.get("nnm>median").bind(n, f)`).
        num_replicas: The replica count n.
        attack: A `keras_psdist.attacks.Attack`, or `None`.
        worker_momentum: Each replica's momentum, or 0 for none.
        replica_devices: The compute devices, one per replica, where each
            replica's momentum lives; `None`: where the rule runs.
        compression: A `keras_psdist.compression.Compressor`, or `None`.
        compute_devices: The compute devices, one per replica, where each
            replica compresses and keeps its residuals (always its own
            device: that is what keeps the bytes down); `None`: where the
            rule runs.

    Returns:
        `chain(Momentum, Compression, Attacked, *Transforms, Rule)`, the
        stages left out that are not configured.
    """
    stages: list[Stage] = []
    if worker_momentum:
        stages.append(Momentum(worker_momentum, num_replicas, replica_devices))
    after: list[Stage] = [Attacked(attack)] if attack is not None else []
    after.extend(stages_of(aggregator))
    if compression is not None:
        # Random-k's kept coordinates, and top-k's under a leader, are the
        # same on every replica: the stages after it run on them alone,
        # unless one keeps state per coordinate (its state has the
        # variable's shape).
        kept_only = all(_keeps_no_state(stage) for stage in after)
        stages.append(
            Compression(
                compression,
                num_replicas,
                compute_devices,
                kept_only,
                shared_coordinates=_shares_coordinates(compression, aggregator),
            )
        )
    stages.extend(after)
    return chain(*stages)


def _shares_coordinates(compression: Compressor, aggregator: Aggregator) -> bool:
    """Whether every replica sends the same coordinates chosen by a leader
    (top-k's `coordinates`, see `TopK`): `"auto"` before a coordinate-wise
    rule.

    Raises:
        ValueError: for top-k's own coordinates before a coordinate-wise
            rule, which then trains nothing.
    """
    shares = getattr(compression, "shares_coordinates", None)
    if shares is None:
        return False
    rule = _last_rule(aggregator)
    shared = shares(coordinatewise=rule.coordinatewise)
    if not shared and rule.coordinatewise and (aggregator.num_replicas or 0) > 1:
        raise ValueError(
            f"compression={compression!r} keeps each replica's own largest "
            f"coordinates, and the coordinate-wise rule {rule.name!r} returns 0 "
            "wherever fewer than half the replicas kept a coordinate, so nothing "
            "trains. Let the replicas send the same coordinates: "
            f"top_k(ratio={compression.ratio}, coordinates='leader') (what "
            "'auto', the default, chooses before such a rule), or random_k."
        )
    return shared


def check_compression_with_momentum(
    compression: Compressor | None, worker_momentum: float
) -> None:
    """Raises `ValueError` for random-k with worker momentum: error feedback
    on momenta sends each coordinate's last ~1 / ratio momenta at once, each
    of which already carries the ones before it, and training falls apart
    (the matrix's digits task, random-k 10 % and momentum 0.9 under the plain
    mean: 32.5 % against 94.7 % without compression and 90.8 % without
    momentum; docs/compression.md). Top-k sends every replica's largest
    momenta each step and trains."""
    if worker_momentum and isinstance(compression, RandomK):
        raise ValueError(
            f"compression={compression!r} with worker_momentum={worker_momentum} "
            "does not train: random-k sends each coordinate about once every "
            f"{round(1 / compression.ratio)} steps, with its error feedback "
            "holding the momenta in between, which already sum the gradients "
            "before them. Use top_k with worker momentum, or random_k without "
            "it."
        )


def check_compression_across_workers(
    compression: Compressor | None, aggregator: Aggregator
) -> None:
    """Raises `ValueError` for top-k before a coordinate-wise rule across
    worker processes (`SyncReplicaStrategy`'s chief): each worker compresses
    its gradient alone, so its coordinates are its own, and the rule returns
    0 wherever fewer than half the workers kept a coordinate."""
    if getattr(compression, "shares_coordinates", None) is None:
        return
    rule = _last_rule(aggregator)
    if rule.coordinatewise and (aggregator.num_replicas or 0) > 1:
        raise ValueError(
            f"compression={compression!r} before the coordinate-wise rule "
            f"{rule.name!r} across workers: each worker compresses its gradient "
            "alone, so its top-k coordinates are its own, and the rule returns 0 "
            "wherever fewer than half the workers kept a coordinate, so nothing "
            "trains. Use random_k (every worker draws the same coordinates from "
            "the seed and the step), or a rule that averages, such as "
            "geometric_median or centered_clipping."
        )


def _last_rule(aggregator: Aggregator) -> Aggregator:
    """The rule at the end of `aggregator`'s pre-aggregations."""
    while getattr(aggregator, "pre_aggregation", False):
        aggregator = aggregator.aggregator
    return aggregator


def _keeps_no_state(stage: Stage) -> bool:
    """Whether `stage` keeps no state between steps."""
    return not tf.nest.flatten(stage.init([tf.TensorSpec([2], tf.float32)]))


def is_plain_mean(path: Chain) -> bool:
    """Whether `path` is the `mean` of the gradients as they are (no
    momentum, compression, attack or pre-aggregation): an all-reduce
    computes it anywhere."""
    [*before, last] = path.stages
    return not before and isinstance(last, Rule) and type(last.aggregator) is Mean
