"""Worker momentum: the rule aggregates each replica's momentum, not its gradient.

With `worker_momentum=beta`, every replica r keeps

    m_r <- beta * m_r + (1 - beta) * g_r        (m_r = 0 before the first step)

of its own true-scale gradients `g_r`, and the rule aggregates the `m_r`.
Averaging over time shrinks the honest replicas' spread by about
`sqrt((1 - beta) / (1 + beta))` while a Byzantine replica's shift is not
shrunk, so a robust rule can tell them apart: this is what lets the median,
trimmed mean and centered clipping hold against "A Little Is Enough" and
inner-product attacks (Karimireddy, He, Jaggi, "Learning from History for
Byzantine Robust Optimization", ICML 2021).

What the model's optimizer sees: the aggregate of the momenta, as its
gradient, on the gradient's scale (the dampened form above, as in ByzFL's
clients). A plain `SGD(learning_rate=lr)` then takes the steps of heavy-ball
momentum with learning rate `lr * (1 - beta)` per unit gradient; to keep the
step size of `SGD(learning_rate=lr, momentum=beta)`, use
`SGD(learning_rate=lr / (1 - beta))`. An optimizer with its own momentum
(Adam, `SGD(momentum=...)`) compounds the two; it still trains, but the
papers use worker momentum with momentum-free SGD.

Where the buffers live: one buffer per variable and replica, kept by the
strategy with the rule's state. When the replicas do not share memory with
the reduction device (GPUs, other tasks), the strategy passes `devices=` its
compute devices: replica r's buffers live on replica r's device and are
updated there, in one fused pass per replica, as soon as that replica's
gradients exist, so each replica updates its own in parallel, and what
travels to the reduction device is the momentum instead of the gradient (no
extra traffic). Logical CPUs of one process share the memory and the cores,
so there the buffers are updated where the rule runs, every replica's
together, in one fused pass per large variable and one for the small ones
(measured with `benchmarks/step_time_rules.py`: `mean` + worker momentum
1.33x the mean's step time with a pass per replica, 1.23x with one pass,
1.20x with the buffers written in place by that pass: `step_on_variables`;
a pass per large variable, so that each starts when its gradients exist,
took `median` + worker momentum from 1.27x to 1.23x).
For an honest replica this is exactly the
momentum it would keep itself. A Byzantine replica could steer a momentum
kept for it to any value by inverting the average, so simulated attacks
(`keras_psdist.attacks`) replace the momenta, not the gradients: the
strongest attacker. Under `SyncReplicaStrategy` each worker process keeps its
own buffer and sends it (`keras_psdist.sync`), since the chief aggregates a
different subset of workers each update.

Replicas without data in a step keep their momentum unchanged. Sparse
gradients (embedding lookups) are aggregated without momentum: their
momentum would be a dense `[n, rows, dim]` table (logged once).

Examples:

>>> import tensorflow as tf
>>> from keras_psdist import aggregators
>>> rule = WorkerMomentum(aggregators.Mean(), beta=0.5).bind(2)
>>> state = rule.initial_state([tf.TensorSpec([1])])
>>> column = [tf.constant([2.0]), tf.constant([4.0])]
>>> result = rule.step(tf.distribute.ReduceOp.MEAN, [column], state=state)
>>> result.values[0].numpy().tolist()  # the mean of 0.5 * 2 and 0.5 * 4
[1.5]
>>> result = rule.step(tf.distribute.ReduceOp.MEAN, [column], state=result.state)
>>> result.values[0].numpy().tolist()  # 0.5 * 1.5 + 0.5 * 3
[2.25]
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf
from absl import logging

from keras_psdist.aggregators import coordinatewise
from keras_psdist.aggregators.base import Aggregation, Aggregator, column_spec

ReduceOp = tf.distribute.ReduceOp


class MomentumState(NamedTuple):
    """The buffers (per variable, one per replica) and the rule's state."""

    momenta: tuple[tf.Tensor, ...]
    inner: Any


def check_beta(beta: Any) -> float:
    """`beta` as a float in `[0, 1)`, else a `ValueError` naming the fix."""
    if (
        isinstance(beta, bool)
        or not isinstance(beta, numbers.Real)
        or not math.isfinite(beta)
        or not 0 <= beta < 1
    ):
        raise ValueError(
            "`worker_momentum` must be a number in [0, 1): the weight of the "
            "past in each replica's momentum (0.9 is usual; 0 turns it off). "
            f"Received: worker_momentum={beta!r}"
        )
    return float(beta)


class WorkerMomentum(Aggregator):
    """`aggregator`, run on each replica's momentum of its gradients.

    Args:
        aggregator: The rule (bound or not); with an attack, the rule behind
            it (`attacks.UnderAttack`), so the attack replaces momenta.
        beta: The momentum, in `[0, 1)`.
        devices: Replica r's buffers live and are updated on `devices[r]`
            (see `state_devices`). Defaults to none: where the rule runs.

    Attributes:
        aggregator: The inner rule.
        beta: The momentum.
        report_names: The inner rule's.
    """

    def __init__(
        self,
        aggregator: Aggregator,
        beta: float,
        devices: Sequence[str] | None = None,
    ):
        super().__init__(aggregator.num_byzantine)
        self.aggregator = aggregator
        self.beta = check_beta(beta)
        self.devices = None if devices is None else tuple(devices)
        self.num_replicas = aggregator.num_replicas
        # Its state spans every variable: never split by variable.
        self.per_variable = False
        self.report_names = tuple(aggregator.report_names)

    def bind(
        self, num_replicas: int, num_byzantine: int | None = None
    ) -> WorkerMomentum:
        bound = super().bind(num_replicas, num_byzantine)
        bound.aggregator = self.aggregator.bind(num_replicas, bound.num_byzantine)
        return bound

    def initial_state(self, specs: Sequence[tf.TensorSpec]) -> MomentumState:
        """Zero momenta, one per variable and replica (none for sparse columns)."""
        if self.num_replicas is None:
            raise ValueError(
                "WorkerMomentum needs the replica count for its buffers: call "
                "`bind(num_replicas)` first (the strategy does)."
            )
        return MomentumState(
            initial_momenta(specs, self.num_replicas),
            self.aggregator.initial_state(specs),
        )

    def state_devices(self, state: Any) -> MomentumState:
        """Replica r's buffers on `devices[r]`; the inner rule's state where
        the rule runs."""
        state = MomentumState(*state)
        momenta = tuple(
            tuple(
                None if self.devices is None else self.devices[r]
                for r in range(len(buffers))
            )
            for buffers in state.momenta
        )
        # The rule's state lives where the rule runs.
        return MomentumState(
            momenta, tf.nest.map_structure(lambda _: None, state.inner)
        )

    def step(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_replica: Sequence[Sequence[tf.Tensor | tf.IndexedSlices]],
        *,
        shares: Sequence[tf.Tensor] | None = None,
        state: Any = (),
    ) -> Aggregation:
        if not per_replica:
            return Aggregation([], {}, state)
        if state is None or (isinstance(state, tuple) and not state):
            state = self.initial_state([column_spec(column) for column in per_replica])
        state = MomentumState(*state)
        out, momenta = momentum_step(
            reduce_op, per_replica, shares, state.momenta, self.beta, self.devices
        )
        result = self.aggregator.step(
            ReduceOp.MEAN, out, shares=shares, state=state.inner
        )
        # SUM of 1/n-scaled values and MEAN of true-scale ones mean the same.
        return Aggregation(
            result.values, result.report, MomentumState(momenta, result.state)
        )

    def step_on_variables(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_replica: Sequence[Sequence[tf.Tensor | tf.IndexedSlices]],
        *,
        shares: Sequence[tf.Tensor] | None,
        momenta: Sequence[Sequence[tf.Variable]],
        inner_state: Any,
    ) -> Aggregation:
        """`step`, with the momenta kept in variables and updated in place
        (`momentum_step_in_place`, what the strategy's momentum stage,
        `keras_psdist.gradients.momentum_stage.Momentum.apply_in_place`, runs).
        Same values as `step`.

        Args:
            reduce_op: As in `step`.
            per_replica: As in `step`.
            shares: As in `step`.
            momenta: The buffers, `momenta[v][r]` (none for a sparse
                variable), as `initial_state` lays them out.
            inner_state: The inner rule's state (values).

        Returns:
            The inner rule's `Aggregation` of the momenta: its state is the
            inner rule's next state only (the momenta are written).
        """
        out = momentum_step_in_place(
            reduce_op, per_replica, shares, momenta, self.beta, self.devices
        )
        return self.aggregator.step(
            ReduceOp.MEAN, out, shares=shares, state=inner_state
        )

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        return self.step(ReduceOp.MEAN, per_replica, state=state)

    def get_config(self) -> dict[str, Any]:
        return {
            "aggregator": self.aggregator,
            "beta": self.beta,
            "devices": self.devices,
        }

    def __repr__(self) -> str:
        return f"WorkerMomentum({self.aggregator!r}, beta={self.beta})"


def initial_momenta(
    specs: Sequence[tf.TensorSpec], num_replicas: int
) -> tuple[tuple[tf.Tensor, ...], ...]:
    """Zero momenta, `[v][r]`, one per variable and replica (none for a
    variable whose shape is not known: a sparse one's dense block)."""
    return tuple(
        tuple(tf.zeros(spec.shape, spec.dtype) for _ in range(num_replicas))
        if spec.shape.is_fully_defined()
        else ()
        for spec in specs
    )


def momentum_step(reduce_op, per_replica, shares, momenta, beta, devices=None):
    """One step of every replica's momentum.

    Args:
        reduce_op: `SUM` (values scaled by `1/n`, as Keras sends them) or
            `MEAN` (true scale).
        per_replica: `per_replica[v][r]`, dense or sparse.
        shares: Each replica's share of the batch, or `None`; a replica
            without data keeps its momentum.
        momenta: The buffers' values, `momenta[v][r]` (`initial_momenta`).
        beta: The momentum.
        devices: Replica r's buffers are updated on `devices[r]`, or `None`
            (where the caller runs, in fused passes).

    Returns:
        `(out, new_momenta)`: `out[v][r]` is the new momentum of a dense
        variable, the true-scale value of a sparse one (aggregated without
        momentum); `new_momenta` laid out as `momenta`.
    """
    scale, dense = _scale_and_dense(reduce_op, per_replica)
    new = _update_momenta(momenta, per_replica, dense, shares, scale, beta, devices)
    new_momenta, out = [], []
    for v, column in enumerate(per_replica):
        if v not in new:
            new_momenta.append(momenta[v])
            out.append(_sparse_as_is(column, scale))
            continue
        new_momenta.append(tuple(new[v]))
        out.append(new[v])
    return out, tuple(new_momenta)


def momentum_step_in_place(reduce_op, per_replica, shares, momenta, beta, devices=None):
    """`momentum_step`, with the momenta in variables written in place.

    Each group's buffers are read, updated and written back in one XLA
    kernel, with no new buffer per step (at 8 replicas of 300k values on
    logical CPUs: 1.7 ms instead of 2.4 ms for the pass and the writes,
    measured on their own).

    Args:
        momenta: The buffers, variables, `momenta[v][r]`.
        (the rest as in `momentum_step`)

    Returns:
        `out`, as `momentum_step`'s, read after the writes.
    """
    scale, dense = _scale_and_dense(reduce_op, per_replica)
    for _, buffers, grads, keep, device in _passes(
        momenta, per_replica, dense, shares, devices
    ):
        static = all(g.shape.is_fully_defined() for g in grads)
        update = _update_in_place_xla if static else _update_in_place
        # Where the buffers are: an XLA kernel runs where its variables
        # live.
        with tf.device(device or buffers[0].device):
            update(buffers, grads, keep, beta, scale)
    # Read after the writes (automatic control dependencies order the ops
    # on each variable).
    return [
        [buffer.read_value() for buffer in momenta[v]]
        if v in dense
        else _sparse_as_is(column, scale)
        for v, column in enumerate(per_replica)
    ]


def _passes(momenta, per_replica, dense, shares, devices):
    """The fused passes over the dense columns' buffers. Where the rule
    runs: one per large variable, over all its replicas, and one for the
    small ones together (`coordinatewise.kernel_groups`), so that a
    variable's update, and the rule and the optimizer after it, start as
    soon as its gradients exist, while the backward pass still runs. With
    `devices`: one per replica, on its own device. Each is `(pairs,
    momenta, grads, keep, device)` for its `(variable, replica)` pairs
    (`device` None: the rule's)."""
    n = len(per_replica[0])
    columns = [per_replica[v] for v in dense]
    if devices is not None:
        groups = [([r], dense, devices[r]) for r in range(n)]
    elif all(column[0].shape.is_fully_defined() for column in columns):
        groups = [
            (range(n), [dense[i] for i in group], None)
            for group in coordinatewise.kernel_groups(columns)
        ]
    else:  # Unknown shapes: one pass, not XLA.
        groups = [(range(n), dense, None)]
    for replicas, variables, device in groups:
        pairs = [(v, r) for r in replicas for v in variables]
        if pairs:
            yield (
                pairs,
                [momenta[v][r] for v, r in pairs],
                [per_replica[v][r] for v, r in pairs],
                [
                    tf.constant(True) if shares is None else shares[r] > 0
                    for _, r in pairs
                ],
                device,
            )


def _update_momenta(momenta, per_replica, dense, shares, scale, beta, devices):
    """`{variable: [new momentum per replica]}` for the dense columns, in
    the fused passes of `_passes`."""
    n = len(per_replica[0])
    new = {v: [None] * n for v in dense}
    for pairs, olds, grads, keep, device in _passes(
        momenta, per_replica, dense, shares, devices
    ):
        static = all(g.shape.is_fully_defined() for g in grads)
        update = _moving_averages_xla if static else moving_averages
        with tf.device(device):
            results = update(olds, grads, keep, beta, scale)
        for (v, r), m in zip(pairs, results, strict=True):
            new[v][r] = m
    return new


def moving_averages(olds, grads, keep, beta, scale=1.0):
    """`beta * old + (1 - beta) * scale * g` for each pair, `old` where not `keep`
    (a replica without data keeps its momentum; its `g` may be NaN)."""
    out = []
    for old, g, k in zip(olds, grads, keep, strict=True):
        m = beta * old + ((1.0 - beta) * scale) * tf.cast(g, old.dtype)
        out.append(tf.where(k, m, old))
    return out


# One fused pass over every buffer (XLA), where the shapes are static.
_moving_averages_xla = tf.function(
    moving_averages, autograph=False, jit_compile=True, reduce_retracing=True
)


def _update_in_place(buffers, grads, keep, beta, scale=1.0):
    """`moving_averages` written into the variables `buffers`."""
    olds = [buffer.read_value() for buffer in buffers]
    for buffer, m in zip(
        buffers, moving_averages(olds, grads, keep, beta, scale), strict=True
    ):
        buffer.assign(m)


# In one XLA kernel, the variables are updated where they are.
_update_in_place_xla = tf.function(
    _update_in_place, autograph=False, jit_compile=True, reduce_retracing=True
)


def _scale_and_dense(reduce_op, per_replica):
    """The factor to true scale (values scaled by 1/n under SUM come back to
    it in the momentum pass), and the indices of the dense columns."""
    scale = float(len(per_replica[0])) if reduce_op == ReduceOp.SUM else 1.0
    dense = [
        v
        for v, column in enumerate(per_replica)
        if not isinstance(column[0], tf.IndexedSlices)
    ]
    return scale, dense


def _sparse_as_is(column, scale):
    """A sparse column, aggregated without momentum, on the true scale."""
    _warn_sparse_once(column[0])
    return column if scale == 1.0 else _times(column, len(column))


def _times(column, n):
    return [
        tf.IndexedSlices(v.values * n, v.indices, v.dense_shape)
        if isinstance(v, tf.IndexedSlices)
        else v * n
        for v in column
    ]


_warned_sparse = False


def _warn_sparse_once(value: tf.IndexedSlices) -> None:
    global _warned_sparse
    if _warned_sparse:
        return
    _warned_sparse = True
    logging.warning(
        "worker_momentum: sparse gradients (rows of shape %s, from an embedding "
        "lookup) are aggregated without momentum; a momentum of them would be a "
        "dense [replicas, rows, ...] table per replica set.",
        value.values.shape[1:],
    )
