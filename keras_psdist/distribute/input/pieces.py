"""How an input pipeline's elements become its replicas' batches.

Two readers, one per way a user hands over data:

- `Pieces` (`experimental_distribute_dataset`): each element is a global
  batch, cut into the replicas' pieces.
- `ReplicaElements` (`distribute_datasets_from_function`): each element is
  already one replica's batch; a step reads one per replica of the pipeline.

Piece `k` of a batch of `B` examples cut into `n` pieces is rows
`piece_bounds(B, n, k)`: consecutive, in replica order, of sizes that differ by
at most one, so no piece is empty while `B >= n` (5 examples in 4 pieces: 2,
1, 1, 1). Every input pipeline of a PSStrategy cuts the same way (one host,
each in-graph worker, each async worker keeping its own pieces), which is
what makes an in-graph run equal a one-host run and gives async workers
disjoint data.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class Pieces:
    """Which pieces of every global batch one input pipeline keeps.

    Attributes:
        num_pieces: How many pieces a global batch is cut into (all replicas
            of the run).
        low: The first piece kept.
        high: One past the last piece kept.
    """

    num_pieces: int
    low: int
    high: int

    def take(self, iterator) -> tuple:
        """The kept pieces of the next global batch; raises
        `tf.errors.OutOfRangeError` at the end of the data."""
        return self.cut(iterator.get_next())

    def draw(self, iterator) -> tuple:
        """The next global batch as a one-`Optional` tuple, empty at the
        end of the data: a step's draw from the pipeline."""
        return (iterator.get_next_as_optional(),)

    def values(self, drawn: tuple) -> tuple:
        """The kept pieces of a `draw` that has a value."""
        return self.cut(drawn[0].get_value())

    def specs(self, dataset: tf.data.Dataset) -> tuple:
        """The specs of the kept pieces of `dataset`'s elements."""
        return piece_specs(dataset, self)

    def cut(self, element):
        """The kept pieces of one global batch, as a tuple of structures like
        `element`."""
        # A batch size known when tracing gives pieces of known sizes, so the
        # step needs no stand-ins for empty pieces unless some piece is
        # empty (`replica_batches.py`): their machinery is left out.
        size = _static_global_batch_size(element)
        if size is None:
            size = _global_batch_size(element)
        pieces = []
        for k in range(self.low, self.high):
            start, stop = piece_bounds(size, self.num_pieces, k)
            pieces.append(
                tf.nest.map_structure(
                    lambda x, start=start, stop=stop: rows(x, start, stop), element
                )
            )
        return tuple(pieces)

    def reaches(self, element) -> tf.Tensor:
        """Whether a global batch is large enough to give piece `low` a row."""
        return _global_batch_size(element) > self.low


@dataclass(frozen=True)
class ReplicaElements:
    """A pipeline whose every element is one replica's batch: a step reads
    `count` consecutive elements, one per replica of the pipeline, in replica
    order (as TensorFlow's distributed iterator does).

    At the end of the data a step may find fewer elements than replicas: the
    replicas left over get a batch of zero rows (which
    `keras_psdist.distribute.replica_batches` gives a stand-in weighing 0).

    Attributes:
        count: The pipeline's replicas.
    """

    count: int

    def take(self, iterator) -> tuple:
        """One element per replica; raises `tf.errors.OutOfRangeError` when
        not even the first replica gets one."""
        first = iterator.get_next()
        rest = [iterator.get_next_as_optional() for _ in range(self.count - 1)]
        return (first, *(_or_no_rows(optional, first) for optional in rest))

    def draw(self, iterator) -> tuple:
        """The next `count` elements as `Optional`s (a step's draw); the
        first is empty at the end of the data."""
        return tuple(iterator.get_next_as_optional() for _ in range(self.count))

    def values(self, drawn: tuple) -> tuple:
        """One batch per replica from a `draw` whose first element has a
        value."""
        first = drawn[0].get_value()
        return (first, *(_or_no_rows(o, first) for o in drawn[1:]))

    def specs(self, dataset: tf.data.Dataset) -> tuple:
        """Each replica's spec: the element's, any batch size (a replica
        left without data at the end gets zero rows)."""
        spec = tf.nest.map_structure(_any_batch_size, dataset.element_spec)
        return (spec,) * self.count


def _or_no_rows(optional, like):
    """The optional's value, else `like` with zero rows."""
    return tf.cond(
        optional.has_value(),
        optional.get_value,
        lambda: tf.nest.map_structure(lambda x: rows(x, 0, 0), like),
    )


def _any_batch_size(spec):
    shape = getattr(spec, "shape", None)
    if shape is None or shape.rank == 0:
        return spec
    return spec._unbatch()._batch(None)  # noqa: SLF001


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


Reader = Pieces | ReplicaElements


def reader_to_tuple(reader: Reader) -> tuple:
    """A reader as plain values (for a `TypeSpec`'s serialization)."""
    if isinstance(reader, Pieces):
        return ("pieces", reader.num_pieces, reader.low, reader.high)
    return ("elements", reader.count)


def reader_from_tuple(values: tuple) -> Reader:
    """The inverse of `reader_to_tuple`."""
    kind, *fields = values
    return Pieces(*fields) if kind == "pieces" else ReplicaElements(*fields)


def _global_batch_size(element) -> tf.Tensor:
    return batch_size(tf.nest.flatten(element)[0])


def _static_global_batch_size(element) -> int | None:
    """The global batch size when every component is a dense tensor whose
    batch dimension is known when tracing (`batch(..., drop_remainder=True)`),
    else None."""
    sizes = set()
    for x in tf.nest.flatten(element):
        if not isinstance(x, tf.Tensor) or x.shape.rank in (None, 0):
            return None
        sizes.add(x.shape[0])
    if len(sizes) != 1 or None in sizes:
        return None
    return sizes.pop()


def piece_bounds(size: tf.Tensor | int, num_pieces: int, index: int):
    """`(start, stop)` of piece `index` of `size` rows cut into `num_pieces`
    (Python ints for a Python int `size`)."""
    if isinstance(size, int):
        base, extra = divmod(size, num_pieces)
        start = index * base + min(index, extra)
        return start, start + base + int(index < extra)
    base = size // num_pieces
    extra = size % num_pieces
    start = index * base + tf.minimum(tf.constant(index, size.dtype), extra)
    stop = start + base + tf.cast(index < extra, size.dtype)
    return start, stop


def batch_size(x) -> tf.Tensor:
    """The leading (batch) dimension of a dense, ragged or sparse tensor, int64."""
    if isinstance(x, tf.SparseTensor):
        return x.dense_shape[0]
    if isinstance(x, tf.RaggedTensor):
        return x.nrows(out_type=tf.int64)
    return tf.shape(x, out_type=tf.int64)[0]


def rows(x, start: tf.Tensor, stop: tf.Tensor):
    """Rows `[start, stop)` of a dense, ragged or sparse tensor."""
    if isinstance(x, tf.SparseTensor):
        zeros = tf.zeros_like(x.dense_shape[1:])
        return tf.sparse.slice(
            x,
            tf.concat([[start], zeros], 0),
            tf.concat([[stop - start], x.dense_shape[1:]], 0),
        )
    return x[start:stop]
