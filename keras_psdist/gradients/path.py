"""The strategy's gradient path, in its one order.

    worker momentum -> (compression) -> attack -> pre-aggregations -> rule

- `Momentum` (`momentum.py`): each replica's momentum of its gradients
  (`worker_momentum=`), kept per replica.
- compression, next: what a replica sends, e.g. top-k with error feedback
  (a per-replica residual, kept as the momenta are).
- `Attacked` (`attack.py`): a simulated attack replaces what the attacked
  replicas send (their momenta, with worker momentum).
- `Transform`s (`pre_aggregation.py`): the configuration's pre-aggregations,
  in the order written (`"nnm>arc>median"`: mix, then clip).
- `Rule` (`rule.py`): the aggregate.

`configure` reads the strategy's `aggregator=` (a configuration string may
end with worker momentum, `"nnm>median+wm"`), `gradient_path` builds the
chain from the strategy's arguments;
`GradientReduction` (`keras_psdist.distribute.reduction`) runs it each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keras_psdist import aggregators, spelling
from keras_psdist.aggregators.base import Aggregator
from keras_psdist.aggregators.mean import Mean
from keras_psdist.gradients.attack import Attacked
from keras_psdist.gradients.momentum import Momentum
from keras_psdist.gradients.pre_aggregation import stages_of
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
    return aggregators.get(aggregator), worker_momentum


def gradient_path(
    aggregator: Aggregator,
    *,
    num_replicas: int,
    attack: Any = None,
    worker_momentum: float = 0.0,
    replica_devices: Sequence[str] | None = None,
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

    Returns:
        `chain(Momentum, Attacked, *Transforms, Rule)`, the stages left out
        that are not configured.
    """
    stages: list[Stage] = []
    if worker_momentum:
        stages.append(Momentum(worker_momentum, num_replicas, replica_devices))
    if attack is not None:
        stages.append(Attacked(attack))
    stages.extend(stages_of(aggregator))
    return chain(*stages)


def is_plain_mean(path: Chain) -> bool:
    """Whether `path` is the `mean` of the gradients as they are (no
    momentum, attack or pre-aggregation): an all-reduce computes it
    anywhere."""
    [*before, last] = path.stages
    return not before and isinstance(last, Rule) and type(last.aggregator) is Mean
