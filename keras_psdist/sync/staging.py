"""Where the chief keeps the gradients it pops: on the ps task, in slots.

The update service decides in Python what a popped gradient is (fresh, stale,
of a later session), so the dequeue and the update are two `tf.function`
calls. A gradient returned from the first and passed into the second
crossed to the chief and back, although its `EagerTensor` named the ps
device: on separate hosts, twice a model's gradient per member on the ps
host's link for nothing. Measured on the test bed (`benchmarks/scaling.py
--only mbit --mbit-kinds sync`): 9.4 MB per update of 2 workers instead of
4.8.

So the dequeue writes the gradient's components into a *slot* (variables on
the queue's ps device) and returns only the 4-number header; the update's
function reads its members' slots on the same device. Nothing but headers and
tokens crosses to the chief. A slot is taken per popped gradient and given
back once the gradient is applied or dropped; there are at most
`replicas_to_aggregate` pending members plus one gradient per worker kept for a
later session, so the slots' memory is bounded by that many gradients (what
the popped tensors held before).

When the popped gradients are an update's members as they come (the
common case), the service applies them in the same call straight from the
dequeued tensors, and no slot is written (`UpdateService._pop_and_update`).

Every read of a slot is inside `tf.device(<the ps device>)`: `read_value`'s
Identity is otherwise placed on the caller's device, the same round trip.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from keras_psdist.devices import device_variable
from keras_psdist.sync import protocol
from keras_psdist.sync.protocol import Layout


def component_specs(layout: Layout, shapes: Sequence[tf.TensorShape]) -> list:
    """The shape and dtype of each queue component after the header.

    Examples:

    >>> import tensorflow as tf
    >>> layout = Layout(("dense", "sparse", "none"), (tf.float32,) * 3)
    >>> [(s.shape.as_list(), s.dtype.name) for s in component_specs(
    ...     layout, [tf.TensorShape([2, 3]), tf.TensorShape([10, 4]), tf.TensorShape([5])])]
    [([2, 3], 'float32'), ([None, 4], 'float32'), ([None], 'int64')]
    """
    specs = []
    for v, (kind, dtype, shape) in enumerate(
        zip(layout.kinds, layout.dtypes, shapes, strict=True)
    ):
        if kind == "dense":
            specs.append(tf.TensorSpec(shape, dtype))
        elif kind == "sparse":
            specs.append(tf.TensorSpec([None, *shape[1:]], dtype))
            specs.append(tf.TensorSpec([None], tf.int64))
        elif kind == "compressed":
            specs += layout.sent_specs(v)
    return specs


class GradientStaging:
    """Slots on `device` for popped gradients, and the pop that fills them.

    Args:
        device: The gradient queue's device (a ps task's CPU).
        queue: The gradient queue's resource handle.
        layout: The gradients' layout.
        shapes: The variables' shapes.
    """

    def __init__(self, device: str, queue, layout: Layout, shapes):
        self._device = device
        self._queue = queue
        self._layout = layout
        self._shapes = tuple(shapes)
        self._specs = component_specs(layout, shapes)
        self._free: list[int] = []
        self._slots: list[list[tf.Variable]] = []
        self._pop = None

    def take(self) -> int:
        """A free slot's index (a new slot when every slot holds a gradient)."""
        if self._free:
            return self._free.pop()
        # (Made at a join, or whenever more gradients are pending than
        # before: its zeros must be written before a pop writes into it.)
        self._slots.append(
            [
                device_variable(
                    tf.zeros([d or 0 for d in spec.shape.as_list()], spec.dtype),
                    self._device,
                    f"keras_psdist_sync_staged_{len(self._slots)}_{c}",
                    shape=spec.shape,
                )
                for c, spec in enumerate(self._specs)
            ]
        )
        return len(self._slots) - 1

    def give_back(self, slot: int) -> None:
        """`slot`'s gradient was applied or dropped: the slot is free again."""
        self._free.append(slot)

    def pop_into(self, slot: int) -> tf.Tensor:
        """Dequeues one element (blocking), writes its gradient into `slot`
        and returns its header `[kind, worker, step, session]` (on the chief).
        """
        if self._pop is None:
            self._pop = self._make_pop()
        return self._pop(self._slots[slot])

    def variables(self, slot: int) -> list[tf.Variable]:
        """`slot`'s variables: pass them into the update's `tf.function`."""
        return self._slots[slot]

    def read(self, slot_variables) -> list:
        """Inside the update's function: the gradient list a slot holds (on
        its device), as `Layout.unflatten` gives it."""
        # On the slot's device: `read_value`'s Identity would otherwise be
        # placed on the caller's (the chief's) device, a round trip.
        with tf.device(self._device):
            return self.unflatten([v.read_value() for v in slot_variables])

    def pop_ops(self, slot_variables) -> tf.Tensor:
        """In a trace: dequeues one element (blocking), writes its gradient
        into `slot_variables` and returns its header `[kind, worker, step,
        session]`."""
        header, components = self.pop_values()
        self.write_ops(slot_variables, header, components)
        return header

    def pop_values(self) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """In a trace: dequeues one element (blocking) and returns its header
        and its gradient's components, on the ps device, unwritten: the
        update that applies them at once needs no slot (see
        `UpdateService`)."""
        with tf.device(self._device):
            components = tf.raw_ops.QueueDequeueV2(
                handle=self._queue, component_types=self._layout.component_types
            )
            return tf.reshape(tf.stack(components[:4]), [4]), list(components[4:])

    def nothing_popped(self, header: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """`pop_values`'s shape with no element: `header` and empty
        components (the other branch of a `tf.cond` around `pop_values`)."""
        with tf.device(self._device):
            empty = [
                tf.zeros([0] * spec.shape.rank, spec.dtype) for spec in self._specs
            ]
            return header, empty

    def write_ops(self, slot_variables, header, components) -> None:
        """In a trace: writes a popped gradient's `components` into
        `slot_variables` if its `header` says it is a gradient (a marker,
        LEAVE, LOST or SHUTDOWN, carries empty components)."""
        with tf.device(self._device):

            def write():
                for variable, value in zip(slot_variables, components, strict=True):
                    variable.assign(value, read_value=False)
                return tf.constant(True)

            tf.cond(
                tf.equal(header[0], protocol.GRADIENT),
                write,
                lambda: tf.constant(False),
            )

    def unflatten(self, components) -> list:
        """Inside the update's function: the gradient list that `components`
        (a slot's values, or `pop_values`') make, as `Layout.unflatten`
        gives it. Each component gets its static shape (a queue's has none),
        checked when it runs."""
        shaped = [
            tf.ensure_shape(c, spec.shape)
            for c, spec in zip(components, self._specs, strict=True)
        ]
        return self._layout.unflatten(shaped, self._shapes)

    def _make_pop(self):
        return tf.function(self.pop_ops)
