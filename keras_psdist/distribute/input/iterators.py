"""The distributed dataset and iterator a PSStrategy hands to Keras.

Each input pipeline (one on one host or per async worker; one per worker task
in-graph, see `keras_psdist.distribute.input.pipelines`) is the user's `tf.data` pipeline as it is,
read by a plain `tf.data` iterator on the pipeline's host. A step's `get_next`
is one `IteratorGetNext` per pipeline; the global batch it returns is cut
into the pipeline's replicas' pieces right there, inside the step's compiled
function (`pieces.Pieces.cut`: a few slices per component), and the
pieces are regrouped into `PerReplica` values. `get_next_as_optional` (what
Keras's train function reads) returns a `SplitOptional`, one `Optional` per
pipeline, so that each pipeline's batches stay on its host there too.

So a new epoch's iterator costs what a single device's does. TensorFlow's own
distributed iterator builds a multi-device iterator instead (a prefetching
buffer and function per compute device), which Keras creates (twice) and
destroys at every epoch: on 4 logical CPU replicas about 100 ms to create and
180 ms to tear down, every epoch, against 2 ms for a plain iterator. The
pieces are copied to their replicas' devices by the step that reads them (on
a GPU, at the start of the step rather than prefetched).

The dataset and its iterator are `CompositeTensor`s (their components are
the pipelines' datasets and iterators), so both can be passed into and
returned from a `tf.function` as TensorFlow's own can, and Keras's train
function takes the iterator as an argument without retracing at each epoch.

A pipeline's elements are global batches cut into pieces
(`experimental_distribute_dataset`) or one replica's batch each
(`distribute_datasets_from_function`); `pieces.py` has both readers.
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
from keras_psdist.distribute.input.pieces import (
    Reader,
    reader_from_tuple,
    reader_to_tuple,
)

Pipeline = tuple[str, tf.data.Dataset, Reader]


class SplitDataset(input_lib.DistributedDataset):
    """The distributed dataset of a PSStrategy (both
    `experimental_distribute_dataset` and `distribute_datasets_from_function`).

    A `tf.distribute.DistributedDataset`: iterate it in Python or inside a
    `tf.function` (also one it is passed to as an argument), pass it to
    `model.fit`, or take `iter()` of it and call `get_next()` /
    `get_next_as_optional()`; each element is a structure of `PerReplica`
    values, one batch per replica.

    Args:
        pipelines: `(host device, dataset, the reader that turns its
            elements into replicas' batches)` per input pipeline, in replica
            order.
        element_spec: The element's spec, if known (else traced).
    """

    # TensorFlow's class is subclassed only so that Keras and autograph
    # recognise the result as a distributed dataset (Keras checks the class);
    # none of its state or methods is used but `reduce`, which autograph's
    # `for x in dataset` inside a `tf.function` calls.
    def __init__(self, pipelines: Sequence[Pipeline], element_spec=None):
        self._pipelines = tuple(pipelines)
        if element_spec is None:
            element_spec = regroup_specs(
                [spec for _, d, reader in self._pipelines for spec in reader.specs(d)]
            )
        self._element_spec = element_spec

    def __iter__(self) -> SplitIterator:
        iterators = []
        for host, dataset, _ in self._pipelines:
            with tf.device(host):
                iterators.append(iter(dataset))
        if tf.executing_eagerly():
            # Eager ops on remote tasks run asynchronously, and a function
            # that reads an iterator does not wait for the op that
            # initialises it on another task: wait here (with nothing
            # pending, on one host, a few microseconds per epoch).
            context.async_wait()
        return SplitIterator(
            iterators,
            tuple(host for host, _, _ in self._pipelines),
            tuple(reader for _, _, reader in self._pipelines),
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
    def _type_spec(self) -> SplitDatasetSpec:
        return SplitDatasetSpec(
            tuple(dataset._type_spec for _, dataset, _ in self._pipelines),  # noqa: SLF001
            tuple(host for host, _, _ in self._pipelines),
            tuple(reader for _, _, reader in self._pipelines),
            self._element_spec,
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
        readers: tuple[Reader, ...],
        element_spec,
    ):
        self._iterators = tuple(iterators)
        self._hosts = hosts
        self._readers = readers
        self._element_spec = element_spec

    def __iter__(self) -> SplitIterator:
        return self

    def __next__(self):
        try:
            return self.get_next()
        except tf.errors.OutOfRangeError:
            raise StopIteration from None

    def get_next(self, name: str | None = None):
        """The next step's batches as `PerReplica` values; raises
        `tf.errors.OutOfRangeError` at the end of the data."""
        del name
        batches = []
        for iterator, host, reader in self._parts():
            with tf.device(host):
                batches.extend(reader.take(iterator))
        return regroup(batches)

    def get_next_as_optional(self) -> SplitOptional:
        """The next step's batches as an `Optional`, empty at the end of the
        data (a `SplitOptional`: each pipeline's part stays on its host)."""
        drawn = []
        for iterator, host, reader in self._parts():
            with tf.device(host):
                drawn.append(reader.draw(iterator))
        return SplitOptional(drawn, self._hosts, self._readers, self._element_spec)

    def _parts(self):
        return zip(self._iterators, self._hosts, self._readers, strict=True)

    @property
    def element_spec(self):
        """The structure of `PerReplicaSpec`s of one element."""
        return self._element_spec

    @property
    def _type_spec(self) -> SplitIteratorSpec:
        return SplitIteratorSpec(
            tuple(it._type_spec for it in self._iterators),  # noqa: SLF001
            self._hosts,
            self._readers,
            self._element_spec,
        )


class SplitOptional(tf.experimental.Optional):
    """A step's batches from every input pipeline, as an `Optional`: what
    `SplitIterator.get_next_as_optional` returns.

    Each pipeline's draw stays on its host, and `get_value` cuts each into
    its replicas' batches there: only `has_value`'s one boolean per pipeline
    leaves a host. (One `Optional` of every pipeline's batches would be one
    tensor on one device, and every step's data would pass through it.)
    The pipelines read the same global batches (or, from a function, as many
    steps each), so they end together: it has a value when every
    pipeline's draw has one.

    Args:
        drawn: Each pipeline's draw (`Reader.draw`: a tuple of `Optional`s).
        hosts: Each pipeline's host device.
        readers: Each pipeline's reader.
        element_spec: The spec of the value: a structure of `PerReplicaSpec`s.
    """

    def __init__(self, drawn, hosts, readers, element_spec):
        super().__init__()
        self._drawn = tuple(tuple(d) for d in drawn)
        self._hosts = tuple(hosts)
        self._readers = tuple(readers)
        self._element_spec = element_spec

    def has_value(self, name=None) -> tf.Tensor:
        """Whether every pipeline had a step's data left."""
        del name
        has_value = None
        for drawn, host in zip(self._drawn, self._hosts, strict=True):
            with tf.device(host):
                this = drawn[0].has_value()
            has_value = this if has_value is None else tf.logical_and(has_value, this)
        return has_value

    def get_value(self, name=None):
        """The step's batches, as `PerReplica` values (each cut on its
        pipeline's host); fails if `has_value()` is false."""
        del name
        batches = []
        for drawn, host, reader in zip(
            self._drawn, self._hosts, self._readers, strict=True
        ):
            with tf.device(host):
                batches.extend(reader.values(drawn))
        return regroup(batches)

    @property
    def element_spec(self):
        """The structure of `PerReplicaSpec`s of the value."""
        return self._element_spec

    @property
    def _type_spec(self) -> SplitOptionalSpec:
        return SplitOptionalSpec(
            tuple(tuple(o._type_spec for o in d) for d in self._drawn),  # noqa: SLF001
            self._hosts,
            self._readers,
            self._element_spec,
        )


class _PipelinesSpec(tf.TypeSpec):
    """What the specs of `SplitDataset`, `SplitIterator` and `SplitOptional`
    share: their components' specs (one per pipeline), hosts, readers and
    element spec."""

    __slots__ = ["_component_specs_", "_hosts", "_readers", "_element_spec"]

    def __init__(self, component_specs, hosts, readers, element_spec):
        self._component_specs_ = tuple(component_specs)
        self._hosts = tuple(hosts)
        # Readers, or the plain tuples `_serialize` gives them as.
        self._readers = tuple(
            reader_from_tuple(r) if isinstance(r, tuple) else r for r in readers
        )
        self._element_spec = element_spec

    def _serialize(self):
        readers = tuple(reader_to_tuple(r) for r in self._readers)
        return (self._component_specs_, self._hosts, readers, self._element_spec)

    @property
    def _component_specs(self):
        return self._component_specs_


class SplitDatasetSpec(_PipelinesSpec):
    """The `TypeSpec` of a `SplitDataset`."""

    __slots__ = []

    @property
    def value_type(self):
        return SplitDataset

    def _to_components(self, value):
        return tuple(dataset for _, dataset, _ in value._pipelines)  # noqa: SLF001

    def _from_components(self, components):
        pipelines = zip(self._hosts, components, self._readers, strict=True)
        return SplitDataset(tuple(pipelines), self._element_spec)


class SplitIteratorSpec(_PipelinesSpec):
    """The `TypeSpec` of a `SplitIterator`."""

    __slots__ = []

    @property
    def value_type(self):
        return SplitIterator

    def _to_components(self, value):
        return value._iterators  # noqa: SLF001

    def _from_components(self, components):
        return SplitIterator(components, self._hosts, self._readers, self._element_spec)


class SplitOptionalSpec(_PipelinesSpec):
    """The `TypeSpec` of a `SplitOptional` (its component specs: one tuple
    of `OptionalSpec`s per pipeline)."""

    __slots__ = []

    @property
    def value_type(self):
        return SplitOptional

    def _to_components(self, value):
        return value._drawn  # noqa: SLF001

    def _from_components(self, components):
        return SplitOptional(components, self._hosts, self._readers, self._element_spec)


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
