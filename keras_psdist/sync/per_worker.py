"""A worker's gradients, once per worker process: what `worker_apply` hooks share.

Keras's optimizer calls `apply` in each replica; a sync-replica or
bounded-staleness worker acts once per step for the whole process, on the
sum of its replicas' gradients (see `keras_psdist.modes.Training`).
"""

from __future__ import annotations

import tensorflow as tf


def once_per_worker(fn, grads, variables):
    """Calls `fn(grads, variables)` once for this worker process.

    From a replica (inside `strategy.run`), `fn` runs in cross-replica
    context with `grads` the sum of this worker's replicas' (1/n-scaled)
    gradients, combined by the strategy's own reduction; outside, with
    `grads` as they are. `None` stays `None`.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        return fn(list(grads), variables)
    return ctx.merge_call(
        lambda strategy, *per_replica: fn(
            _sum_over_replicas(strategy, per_replica, variables), variables
        ),
        args=tuple(grads),
    )


def _sum_over_replicas(strategy, per_replica, variables):
    present = [
        (g, getattr(v, "value", v))
        for g, v in zip(per_replica, variables, strict=True)
        if g is not None
    ]
    reduced = iter(
        strategy.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, present)
        if present
        else []
    )
    return [None if g is None else next(reduced) for g in per_replica]
