"""The distributed dataset and iterator a PSStrategy hands to Keras.

Each input pipeline (one on one host or per async worker; one per worker task
in-graph, see `keras_psdist.distribute.input.pipelines`) is the user's `tf.data` pipeline as it is,
read by a plain `tf.data` iterator on the pipeline's host. A step's `get_next`
is one `IteratorGetNext` per pipeline; the global batch it returns is cut
into the pipeline's replicas' pieces right there, inside the step's compiled
function (`pieces.Pieces.cut`: a few slices per component), and the
pieces are regrouped into `PerReplica` values.

So a new epoch's iterator costs what a single device's does. TensorFlow's own
distributed iterator builds a multi-device iterator instead (a prefetching
buffer and function per compute device), which Keras creates (twice) and
destroys at every epoch: on 4 logical CPU replicas about 100 ms to create and
180 ms to tear down, every epoch, against 2 ms for a plain iterator. The
pieces are copied to their replicas' devices by the step that reads them (on
a GPU, at the start of the step rather than prefetched).

The iterator is a `CompositeTensor`, so Keras's train function takes it as an
argument without retracing at each epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from keras_psdist._tf import (
    composite_tensor,
    context,
    distribute_utils,
    input_lib,
    values,
)
from keras_psdist.distribute.input.pieces import Pieces

Pipeline = tuple[str, tf.data.Dataset, Pieces]


class SplitDataset(input_lib.DistributedDataset):
    """`strategy.experimental_distribute_dataset(...)` of a PSStrategy.

    A `tf.distribute.DistributedDataset`: iterate it in Python or inside a
    `tf.function`, pass it to `model.fit`, or take `iter()` of it and call
    `get_next()` / `get_next_as_optional()`; each element is a structure of
    `PerReplica` values, one batch per replica.

    Args:
        pipelines: `(host device, dataset of global batches, the pieces it
            keeps)` per input pipeline, in replica order.
        strategy: The strategy the dataset belongs to.
    """

    # TensorFlow's class is subclassed only so that Keras recognises the
    # result as a distributed dataset (it checks the class name); none of its
    # state or methods is used.
    def __init__(self, pipelines: Sequence[Pipeline], strategy):
        self._pipelines = tuple(pipelines)
        self._strategy = strategy
        self._element_spec = regroup_specs(
            [spec for _, d, cut in self._pipelines for spec in piece_specs(d, cut)]
        )

    def __iter__(self) -> SplitIterator:
        iterators = []
        for host, dataset, _ in self._pipelines:
            with tf.device(host):
                iterators.append(iter(dataset))
        if len(self._pipelines) > 1 and tf.executing_eagerly():
            # Eager ops on remote tasks run asynchronously, and a function
            # that reads an iterator does not wait for the op that
            # initialises it on another task: wait here.
            context.async_wait()
        return SplitIterator(
            iterators,
            tuple(host for host, _, _ in self._pipelines),
            tuple(cut for _, _, cut in self._pipelines),
            self._element_spec,
        )

    @property
    def element_spec(self):
        """The structure of `PerReplicaSpec`s of one element."""
        return self._element_spec

    @property
    def cardinality(self) -> np.int64:
        """Global batches per pass (-1 infinite, -2 unknown), as TensorFlow's."""
        return np.int64(self._pipelines[0][1].cardinality().numpy())

    @property
    def _type_spec(self):
        raise TypeError(
            "A PSStrategy distributed dataset cannot be passed into a "
            "`tf.function` as an argument. Pass `iter(dataset)` instead, or "
            "iterate over the dataset inside the function from a closure."
        )

    def build(self, dataset_to_replace=None):
        """Nothing to build: the pipelines are built with the dataset."""

    def auto_shard(self, num_shards, shard_ix):
        raise NotImplementedError(
            "A PSStrategy distributed dataset is not sharded across clients: "
            "every replica's batch is cut from the global batch (see "
            "keras_psdist.distribute.input)."
        )

    def __repr__(self) -> str:
        hosts = [host for host, _, _ in self._pipelines]
        return f"SplitDataset(pipelines on {hosts}, element_spec={self._element_spec})"


class SplitIterator(
    tf.distribute.DistributedIterator, composite_tensor.CompositeTensor
):
    """One plain `tf.data` iterator per input pipeline (see `SplitDataset`)."""

    def __init__(
        self,
        iterators: Sequence[tf.data.Iterator],
        hosts: tuple[str, ...],
        pieces: tuple[Pieces, ...],
        element_spec,
    ):
        self._iterators = tuple(iterators)
        self._hosts = hosts
        self._pieces = pieces
        self._element_spec = element_spec

    def __iter__(self) -> SplitIterator:
        return self

    def __next__(self):
        try:
            return self.get_next()
        except tf.errors.OutOfRangeError:
            raise StopIteration from None

    def get_next(self, name: str | None = None):
        """The next global batch as `PerReplica` values; raises
        `tf.errors.OutOfRangeError` at the end of the data."""
        del name
        batches = []
        for iterator, host in zip(self._iterators, self._hosts, strict=True):
            with tf.device(host):
                batches.append(iterator.get_next())
        return self._replica_pieces(batches)

    def get_next_as_optional(self) -> tf.experimental.Optional:
        """The next global batch as an `Optional`, empty at the end of the data."""
        optionals = []
        for iterator, host in zip(self._iterators, self._hosts, strict=True):
            with tf.device(host):
                optionals.append(iterator.get_next_as_optional())
        # The pipelines read the same global batches, so they end together.
        has_value = optionals[0].has_value()
        for optional in optionals[1:]:
            has_value = tf.logical_and(has_value, optional.has_value())

        def value():
            batches = [optional.get_value() for optional in optionals]
            return tf.experimental.Optional.from_value(self._replica_pieces(batches))

        def empty():
            return tf.experimental.Optional.empty(self._element_spec)

        return tf.cond(has_value, value, empty)

    def _replica_pieces(self, batches):
        """Each pipeline's global batch, cut into its replicas' pieces, as one
        structure of `PerReplica` values."""
        pieces = []
        for batch, host, cut in zip(batches, self._hosts, self._pieces, strict=True):
            with tf.device(host):
                pieces.extend(cut.cut(batch))
        return regroup(pieces)

    @property
    def element_spec(self):
        """The structure of `PerReplicaSpec`s of one element."""
        return self._element_spec

    @property
    def _type_spec(self) -> SplitIteratorSpec:
        return SplitIteratorSpec(
            tuple(it._type_spec for it in self._iterators),  # noqa: SLF001
            self._hosts,
            self._pieces,
            self._element_spec,
        )


class SplitIteratorSpec(tf.TypeSpec):
    """The `TypeSpec` of a `SplitIterator`: its pipelines' iterator specs,
    hosts and pieces."""

    __slots__ = ["_iterator_specs", "_hosts", "_pieces", "_element_spec"]

    def __init__(self, iterator_specs, hosts, pieces, element_spec):
        self._iterator_specs = tuple(iterator_specs)
        self._hosts = tuple(hosts)
        # `Pieces`, or the plain tuples `_serialize` gives them as.
        self._pieces = tuple(p if isinstance(p, Pieces) else Pieces(*p) for p in pieces)
        self._element_spec = element_spec

    @property
    def value_type(self):
        return SplitIterator

    def _serialize(self):
        cuts = tuple((p.num_pieces, p.low, p.high) for p in self._pieces)
        return (self._iterator_specs, self._hosts, cuts, self._element_spec)

    @property
    def _component_specs(self):
        return self._iterator_specs

    def _to_components(self, value):
        return value._iterators  # noqa: SLF001

    def _from_components(self, components):
        return SplitIterator(components, self._hosts, self._pieces, self._element_spec)


def piece_specs(dataset: tf.data.Dataset, pieces: Pieces) -> tuple:
    """The specs of the pieces `pieces.cut` makes of `dataset`'s elements
    (traced once per element spec and cut, in a graph that never runs: each
    `fit`, `evaluate` and `predict` distributes its data again)."""
    spec = dataset.element_spec
    try:
        key = (spec, pieces)
        hash(key)
    except TypeError:  # a dict of inputs: traced each time
        return _traced_piece_specs(spec, pieces)
    if key not in _PIECE_SPECS:
        _PIECE_SPECS[key] = _traced_piece_specs(spec, pieces)
    return _PIECE_SPECS[key]


# Type specs are immutable values, so the cached ones are shared safely.
_PIECE_SPECS: dict = {}


def _traced_piece_specs(spec, pieces: Pieces) -> tuple:
    graph = tf.function(pieces.cut, autograph=False).get_concrete_function(spec)
    return tf.nest.map_structure(
        tf.type_spec_from_value, graph.structured_outputs, expand_composites=False
    )


def regroup(per_replica: list):
    """Replica-ordered structures -> one structure of `PerReplica` values."""
    return distribute_utils.regroup(per_replica)


def regroup_specs(per_replica_specs: list):
    """The `element_spec` of what `regroup` makes of values of these specs."""
    if len(per_replica_specs) == 1:
        return per_replica_specs[0]
    return tf.nest.map_structure(
        lambda *specs: values.PerReplicaSpec(*specs), *per_replica_specs
    )
