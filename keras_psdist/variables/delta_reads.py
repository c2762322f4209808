"""Reads of the change since a replica's last read: `PSStrategy(read_compression=...)`.

With gradient compression on, what is left on a ps link is the variables
each replica reads back every step (`read_dtype` halves it). Most of a
variable does not change much between two reads; with
`read_compression="top_k(ratio=0.05)"`, a replica on another task keeps its
own copy of each large variable and reads only the `ratio` largest
coordinates of the change since its copy was last brought up to date:

```
the variable's ps task:   d = w - seen_r;  I = top_k(|d|);  seen_r[I] <- w[I]
replica r, its device:    local_r[I] <- w[I];  compute with local_r
```

`seen_r` (on the ps) and `local_r` (on the replica's device) are the same
copy, kept equal by applying the same indices and values on both sides;
what is not read yet stays in `w - seen_r` and comes through at a later read
(error feedback on the downlink: EF21-P, Gruntkowska, Tyurin and Richtarik,
"EF21-P and Friends", ICML 2023). A read carries `k` indices (int32) and
values (in `read_dtype`, else the variable's dtype): at `ratio=0.05` and
bfloat16, 0.3 bytes per coordinate where a float32 read is 4.

- Every `FULL_READ_EVERY`-th read of a replica, and its first, read the whole
  variable (in `read_dtype`), so a replica's copy never drifts far; after a
  write outside the steps in this process (`set_weights`, `assign`,
  `load_weights`, hence `BackupAndRestore`) every copy is read whole at the
  next read. A write the strategy does not see (a `tf.train.Checkpoint`
  restore, which writes the wrapped variable; another process's writes)
  comes through by the change or, at the latest, at the next whole read.
- Only what `read_dtype` narrows is read this way (a replica's step, a
  trainable float32 variable on another task), and only variables of at
  least `MIN_SIZE` coordinates; the rest are read as before. The gradient
  passes to the variable unchanged, as with `read_dtype`.
- Costs: one more copy of each such variable per reading replica on its ps
  task and one on the replica's device; a top-k over the change on the ps
  task every read.

Examples:

>>> check_read_compression("top_k(ratio=0.05)")
TopK(ratio=0.05)
>>> check_read_compression("sign")
Traceback (most recent call last):
...
ValueError: read_compression must be None (reads travel whole) or top_k (a replica reads the largest changes since its last read, e.g. 'top_k(ratio=0.05)'). Received: read_compression='sign' (Sign()).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from keras_psdist import compression as compression_lib
from keras_psdist.compression.base import kept_count
from keras_psdist.compression.top_k import TopK
from keras_psdist.variables import narrow_reads

# A replica reads the whole variable every this many reads (and first).
FULL_READ_EVERY = 100
# Variables smaller than this are read whole every time.
MIN_SIZE = 1024


def check_read_compression(value: Any) -> TopK | None:
    """`read_compression=` as a `TopK` (`None` for none).

    Takes what `compression=` takes (an id with arguments, a config dict, an
    instance), of which only top-k is built for reads.

    Raises:
        ValueError: for any other compressor, naming what works.
    """
    if value is None or value == "none":
        return None
    compressor = compression_lib.get(value)
    if not isinstance(compressor, TopK):
        raise ValueError(
            "read_compression must be None (reads travel whole) or top_k (a "
            "replica reads the largest changes since its last read, e.g. "
            f"'top_k(ratio=0.05)'). Received: read_compression={value!r} "
            f"({compressor!r})."
        )
    return compressor


@dataclasses.dataclass
class _Copy:
    """One replica's copy of one variable: `seen` on the variable's device,
    `local` on the replica's, equal; `reads` counts the replica's reads."""

    seen: tf.Variable
    local: tf.Variable
    reads: tf.Variable


class DeltaReads:
    """The replicas' copies of the variables they read by their change.

    Args:
        compressor: The top-k that picks each read's coordinates.
        compute_devices: The replicas' devices (canonical names).
    """

    def __init__(self, compressor: TopK, compute_devices: Sequence[str]):
        self.compressor = compressor
        self._compute_devices = tuple(compute_devices)
        # id of the wrapped variable -> reading device -> its copy.
        self._copies: dict[int, dict[str, _Copy]] = {}

    def track(
        self,
        variable: tf.Variable,
        next_creator: Callable[..., tf.Variable],
        trainable: bool,
    ) -> None:
        """Makes each replica on another task a copy of `variable` (the
        resource variable a `PSVariable` wraps), if it is read by its change."""
        size = variable.shape.num_elements()
        if (
            not trainable
            or variable.dtype != tf.float32
            or size is None
            or size < MIN_SIZE
        ):
            return
        readers = [
            d
            for d in self._compute_devices
            if narrow_reads.crosses_tasks(variable.device, d)
        ]
        if not readers:
            return
        name = variable.name.split(":")[0]

        def make(device, suffix, initial, dtype=tf.float32):
            with tf.device(None), tf.device(device):
                return next_creator(
                    initial_value=initial,
                    dtype=dtype,
                    trainable=False,
                    name=f"{name}/{suffix}",
                )

        copies = {}
        with tf.init_scope():
            zeros = tf.zeros(variable.shape, tf.float32)
            for i, reader in enumerate(readers):
                copies[reader] = _Copy(
                    seen=make(variable.device, f"read_copy_{i}/seen", zeros),
                    local=make(reader, f"read_copy_{i}/local", zeros),
                    reads=make(
                        reader,
                        f"read_copy_{i}/reads",
                        tf.constant(0, tf.int64),
                        tf.int64,
                    ),
                )
        self._copies[id(variable)] = copies

    def copies(self, variable: tf.Variable | None = None) -> list[_Copy]:
        """The replicas' copies (of `variable`, or of every variable)."""
        if variable is not None:
            return list(self._copies.get(id(variable), {}).values())
        return [c for copies in self._copies.values() for c in copies.values()]

    def copy_for(self, variable: tf.Variable, reader: str | None) -> _Copy | None:
        """The copy `reader` keeps of `variable`, if it reads it by its change."""
        copies = self._copies.get(id(variable))
        if not copies or reader is None:
            return None
        return copies.get(reader)

    def read_whole_next(self, variable: tf.Variable) -> None:
        """Makes every replica read `variable` whole at its next read (after
        a write outside the replicas' steps: a restore, `set_weights`)."""
        for copy in self._copies.get(id(variable), {}).values():
            copy.reads.assign(0)

    def read(
        self, variable: tf.Variable, copy: _Copy, dtype: tf.DType | None
    ) -> tf.Tensor:
        """`variable`'s value for the replica keeping `copy`: its copy
        brought up to date by the largest changes (or whole, every
        `FULL_READ_EVERY`-th read); values travel in `dtype` if given. The
        gradient passes through to `variable` unchanged."""
        wire = dtype or variable.dtype
        with tf.device(copy.reads.device):
            whole = tf.equal(copy.reads.assign_add(1) % FULL_READ_EVERY, 1)
        value = variable.value()

        def whole_read():
            with tf.device(variable.device):
                sent = tf.cast(value, wire)
                copy.seen.assign(tf.cast(sent, tf.float32))
            with tf.device(copy.local.device):
                copy.local.assign(tf.cast(sent, tf.float32))
            return tf.constant(True)

        def change_read():
            with tf.device(variable.device):
                flat = tf.reshape(value, [-1])
                change = flat - tf.reshape(copy.seen.read_value(), [-1])
                _, indices = tf.math.top_k(
                    tf.abs(change),
                    kept_count(self.compressor.ratio, flat),
                    sorted=False,
                )
                sent = tf.cast(tf.gather(flat, indices), wire)
                _scatter(copy.seen, indices, tf.cast(sent, tf.float32))
            with tf.device(copy.local.device):
                _scatter(copy.local, indices, tf.cast(sent, tf.float32))
            return tf.constant(True)

        done = tf.cond(whole, whole_read, change_read)
        with tf.device(copy.local.device), tf.control_dependencies([done]):
            current = tf.identity(copy.local.read_value())

        @tf.custom_gradient
        def read_by_change(x):
            del x  # the variable's value stays on its device

            def grad(upstream):
                return upstream

            return tf.identity(current), grad

        return read_by_change(value)


def _scatter(copy: tf.Variable, flat_indices: tf.Tensor, values: tf.Tensor) -> None:
    """Sets `copy` (of any shape) to `values` at its flat `flat_indices`."""
    if copy.shape.rank == 1:
        positions = flat_indices[:, None]
    else:
        dims = tf.constant(copy.shape.as_list(), flat_indices.dtype)
        positions = tf.transpose(tf.unravel_index(flat_indices, dims))
    copy.scatter_nd_update(positions, values)
