"""The stage interface of the gradient path, and `chain`, which composes stages.

As Optax's `GradientTransformation(init, update)`: a stage owns a small
state, made by `init(specs)`, and one `apply(replicas, state)` that returns
what it made of the replicas' values and its next state. `chain(a, b, c)` is
itself a stage: `init` makes the tuple of the stages' states, `apply` runs
them in order. Every stage but the last hands on `Replicas`; the last, a
rule, returns the `Aggregation`.

What flows between stages, `Replicas`, carries the values as Keras sends
them (`1/n`-scaled for a SUM, sparse gradients as `IndexedSlices`) until a
stage needs them at their true scale and dense: `Replicas.dense()` scales
them, gives sparse columns dense blocks over the touched rows and zeroes the
replicas that got no data, and remembers how to give the result its rows
back. A rule at the end of a path whose values nobody densified runs its own
`Aggregator.step` on them (the mean's fast path over sparse rows, an
order-statistics rule's fused scaling).

Examples:

A toy stage that scales every replica's values, in front of the mean:

>>> import tensorflow as tf
>>> from keras_psdist import aggregators
>>> from keras_psdist.gradients import Rule
>>> class Scale(Stage):
...     def __init__(self, factor):
...         self.factor = factor
...     def apply(self, replicas, state, *, downstream=None):
...         dense = replicas.dense()
...         values = [[v * self.factor for v in column] for column in dense.values]
...         return dense.with_values(values), state
>>> path = chain(Scale(2.0), Rule(aggregators.Mean()))
>>> column = [tf.constant([1.0]), tf.constant([3.0])]
>>> replicas = Replicas([column], tf.distribute.ReduceOp.MEAN)
>>> result, state = path.apply(replicas, path.init([tf.TensorSpec([1])]))
>>> result.values[0].numpy().tolist()
[4.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from keras_psdist.aggregators import sparse as sparse_lib
from keras_psdist.aggregators.base import (
    Aggregation,
    mask_replicas_without_data,
    times,
)

ReduceOp = tf.distribute.ReduceOp

# `downstream(values) -> aggregate values`: the stages after one, run on
# candidate values with their state of this step (an adaptive attack tries
# its candidates against it).
Downstream = Callable[[list[list[tf.Tensor]]], list[tf.Tensor]]


class Replicas(NamedTuple):
    """Every replica's values for one step, as they flow down the path.

    Attributes:
        values: `values[v][r]`, replica r's value for variable v.
        reduce_op: `ReduceOp.SUM`: the values are scaled by `1/n`, as Keras
            sends gradients; `ReduceOp.MEAN`: at true scale.
        shares: Each replica's fraction of the global batch, or `None` for
            equal shares; a replica with share 0 got no data.
        blocks: `None` while the values are as sent; once `dense()`, how to
            give each variable's result its rows back (`sparse.DenseRows`,
            empty when there is nothing to give back).
        scale: A factor the rule's result still needs (`dense` leaves the
            scaling to the end when every stage after it commutes with
            it), or `None`.
        replica_index: int32 `[n]`: which value stands for replica r once a
            stage has combined replicas (bucketing), for the report; `None`:
            value r.
    """

    values: list[list[Any]]
    reduce_op: Any = ReduceOp.MEAN
    shares: Sequence[tf.Tensor] | None = None
    blocks: tuple | None = None
    scale: float | None = None
    replica_index: tf.Tensor | None = None

    @property
    def num_replicas(self) -> int:
        """How many values each variable has."""
        return len(self.values[0]) if self.values else 0

    @property
    def is_dense(self) -> bool:
        """Whether `dense()` has run."""
        return self.blocks is not None

    def dense(self, *, scale_later: bool = False) -> Replicas:
        """The values at true scale, dense, replicas without data zeroed.

        Args:
            scale_later: Leave a SUM's factor `n` to the rule's result
                (`scale`) instead of scaling each replica's values: for a
                path that commutes with a positive scale from here on.

        Returns:
            `Replicas` with `reduce_op` MEAN (a no-op once dense).
        """
        if self.is_dense:
            return self
        n = self.num_replicas
        values = self.values
        scale = None
        if self.reduce_op == ReduceOp.SUM:
            if scale_later:
                scale = float(n)
            else:
                values = [[times(v, n) for v in column] for column in values]
        blocks = tuple(sparse_lib.to_dense_rows(column) for column in values)
        dense = [block.values for block in blocks]
        if self.shares is not None:
            has_data = tf.stack([tf.convert_to_tensor(s) > 0 for s in self.shares])
            dense = mask_replicas_without_data(dense, has_data)
        return self._replace(
            values=dense, reduce_op=ReduceOp.MEAN, blocks=blocks, scale=scale
        )

    def with_values(
        self, values: list[list[tf.Tensor]], replica_index: tf.Tensor | None = None
    ) -> Replicas:
        """These replicas with new values; `replica_index` (int32, one entry
        per current value) when values were combined (see the attribute)."""
        if replica_index is not None and self.replica_index is not None:
            replica_index = tf.gather(replica_index, self.replica_index)
        elif replica_index is None:
            replica_index = self.replica_index
        return self._replace(values=values, replica_index=replica_index)

    def finish(self, result: Aggregation) -> Aggregation:
        """A rule's `Aggregation` of these (dense) values, as the strategy
        returns it: scaled, sparse rows given back, the report per replica."""
        values = result.values
        if self.scale is not None:
            values = [times(v, self.scale) for v in values]
        if self.blocks:
            values = [b.restore(v) for b, v in zip(self.blocks, values, strict=True)]
        report = result.report
        if self.replica_index is not None:
            report = {k: tf.gather(v, self.replica_index) for k, v in report.items()}
        return Aggregation(list(values), dict(report), result.state)


class Stage:
    """One transform of the gradient path.

    A stage implements `apply`, and `init` when it keeps state between
    steps. The strategy keeps the state in variables (placed by
    `state_devices`), in `strategy.extended.training_state`, so checkpoints
    hold it.

    Attributes:
        per_variable: True when each variable's result depends only on that
            variable's values and the stage keeps no state: the strategy
            may run different variables on different devices.
        report_names: The names of the per-replica report the path's rule
            gives (the last stage's; other stages report nothing).
    """

    per_variable: bool = False
    report_names: tuple[str, ...] = ()

    def init(self, specs: Sequence[tf.TensorSpec]) -> Any:
        """The state before the first step: a nest of tensors, `()` for none.

        Args:
            specs: One per variable, the spec of a replica's value (a sparse
                variable's dense block has an unknown first dimension).
        """
        return ()

    def apply(
        self, replicas: Replicas, state: Any, *, downstream: Downstream | None = None
    ) -> tuple[Replicas | Aggregation, Any]:
        """One step: `(what it made of the replicas, next state)`.

        Args:
            replicas: The values from the stage before.
            state: `init`'s, or the previous step's.
            downstream: The stages after this one (see `Downstream`), or
                `None` when nothing follows.

        Returns:
            `Replicas` for the next stage, or, from the last stage, the
            `Aggregation`; and the next state, structured as `state`.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement `apply`.")

    def apply_in_place(
        self,
        replicas: Replicas,
        variables: Any,
        *,
        downstream: Downstream | None = None,
    ) -> Replicas | Aggregation:
        """`apply`, with the state in variables: reads them, writes the next.

        A stage that can update its variables in place, without a new
        buffer per step, overrides it (worker momentum does).
        """
        state = read(variables)
        out, new = self.apply(replicas, state, downstream=downstream)
        assign(variables, new)
        return out

    def state_devices(self, state: Any) -> Any:
        """Where each part of `state` lives between steps: a device name, or
        `None` for the reduction device. Same structure as `state`."""
        return tf.nest.map_structure(lambda _: None, state)


class Chain(Stage):
    """Stages run one after another; itself a stage (see `chain`).

    Attributes:
        stages: The stages, in order (nested chains flattened).
    """

    def __init__(self, *stages: Stage):
        flat = []
        for stage in stages:
            if not isinstance(stage, Stage):
                raise ValueError(
                    "`chain` takes stages (keras_psdist.gradients.Stage). "
                    f"Received: {stage!r}"
                )
            flat.extend(stage.stages if isinstance(stage, Chain) else [stage])
        if not flat:
            raise ValueError("`chain` needs at least one stage. Received: none")
        self.stages = tuple(flat)
        self.per_variable = all(stage.per_variable for stage in flat)
        self.report_names = tuple(flat[-1].report_names)

    def init(self, specs: Sequence[tf.TensorSpec]) -> tuple:
        return tuple(stage.init(specs) for stage in self.stages)

    def state_devices(self, state: Any) -> tuple:
        return tuple(
            stage.state_devices(s) for stage, s in zip(self.stages, state, strict=True)
        )

    def apply(self, replicas, state, *, downstream=None):
        if not replicas.values:
            return Aggregation([], {}, state), state
        states, new = list(state), []
        for i, stage in enumerate(self.stages):
            probe = _probe(self.stages[i + 1 :], states[i + 1 :], replicas, downstream)
            replicas, s = stage.apply(replicas, states[i], downstream=probe)
            new.append(s)
        return replicas, tuple(new)

    def apply_in_place(self, replicas, variables, *, downstream=None):
        if not replicas.values:
            return Aggregation([], {}, ())
        for i, stage in enumerate(self.stages):
            rest = self.stages[i + 1 :]
            probe = _probe(rest, None, replicas, downstream, variables[i + 1 :])
            replicas = stage.apply_in_place(replicas, variables[i], downstream=probe)
        return replicas

    def __repr__(self) -> str:
        return f"chain({', '.join(map(repr, self.stages))})"


def chain(*stages: Stage) -> Chain:
    """Composes stages into one, run in the order given.

    Args:
        *stages: `Stage`s; the last returns the aggregate (a `Rule`).

    Returns:
        A `Chain`, itself a stage: its state is the tuple of theirs.

    Raises:
        ValueError: for no stage, or anything that is not a `Stage`.
    """
    return Chain(*stages)


def read(variables: Any) -> Any:
    """The values of a structure of variables, same structure."""
    return tf.nest.map_structure(lambda v: v.read_value(), variables)


def assign(variables: Any, values: Any) -> None:
    """Writes `values` into `variables` (same structure), cast to their dtype.

    The writes gate nothing: a step function runs every one of them anyway
    (automatic control dependencies, which also order them against the next
    step's reads), so the optimizer's update does not wait for the state.
    """
    for var, value in zip(
        tf.nest.flatten(variables), tf.nest.flatten(values), strict=True
    ):
        var.assign(tf.cast(value, var.dtype))


def _probe(rest, states, replicas, downstream, variables=None):
    """`Downstream` for the stage before `rest`: runs them on candidate
    values (dense, true scale) with this step's states (read from
    `variables` when the chain runs in place), giving their aggregate."""
    if not rest:
        return downstream

    def run(values):
        current = read(variables) if states is None else states
        candidate = Replicas(values, ReduceOp.MEAN, replicas.shares, blocks=())
        out, _ = Chain(*rest).apply(candidate, tuple(current), downstream=downstream)
        return out.values

    return run
