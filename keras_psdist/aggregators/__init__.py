"""Aggregation rules, looked up the Keras way.

Examples:

>>> from keras_psdist import aggregators
>>> aggregators.get("mean")
Mean()
>>> aggregators.deserialize(aggregators.serialize(aggregators.Mean()))
Mean()
"""

from __future__ import annotations

from keras_psdist.aggregators.arc import ARC
from keras_psdist.aggregators.base import Aggregation, Aggregator
from keras_psdist.aggregators.bucketing import Bucketing
from keras_psdist.aggregators.bulyan import Bulyan
from keras_psdist.aggregators.centered_clipping import (
    CenteredClipping,
    CenteredClippingState,
)
from keras_psdist.aggregators.clipping import Clipping
from keras_psdist.aggregators.geometric_median import GeometricMedian
from keras_psdist.aggregators.krum import Krum, MultiKrum
from keras_psdist.aggregators.mean import Mean
from keras_psdist.aggregators.median import Median
from keras_psdist.aggregators.nnm import NearestNeighborMixing
from keras_psdist.aggregators.registry import (
    deserialize,
    get,
    names,
    register,
    serialize,
)
from keras_psdist.aggregators.trimmed_mean import TrimmedMean

for _name, _cls in (
    ("mean", Mean),
    ("median", Median),
    ("trimmed_mean", TrimmedMean),
    ("krum", Krum),
    ("multi_krum", MultiKrum),
    ("bulyan", Bulyan),
    ("geometric_median", GeometricMedian),
    ("centered_clipping", CenteredClipping),
    ("nnm", NearestNeighborMixing),
    ("bucketing", Bucketing),
    ("clipping", Clipping),
    ("arc", ARC),
):
    register(_name, _cls)
del _name, _cls

__all__ = [
    "ARC",
    "Aggregation",
    "Aggregator",
    "Bucketing",
    "Bulyan",
    "CenteredClipping",
    "CenteredClippingState",
    "Clipping",
    "GeometricMedian",
    "Krum",
    "Mean",
    "Median",
    "MultiKrum",
    "NearestNeighborMixing",
    "TrimmedMean",
    "deserialize",
    "get",
    "names",
    "register",
    "serialize",
]
