"""The gradient path: each step's per-replica gradients, stage by stage.

    worker momentum -> (compression) -> attack -> pre-aggregations -> rule

Each stage is a small transform with its own state, as Optax's
`GradientTransformation`: `init(specs) -> state` and
`apply(replicas, state) -> (replicas, state)`; `chain` composes them into
one stage (`stage.py`). The modules, in the path's order:

- `momentum_stage.py`: worker momentum (`Momentum`), state per replica.
- `compression.py`: what each replica sends, compressed on its device
  (`Compression`, over a `keras_psdist.compression.Compressor`), residuals
  per replica.
- `attack.py`: a simulated attack (`Attacked`).
- `pre_aggregation_stages.py`: nearest-neighbour mixing, bucketing, clipping, ARC
  (`Transform`), and `stages_of`, which takes a configuration
  (`"nnm>arc>median"`) apart into stages.
- `rule.py`: the aggregation rule (`Rule`), last, which returns the
  aggregate.
- `path.py`: `gradient_path`, the chain a strategy runs, in that order.

The strategy (`keras_psdist.distribute.reduction`) keeps the chain's state
in variables, in `strategy.extended.training_state`; how a configuration is
written is `keras_psdist.spelling`.
"""

from keras_psdist.gradients.attack import Attacked
from keras_psdist.gradients.compression import Compression
from keras_psdist.gradients.momentum_stage import Momentum
from keras_psdist.gradients.path import (
    check_compression_across_workers,
    check_compression_with_momentum,
    configure,
    configure_compression,
    gradient_path,
    is_plain_mean,
)
from keras_psdist.gradients.pre_aggregation_stages import Transform, stages_of
from keras_psdist.gradients.rule import Rule
from keras_psdist.gradients.stage import Chain, Replicas, Stage, chain

__all__ = [
    "Attacked",
    "Chain",
    "Compression",
    "Momentum",
    "Replicas",
    "Rule",
    "Stage",
    "Transform",
    "chain",
    "configure",
    "check_compression_across_workers",
    "check_compression_with_momentum",
    "configure_compression",
    "gradient_path",
    "is_plain_mean",
    "stages_of",
]
