"""How a partitioned variable is updated: shard by shard, where each lives.

`update_shards` is the strategy's `update` of a `PartitionedVariable`: the
optimizer's update runs once per shard, on the shard's device, inside
`shard_scope(layout, i)`, where the variable and its slots (which share its
`ShardLayout`) act as their shard `i`, and the gradient is split so each
shard gets only its rows. `current_shard()` is what the variables read to
know which shard they are acting as.
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf

from keras_psdist._tf import distribute_lib
from keras_psdist.variables import row_separable
from keras_psdist.variables.shard_layout import ShardLayout

_scope = threading.local()


@contextlib.contextmanager
def shard_scope(layout: ShardLayout, index: int):
    """Within it, variables partitioned by `layout` act as their shard `index`.

    Used by the strategy's update: the optimizer's arithmetic on a variable
    and its slots then touches one shard of each, on that shard's device.
    """
    stack = getattr(_scope, "stack", None)
    if stack is None:
        stack = _scope.stack = []
    stack.append((layout, index))
    try:
        yield
    finally:
        stack.pop()


def update_shards(var, fn, args, kwargs) -> list:
    """Runs an update `fn(var, *args, **kwargs)` of a `PartitionedVariable`
    shard by shard, where each shard lives (its `StrategyExtended.update`).

    Inside `shard_scope(layout, i)` the variable and its slots act as their
    shard `i`, and arguments of the variable's full shape (the gradient) are
    split so that each shard gets only its rows: a sparse gradient's rows go
    only to the shards that own them. An optimizer whose update is not
    row-separable (see `keras_psdist.partitioners`) updates the whole variable
    instead, on its first shard's device: its reads gather the shards, its
    writes split.

    Returns:
        `fn`'s results, one per shard (one in all for a whole update).
    """
    optimizer = kwargs.get("optimizer")  # See `row_separable.optimizer_update_step`.
    if optimizer is not None and not row_separable.is_row_separable(optimizer):
        row_separable.warn_whole_update(optimizer, var.name)
        device = var.shards[0].device
        with tf.device(device), distribute_lib.UpdateContext(device):
            return [fn(var, *args, **kwargs)]
    flat = tf.nest.flatten((args, kwargs))
    pieces = [_split_for(var, x) for x in flat]
    results = []
    for i, shard in enumerate(var.shards):
        shard_args, shard_kwargs = tf.nest.pack_sequence_as(
            (args, kwargs),
            [x if p is None else p[i] for x, p in zip(flat, pieces, strict=True)],
        )
        with (
            tf.device(shard.device),
            distribute_lib.UpdateContext(shard.device),
            shard_scope(var.layout, i),
        ):
            results.append(fn(var, *shard_args, **shard_kwargs))
    return results


def _split_for(var, x):
    """Per-shard pieces of `x` if it is a value of `var`'s full shape, else None.

    The split runs where `x` is (the reduction device, for a gradient), so
    each piece travels from there straight to its shard.
    """
    if isinstance(x, tf.IndexedSlices):
        with tf.device(x.values.device):
            return var.layout.split(x)
    if (
        isinstance(x, tf.Tensor)
        and x.shape.rank == var.shape.rank
        and x.shape.is_compatible_with(var.shape)
    ):
        # Static shapes can be partly unknown (a densified sparse gradient).
        with tf.device(x.device):
            return var.layout.split(x)
    return None


def current_shard():
    """The `(layout, index)` of the innermost `shard_scope`, or None."""
    stack = getattr(_scope, "stack", None)
    return stack[-1] if stack else None
