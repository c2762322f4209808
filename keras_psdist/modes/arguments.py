"""`Arguments`: what a strategy front was given, checked before any mode runs.

Both fronts (`PSStrategy`, `SyncReplicaStrategy`) describe their arguments
here and call `checked()`, which validates every argument the fronts share
and resolves the ones that have a lookup (partitioner, aggregator); each mode
then checks what only it cares about (`Mode.validate`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import Any

from absl import logging

from keras_psdist import aggregators as aggregators_lib
from keras_psdist import count_rules, dense_choice, gradients
from keras_psdist import devices as devices_lib
from keras_psdist import partitioners as partitioners_lib
from keras_psdist import placement as placement_lib
from keras_psdist.aggregators.base import check_int_at_least
from keras_psdist.aggregators.momentum import check_beta
from keras_psdist.cluster import runtime
from keras_psdist.cluster.config import MAX_WORKERS_ENV, ClusterConfig
from keras_psdist.variables import delta_reads, narrow_reads


@dataclasses.dataclass(frozen=True)
class Arguments:
    """The arguments of a strategy front (see `PSStrategy` for each one).

    A front that does not take an argument leaves its default.
    """

    devices: Sequence[str] | None = None
    parameter_devices: Sequence[str] | None = None
    placement: str | dict[str, Any] | placement_lib.PlacementFn = "greedy"
    aggregator: str | dict[str, Any] | aggregators_lib.Aggregator = "mean"
    num_byzantine: Any = None
    attack: Any = None
    worker_momentum: float = 0.0
    cluster_resolver: Any = None
    max_staleness: int | None = None
    step_timeout: float = 300.0
    connect_timeout: float = 20.0
    init_timeout: float = 120.0
    partitioner: Any = None
    heartbeat_timeout: float = 30.0
    dense: str | dict[str, Any] | dense_choice.ChooserFn = dense_choice.PS
    replicas_to_aggregate: Any = None
    total_num_replicas: int | None = None
    compression: Any = None
    read_dtype: Any = None
    read_compression: Any = None
    max_workers: int | None = None

    def checked(self) -> Arguments:
        """These arguments checked (`ValueError` naming the fix), with the
        partitioner, the (unbound) aggregator, the worker momentum and the
        compressor (`None` for none) resolved."""
        dense_choice.get(self.dense)
        devices_lib.canonical_names(self.devices, "devices")
        for name in ("replicas_to_aggregate", "total_num_replicas"):
            value = getattr(self, name)
            if value is not None and (
                name == "total_num_replicas"
                or not isinstance(count_rules.get(value, name), count_rules.CountRule)
            ):
                check_int_at_least(name, value, minimum=1)
        devices_lib.canonical_names(self.parameter_devices, "parameter_devices")
        runtime.check_cluster_resolver(self.cluster_resolver)
        check_placement(self.placement)
        worker_momentum = check_beta(self.worker_momentum)
        partitioner = partitioners_lib.get(self.partitioner)
        check_seconds(
            step_timeout=self.step_timeout,
            connect_timeout=self.connect_timeout,
            init_timeout=self.init_timeout,
            heartbeat_timeout=self.heartbeat_timeout,
        )
        if self.num_byzantine is not None and not isinstance(
            count_rules.get(self.num_byzantine, "num_byzantine"), count_rules.CountRule
        ):
            check_int_at_least("num_byzantine", self.num_byzantine, minimum=0)
        compression = gradients.configure_compression(self.aggregator, self.compression)
        read_dtype = narrow_reads.check_read_dtype(self.read_dtype)
        read_compression = delta_reads.check_read_compression(self.read_compression)
        aggregator, worker_momentum = gradients.configure(
            self.aggregator, worker_momentum
        )
        gradients.check_compression_with_momentum(compression, worker_momentum)
        if self.max_staleness is not None:
            check_int_at_least("max_staleness", self.max_staleness, minimum=0)
        max_workers = self.max_workers
        if max_workers is None and os.environ.get(MAX_WORKERS_ENV):
            # `keras-psdist launch --max-workers M` sets it for every worker.
            max_workers = int(os.environ[MAX_WORKERS_ENV])
        if max_workers is not None:
            check_int_at_least("max_workers", max_workers, minimum=1)
        return dataclasses.replace(
            self,
            partitioner=partitioner,
            aggregator=aggregator,
            worker_momentum=worker_momentum,
            compression=compression,
            read_dtype=read_dtype,
            read_compression=read_compression,
            max_workers=max_workers,
        )

    @functools.cached_property
    def config(self) -> ClusterConfig | None:
        """The cluster: `cluster_resolver`'s, else TF_CONFIG's, else None
        (this process alone)."""
        return runtime.resolve_config(self.cluster_resolver)


def check_placement(placement: Any) -> None:
    """Raises `ValueError` unless `placement` names a policy (an id, a
    config dict, a policy) or is callable."""
    placement_lib.get(placement)


def check_seconds(**durations: Any) -> None:
    """Raises `ValueError` unless every value is a positive number of seconds."""
    for name, value in durations.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (value > 0)
        ):
            raise ValueError(
                f"`{name}` must be a positive number of seconds. "
                f"Received: {name}={value!r}"
            )


def warn_if_undefended(aggregator, strategy_name: str) -> None:
    """Warns when a rule that needs `num_byzantine` runs with 0: it then
    defends against nothing (see `Aggregator.needs_num_byzantine`)."""
    if aggregator.needs_num_byzantine and aggregator.f == 0:
        logging.warning(
            "%s(aggregator=%r) runs with num_byzantine=0, so %s %s. Pass "
            "num_byzantine=f, the number of replicas that may be faulty, beside "
            "the same aggregator: %s(aggregator=<your rule>, num_byzantine=f) "
            "(in `keras-psdist demo`: --num-byzantine F).",
            strategy_name,
            aggregator,
            aggregator.name,
            aggregator.without_num_byzantine or "defends against no faulty replica",
            strategy_name,
        )


def resolve_attack(attack, num_replicas, num_byzantine):
    """The attack from its config, checked against the replica count (warns
    when it controls more replicas than `num_byzantine`)."""
    if attack is None:
        return None
    from keras_psdist import attacks as attacks_lib

    attack = attacks_lib.get(attack)
    attack.check(num_replicas)
    if len(attack.replicas) > num_byzantine:
        count = len(attack.replicas)
        logging.warning(
            "The attack controls %d replica%s %s but num_byzantine=%d: the rule "
            "is not guaranteed to withstand it. This is intended only when "
            "probing a rule beyond its tolerance (or showing the undefended "
            "mean).",
            count,
            "" if count == 1 else "s",
            list(attack.replicas),
            num_byzantine,
        )
    return attack
