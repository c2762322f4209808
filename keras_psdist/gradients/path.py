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

`gradient_path` builds that chain from the strategy's arguments;
`GradientReduction` (`keras_psdist.distribute.reduction`) runs it each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keras_psdist.aggregators.base import Aggregator
from keras_psdist.aggregators.mean import Mean
from keras_psdist.gradients.attack import Attacked
from keras_psdist.gradients.momentum import Momentum
from keras_psdist.gradients.pre_aggregation import stages_of
from keras_psdist.gradients.rule import Rule
from keras_psdist.gradients.stage import Chain, Stage, chain


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
