"""Many tensors across a task boundary as one: packed reads and pushes.

A ps task's CPU pays for every tensor a step moves, not only for its bytes:
about 0.06 ms per tensor at 10 steps per call, over a floor per step
(`benchmarks/ps_request_cost.py`, docs/benchmarks.md). A Keras model has a
kernel and a bias per dense layer and more per normalization layer, so a
step that moves one tensor per variable each way moves dozens to hundreds.
Here the tensors of one step that go from one task to another travel as
one:

- **pushes** (`move_together`): the gradients a worker sends to one ps
  task (Keras's update step, `PSExtended.optimizer_update`) and the ones
  each replica sends to the reduction device in-graph
  (`GradientReduction`) are concatenated where they are, moved as one
  tensor and split on arrival;
- **reads** (`PackedReads`): in a Keras step (`fit`, `evaluate`,
  `predict`), the first read of one of the model's trainable variables from
  a ps task reads all of that task's trainable variables of the model as one
  tensor, and every read of them in the step takes its piece.

What the step computes is the same: the same values in the same order of
writes. A read of a variable the step has written (an update inside a
custom `train_step`) reads it again where it lives; reads inside a
`tf.cond` or a loop of the step (an RNN's), custom training loops, eager
steps and XLA-compiled steps read each variable as before. Tensors larger
than `MAX_PACKED_ELEMENTS` (256 KiB of float32) travel alone: their bytes,
not their count, are their cost. `strategy.extended.pack_transfers = False` moves one tensor per
variable each way again (for measuring what packing saves).

Examples:

>>> a = tf.ones([2, 3]); b = tf.zeros([4])
>>> [t.shape for t in move_together([a, b], "/job:localhost/task:0/device:CPU:0")]
[TensorShape([2, 3]), TensorShape([4])]
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from keras_psdist._tf import control_flow_util, device_util, record, tape_lib
from keras_psdist.variables import narrow_reads

# Tensors of more elements than this (256 KiB of float32) travel alone:
# copying one into a pack costs about what its own transfer costs the ps
# (~0.06 ms; `benchmarks/ps_request_cost.py`: packing the benchmark MLP's 6
# variables, one of them 1 MiB, left the ps's CPU as it was and made a
# worker's step 10% slower).
MAX_PACKED_ELEMENTS = 1 << 16


def move_together(tensors: Sequence[Any], device: str) -> list[Any]:
    """`tensors`, those that cross to `device`'s task as one tensor per
    source device and dtype.

    Each group of at least two dense tensors of known shape, on one device
    of another task than `device`, is concatenated where it is, moved and
    split on `device`. Everything else (one tensor alone, `IndexedSlices`,
    a tensor on `device`'s own task, an eager tensor) is returned as it is,
    for its consumer to fetch.
    """
    out = list(tensors)
    if tf.executing_eagerly():
        return out
    device = device_util.canonicalize(device)
    groups: dict[tuple[str, tf.DType], list[int]] = {}
    for i, tensor in enumerate(tensors):
        if _travels_packed(tensor, device):
            source = device_util.canonicalize(tensor.device)
            groups.setdefault((source, tensor.dtype), []).append(i)
    for (source, _), indices in groups.items():
        if len(indices) < 2:
            continue
        pieces = _packed([tensors[i] for i in indices], source, device)
        for i, piece in zip(indices, pieces, strict=True):
            out[i] = piece
    return out


def _travels_packed(tensor: Any, device: str) -> bool:
    return (
        isinstance(tensor, tf.Tensor)
        and bool(tensor.device)
        and tensor.shape.is_fully_defined()
        and tensor.shape.num_elements() <= MAX_PACKED_ELEMENTS
        and narrow_reads.crosses_tasks(device_util.canonicalize(tensor.device), device)
    )


def _packed(
    members: Sequence[tf.Tensor],
    source: str,
    destination: str,
    wire_dtype: tf.DType | None = None,
) -> list[tf.Tensor]:
    """`members` (on `source`) on `destination`, as one tensor on the way
    (in `wire_dtype` if given, cast back on arrival)."""
    sizes = [m.shape.num_elements() for m in members]
    with tf.device(source):
        flat = tf.concat([tf.reshape(m, [-1]) for m in members], 0)
        if wire_dtype is not None:
            flat = tf.cast(flat, wire_dtype)
    with tf.device(destination):
        if wire_dtype is not None:
            flat = tf.cast(flat, members[0].dtype)
        pieces = tf.split(flat, sizes)
        return [tf.reshape(p, m.shape) for p, m in zip(pieces, members, strict=True)]


@dataclasses.dataclass
class _Step:
    """One replica step being traced: its graph, the variables its reads
    may pack, the packs made so far and the variables it wrote."""

    graph: Any
    variables: dict[int, tf.Variable]
    # (reading device, ps device) -> id of a variable -> its piece.
    packs: dict[tuple[str, str], dict[int, tf.Tensor]] = dataclasses.field(
        default_factory=dict
    )
    written: set[int] = dataclasses.field(default_factory=set)


class PackedReads:
    """The reads of the steps being traced, packed per ps task.

    `PSExtended` opens a `step` around each Keras step it runs, naming the
    model's trainable variables; `PSVariable` asks `read` for its value on
    a replica's read from another task, and says what it writes (`wrote`).
    """

    def __init__(self):
        self._steps: list[_Step] = []

    @contextlib.contextmanager
    def step(self, variables: Sequence[tf.Variable]) -> Iterator[None]:
        """While a step is traced in the current graph: reads there of
        `variables` (the resource variables `PSVariable`s wrap) come packed."""
        graph = tf.compat.v1.get_default_graph()
        if (
            tf.executing_eagerly()
            or len(variables) < 2
            or control_flow_util.GraphOrParentsInXlaContext(graph)
        ):
            yield
            return
        step = _Step(graph, {id(v): v for v in variables})
        self._steps.append(step)
        try:
            yield
        finally:
            self._steps.remove(step)

    def wrote(self, variable: tf.Variable) -> None:
        """`variable` (the wrapped one) is written in the steps being traced:
        their later reads of it read it where it lives."""
        for step in self._steps:
            step.written.add(id(variable))

    def read(self, variable: tf.Variable, wire_dtype: tf.DType | None) -> Any:
        """`variable`'s value for the replica reading it here, from its
        task's pack in the current step; `None` to read it alone (not in a
        step's own graph, not among the step's variables, written, alone on
        its task). The gradient passes to `variable`."""
        step = self._current_step()
        key = id(variable)
        if step is None or key not in step.variables or key in step.written:
            return None
        reader = device_util.current()
        pieces = step.packs.get((reader, variable.device))
        if pieces is None:
            pieces = _read_pack(step, reader, variable.device, wire_dtype)
            step.packs[(reader, variable.device)] = pieces
        piece = pieces.get(key)
        if piece is None:
            return None
        with tf.device(reader):
            value = tf.identity(piece)
        # The tape sees a read of `variable` (its gradient is the value's),
        # whenever the pack was made: outside the tape, or inside another.
        tape_lib.variable_accessed(variable)
        record.record_operation(
            "ReadVariableOp", [value], [variable.handle], lambda upstream: [upstream]
        )
        return value

    def _current_step(self) -> _Step | None:
        graph = tf.compat.v1.get_default_graph()
        for step in reversed(self._steps):
            if step.graph is graph:
                return step
        return None


def _read_pack(
    step: _Step, reader: str, device: str, wire_dtype: tf.DType | None
) -> dict[int, tf.Tensor]:
    """The step's variables on `device` not yet written, read there as one
    tensor and split on `reader` (none if fewer than two)."""
    members = [
        v
        for key, v in step.variables.items()
        if key not in step.written
        and v.device == device
        and v.dtype == tf.float32
        and v.shape.is_fully_defined()
        and v.shape.num_elements() <= MAX_PACKED_ELEMENTS
        and narrow_reads.crosses_tasks(device, reader)
    ]
    if len(members) < 2:
        return {}
    # Made outside any tape: each read records its own link to its variable.
    with record.stop_recording():
        with tf.device(device):
            values = [v.value() for v in members]
        pieces = _packed(values, device, reader, wire_dtype)
    return {id(v): p for v, p in zip(members, pieces, strict=True)}
