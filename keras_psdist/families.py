"""Every pluggable family's string ids, in one place that imports no TensorFlow.

One dictionary per family, each id written once (Keras's shape: see
`keras_psdist.registry`). The classes read their id back from here
(`aggregators.Krum.name == "krum"`), `get`, `serialize` and `deserialize` of
each family go through its `Registry`, and the CLI's `--help` lists these ids
without importing TensorFlow.

| family | where it is used |
|---|---|
| `AGGREGATORS` | `PSStrategy(aggregator=...)`, `keras-psdist demo --aggregator` (`RULES` and `PRE_AGGREGATIONS`, chained as `"nnm>median"`: `keras_psdist.spelling`) |
| `ATTACKS` | `PSStrategy(attack=...)`, `keras-psdist demo --attack` |
| `PLACEMENTS` | `PSStrategy(placement=...)`: which parameter device a variable goes to |
| `PARTITIONERS` | `PSStrategy(partitioner=...)`: into how many row shards a variable is split |
| `DENSE_CHOICES` | `PSStrategy(dense=...)`: which variables are replicated and all-reduced |
| `COMPRESSORS` | `PSStrategy(compression=...)`, `keras-psdist demo --compression`: what a replica sends instead of its gradient |

Placement policies and dense choices are built from their config, then bound
to the run's devices (`bind`), as an aggregator is bound to its replica
count; a partitioner, like an attack, needs arguments, so a bare id of it is
refused with an example config.

Examples:

>>> from keras_psdist import families
>>> families.AGGREGATORS.names()[:3]
['mean', 'median', 'trimmed_mean']
"""

from __future__ import annotations

from keras_psdist.registry import Registry

# The rules: the last stage of a gradient path, which returns the aggregate.
_RULES = {
    "mean": "keras_psdist.aggregators.mean:Mean",
    "median": "keras_psdist.aggregators.median:Median",
    "trimmed_mean": "keras_psdist.aggregators.trimmed_mean:TrimmedMean",
    "krum": "keras_psdist.aggregators.krum:Krum",
    "multi_krum": "keras_psdist.aggregators.krum:MultiKrum",
    "bulyan": "keras_psdist.aggregators.bulyan:Bulyan",
    "geometric_median": "keras_psdist.aggregators.geometric_median:GeometricMedian",
    "centered_clipping": "keras_psdist.aggregators.centered_clipping:CenteredClipping",
    "mda": "keras_psdist.aggregators.mda:MinimumDiameterAveraging",
    "meamed": "keras_psdist.aggregators.meamed:MeanAroundMedian",
    "smea": "keras_psdist.aggregators.smea:SMEA",
    "caf": "keras_psdist.aggregators.caf:CAF",
    "monna": "keras_psdist.aggregators.monna:MoNNA",
}

# The pre-aggregations: each transforms the replicas' values for the rule
# after it ("nnm>median", see `keras_psdist.spelling`); on its own, an id
# builds the pre-aggregation around its default rule.
_PRE_AGGREGATIONS = {
    "nnm": "keras_psdist.aggregators.nnm:NearestNeighborMixing",
    "bucketing": "keras_psdist.aggregators.bucketing:Bucketing",
    "clipping": "keras_psdist.aggregators.clipping:Clipping",
    "arc": "keras_psdist.aggregators.arc:ARC",
}

AGGREGATORS = Registry(
    "aggregator",
    {**_RULES, **_PRE_AGGREGATIONS},
    base="keras_psdist.aggregators.base:Aggregator",
    example="{'class_name': 'trimmed_mean', 'config': {'num_byzantine': 1}}",
)

# The built-in ids of each kind (a user's registered class says its kind
# with `pre_aggregation = True`).
RULES = tuple(_RULES)
PRE_AGGREGATIONS = tuple(_PRE_AGGREGATIONS)

ATTACKS = Registry(
    "attack",
    {
        "sign_flip": "keras_psdist.attacks.gradient:SignFlip",
        "scale": "keras_psdist.attacks.gradient:Scale",
        "gaussian_noise": "keras_psdist.attacks.gradient:GaussianNoise",
        "non_finite": "keras_psdist.attacks.gradient:NonFinite",
        "alie": "keras_psdist.attacks.crafted:ALIE",
        "ipm": "keras_psdist.attacks.crafted:IPM",
        "optimal_alie": "keras_psdist.attacks.adaptive:OptimalALIE",
        "optimal_ipm": "keras_psdist.attacks.adaptive:OptimalIPM",
        "optimal_label_flip": "keras_psdist.attacks.adaptive:OptimalLabelFlip",
        "mimic": "keras_psdist.attacks.crafted:Mimic",
        "min_max": "keras_psdist.attacks.min_max:MinMax",
        "min_sum": "keras_psdist.attacks.min_max:MinSum",
        "rop": "keras_psdist.attacks.history:ROP",
        "label_flip": "keras_psdist.attacks.data:LabelFlip",
    },
    base="keras_psdist.attacks.base:Attack",
    example="{'class_name': 'sign_flip', 'config': {'replicas': [7]}}",
    needs_arguments="the replicas it controls",
    example_arguments="replicas=[7]",
)

PLACEMENTS = Registry(
    "placement",
    {
        "greedy": "keras_psdist.placement:GreedyPlacement",
        "round_robin": "keras_psdist.placement:RoundRobinPlacement",
    },
    base="keras_psdist.placement:PlacementPolicy",
    example="{'class_name': 'greedy'}",
)

PARTITIONERS = Registry(
    "partitioner",
    {
        "fixed": "keras_psdist.partitioners:Fixed",
        "min_size": "keras_psdist.partitioners:MinSize",
        "max_size": "keras_psdist.partitioners:MaxSize",
    },
    base="keras_psdist.partitioners:Partitioner",
    example="{'class_name': 'fixed', 'config': {'num_shards': 2}}",
    needs_arguments="its shard count or sizes",
    example_arguments="...",
)

DENSE_CHOICES = Registry(
    "dense choice",
    {
        "ps": "keras_psdist.dense_choice:AllOnPS",
        "all_reduce": "keras_psdist.dense_choice:DenseAllReduce",
        "auto": "keras_psdist.dense_choice:AutoChoice",
    },
    base="keras_psdist.dense_choice:DenseChoice",
    example="{'class_name': 'auto'}",
    argument="dense",
)

COMPRESSORS = Registry(
    "compressor",
    {
        "none": "keras_psdist.compression.casts:NoCompression",
        "fp16": "keras_psdist.compression.casts:FP16",
        "bf16": "keras_psdist.compression.casts:BF16",
        "top_k": "keras_psdist.compression.top_k:TopK",
        "random_k": "keras_psdist.compression.random_k:RandomK",
        "sign": "keras_psdist.compression.sign:Sign",
        "power_sgd": "keras_psdist.compression.power_sgd:PowerSGD",
    },
    base="keras_psdist.compression.base:Compressor",
    example="{'class_name': 'top_k', 'config': {'ratio': 0.01}}",
    argument="compression",
)
