"""Data attacks: the attacked replicas train honestly on corrupted batches."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.attacks.base import Attack


class LabelFlip(Attack):
    """The attacked replicas train on mirrored labels.

    `corrupt_batch` maps each label to its mirror class, `y -> num_classes -
    1 - y`:

    - integer labels (any int dtype, any shape): `num_classes - 1 - y`, in
      y's dtype. Labels outside `[0, num_classes)` land outside it too;
    - float labels whose last axis has size `num_classes` (one-hot or
      probabilities): reversed along the last axis, the same map;
    - anything else (float labels of another last-axis size, bool, nested
      labels): `ValueError`.

    A batch without labels (`x` alone, `(x,)` or `(x, None, ...)`) is
    returned unchanged; `x` and `sample_weight` are never touched.
    Gradients are not changed (`apply` is the identity): the attacked
    replicas' gradients are honest gradients of the flipped data.

    Args:
        replicas: The ids of the attacked replicas.
        num_classes: The number of classes, an int >= 2.

    Examples:

    >>> import tensorflow as tf
    >>> attack = LabelFlip(replicas=[0], num_classes=10)
    >>> x, y = attack.corrupt_batch((tf.zeros([3, 2]), tf.constant([0, 3, 9])))
    >>> y.numpy().tolist()
    [9, 6, 0]
    >>> x, y = attack.corrupt_batch((tf.zeros([1, 2]), tf.one_hot([1], 10)))
    >>> int(tf.argmax(y, axis=-1)[0])
    8

    References:
        Karimireddy, He, Jaggi, "Learning from History for Byzantine Robust
        Optimization", ICML 2021 (the label-flipping attack, `T(y) = 9 - y`
        for 10 classes).
    """

    def __init__(self, replicas: Sequence[int], num_classes: int):
        super().__init__(replicas)
        if (
            isinstance(num_classes, bool)
            or not isinstance(num_classes, numbers.Integral)
            or num_classes < 2
        ):
            raise ValueError(
                "LabelFlip: `num_classes` must be an int >= 2. "
                f"Received: num_classes={num_classes!r}"
            )
        self.num_classes = int(num_classes)

    def corrupt_batch(self, data: Any) -> Any:
        """Returns `data` with its labels flipped (see the class docstring).

        Args:
            data: `x`, `(x,)`, `(x, y)` or `(x, y, sample_weight)`, as a
                tuple or a list.

        Returns:
            The same structure with `y` replaced.

        Raises:
            ValueError: for labels that are neither integer nor float with a
                last axis of size `num_classes`.
        """
        if not isinstance(data, tuple | list) or len(data) < 2 or data[1] is None:
            return data
        flipped = self.flip_labels(data[1])
        return type(data)([data[0], flipped, *data[2:]])

    def flip_labels(self, y: Any) -> tf.Tensor:
        """Returns the mirrored labels `num_classes - 1 - y` (see the class)."""
        if isinstance(y, Mapping | tuple | list | tf.SparseTensor | tf.RaggedTensor):
            raise ValueError(
                f"{self!r} flips one dense label tensor; nested, sparse or "
                "ragged labels are not supported. Received: "
                f"labels of type {type(y).__name__}."
            )
        y = tf.convert_to_tensor(y)
        if y.dtype.is_integer:
            return tf.constant(self.num_classes - 1, dtype=y.dtype) - y
        if y.dtype.is_floating:
            if (
                y.shape.rank is None
                or y.shape.rank == 0
                or y.shape[-1] != self.num_classes
            ):
                raise ValueError(
                    f"{self!r} got float labels of shape {y.shape}. Float labels "
                    "must be one-hot or probabilities whose last axis has size "
                    f"num_classes={self.num_classes}. Pass class ids as integer "
                    "labels (e.g. `tf.cast(y, 'int32')`) or fix num_classes."
                )
            return tf.reverse(y, axis=[-1])
        raise ValueError(
            f"{self!r} flips integer class ids or float one-hot labels. "
            f"Received: labels of dtype {y.dtype.name} and shape {y.shape}."
        )

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_classes": self.num_classes}
