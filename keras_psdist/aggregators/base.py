"""The aggregator interface: how per-replica values become one.

An aggregator is the *how* of the hook chain: `PSExtended._batch_reduce_to`
collects every replica's gradients for a step and hands them, all variables at
once, to `Aggregator.step`, which

1. brings them to their true scale (Keras sends `1/n`-scaled values for a SUM),
2. gives sparse (`IndexedSlices`) values a dense block over the rows any
   replica touched (`sparse.py`), never over the whole table,
3. masks replicas that got no data in this step,
4. runs the rule (`apply`), and returns an `Aggregation`: the values, a
   per-replica report for diagnostics, and the rule's next state.

A simulated attack is not part of this interface: `keras_psdist.attacks.UnderAttack`
composes one in front of a rule's `apply`.

A rule only writes `aggregate` (stateless) or `apply` (stateful or reporting).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from keras_psdist.aggregators import sparse as sparse_lib
from keras_psdist.families import AGGREGATORS
from keras_psdist.registry import check_arguments

ReduceOp = tf.distribute.ReduceOp


class Aggregation(NamedTuple):
    """What one aggregation step produced.

    Attributes:
        values: One tensor per variable, the rule's estimate of the mean.
        report: Per-replica diagnostics, `name -> float32 tensor of shape
            [n]` (e.g. Krum's `selected`); the names are the rule's
            `report_names`.
        state: The rule's state for the next step (`()` for stateless rules).
    """

    values: list[tf.Tensor]
    report: dict[str, tf.Tensor]
    state: Any = ()


class Aggregator:
    """Base class of aggregation rules.

    A rule sees, for each variable, the list of per-replica values at their
    *true* scale (what one replica's loss would give on its own) and returns an
    estimate of their mean. `reduce` / `step` adapt that to `tf.distribute`'s
    `ReduceOp`: Keras divides each replica's loss by the replica count and asks
    for a SUM, so under `SUM` the inputs are multiplied by `n` before the rule
    sees them and the rule's mean estimate is returned as the SUM. The learning
    rate therefore means the same with every rule.

    The number of Byzantine replicas *f* is the strategy's `num_byzantine`: the
    strategy calls `bind(n, f)`, which checks the rule's condition on n and f
    and returns a copy that knows them (`self.num_replicas`,
    `self.num_byzantine`). A rule built with its own `num_byzantine` must agree
    with the strategy's.

    What a rule overrides: `aggregate(per_replica)`, or `apply(per_replica,
    state)` and `initial_state(specs)` when it keeps state between steps or
    reports diagnostics (never editing its inputs); `check` for its
    condition on n and f, and `get_config` for its arguments. The rest
    (`bind`, `step`, `reduce`, `apply_step`, `reduce_sparse`) adapts the
    rule to the strategy: built-in rules override `step` and `apply_step`
    only to fuse passes (the mean over sparse rows, the order statistics'
    masking and scaling). In a strategy the rule is the last stage of the
    gradient path (`keras_psdist.gradients`), after worker momentum, an
    attack and the pre-aggregations.

    Args:
        num_byzantine: The *f* this rule is configured for, or `None` to take
            the strategy's. Defaults to `None`.

    Attributes:
        name: The string id the rule is registered under.
        report_names: The names of the per-replica diagnostics `apply` reports.
        per_variable: True when each variable's result depends only on that
            variable's values and the rule keeps no state and reports
            nothing; the strategy may then combine different variables on
            different parameter devices.
        scale_equivariant: True when scaling every replica's values by
            `c > 0` scales the result by `c` and leaves the report as it is
            (order statistics). `step` then scales the result instead of
            each replica's values, one elementwise pass instead of n.
        coordinatewise: True when the rule keeps, at each coordinate, values
            near the middle of the replicas' (median, trimmed mean, Meamed,
            Bulyan's last step): a coordinate that fewer than half the
            replicas sent a nonzero value for is 0 there.
        needs_num_byzantine: True when the rule, bound with
            `num_byzantine=0`, defends against nothing: it is then the mean
            (the trimmed mean trims nothing) or leaves the values as they
            are (ARC clips none). The strategies warn when it runs so.
        without_num_byzantine: What such a rule does with `num_byzantine=0`,
            completing "so <name> ..." in that warning (e.g. "trims nothing:
            it is the plain mean, and defends against no faulty replica").
    """

    name = AGGREGATORS.id_attribute(default="aggregator")
    report_names: tuple[str, ...] = ()
    per_variable: bool = False
    scale_equivariant: bool = False
    coordinatewise: bool = False
    needs_num_byzantine: bool = False
    without_num_byzantine: str = ""

    def __init__(self, num_byzantine: int | None = None):
        if num_byzantine is not None:
            check_int_at_least("num_byzantine", num_byzantine, minimum=0)
        self.num_byzantine = num_byzantine
        self.num_replicas: int | None = None

    @property
    def f(self) -> int:
        """The number of Byzantine replicas the rule guards against (0 if unset)."""
        return self.num_byzantine or 0

    # ------------------------------------------------------------ checking

    def bind(self, num_replicas: int, num_byzantine: int | None = None) -> Aggregator:
        """Returns a copy of the rule for `num_replicas` replicas, `num_byzantine` bad.

        Args:
            num_replicas: The strategy's replica count n.
            num_byzantine: The strategy's *f*, or `None` to keep the rule's.

        Raises:
            ValueError: if the rule's own `num_byzantine` disagrees, or the
                rule's condition on n and f fails (see `check`).
        """
        if (
            num_byzantine is not None
            and self.num_byzantine is not None
            and num_byzantine != self.num_byzantine
        ):
            raise ValueError(
                f"The aggregator {self!r} was built for num_byzantine="
                f"{self.num_byzantine}, but the strategy has num_byzantine="
                f"{num_byzantine}. Pass the same value to both, or leave "
                "one of them unset."
            )
        f = self.num_byzantine if num_byzantine is None else num_byzantine
        f = 0 if f is None else f
        self.check(num_replicas, f)
        bound = copy.copy(self)
        bound.num_replicas = num_replicas
        bound.num_byzantine = f
        return bound

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        """Raises `ValueError` if the rule cannot run with these counts.

        Called when the strategy is built, so a bad combination fails at once
        rather than at the first step. Subclasses extend it with their
        condition on n and f, naming the rule, the values and the fix.

        Args:
            num_replicas: Number of replicas whose values are aggregated.
            num_byzantine: Number of replicas that may be faulty.
        """
        check_int_at_least("num_replicas", num_replicas, minimum=1)
        check_int_at_least("num_byzantine", num_byzantine, minimum=0)

    # ----------------------------------------------------------- the rule

    def aggregate(self, per_replica: Sequence[Sequence[tf.Tensor]]) -> list[tf.Tensor]:
        """Aggregates true-scale values.

        Args:
            per_replica: `per_replica[v][r]` is replica `r`'s value for
                variable `v`; every value of one variable has the same shape.

        Returns:
            One tensor per variable: the rule's estimate of the mean.
        """
        if type(self).apply is Aggregator.apply:
            raise NotImplementedError(
                f"{type(self).__name__} must implement `aggregate` or `apply`."
            )
        if not per_replica:
            return []
        specs = [tf.TensorSpec(vs[0].shape, vs[0].dtype) for vs in per_replica]
        return self.apply(per_replica, self.initial_state(specs)).values

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        """One aggregation step: values, per-replica report and next state.

        Args:
            per_replica: As in `aggregate`, with at least one variable
                (`aggregate` and `step` handle the empty case).
            state: The state `initial_state` made, or the previous step's.

        Returns:
            An `Aggregation`.
        """
        return Aggregation(self.aggregate(per_replica), {}, state)

    def initial_state(self, specs: Sequence[tf.TensorSpec]) -> Any:
        """The state before the first step, for values of these specs.

        A nest of tensors; the strategy keeps it in variables on the reduction
        device between steps. Stateless rules return `()`.
        """
        return ()

    # ---------------------------------------------- tf.distribute adapters

    def reduce(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_replica: Sequence[Sequence[tf.Tensor | tf.IndexedSlices]],
        shares: Sequence[tf.Tensor] | None = None,
    ) -> list[tf.Tensor | tf.IndexedSlices]:
        """Reduces per-replica values with `tf.distribute` semantics, statelessly.

        `step` with the rule's initial state; see there.
        """
        specs = [column_spec(vs) for vs in per_replica]
        return self.step(
            reduce_op, per_replica, shares=shares, state=self.initial_state(specs)
        ).values

    def step(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_replica: Sequence[Sequence[tf.Tensor | tf.IndexedSlices]],
        *,
        shares: Sequence[tf.Tensor] | None = None,
        state: Any = (),
    ) -> Aggregation:
        """One step of the strategy's reduction (see the module docstring).

        Args:
            reduce_op: `ReduceOp.SUM` (values are scaled by `1/n`, as Keras
                sends gradients) or `ReduceOp.MEAN` (values at true scale).
            per_replica: As in `aggregate`; values may be `IndexedSlices`.
            shares: Each replica's fraction of the global batch (summing to
                1), or `None` for equal shares. Replicas with share 0 got no
                data; their values (possibly NaN) are replaced by zeros.
            state: The rule's state (see `initial_state`).

        Returns:
            An `Aggregation` whose values have the meaning `reduce_op` asks
            for; sparse inputs give `IndexedSlices` over the touched rows.
        """
        if not per_replica:
            return Aggregation([], {}, state)
        n = len(per_replica[0])
        # Values scaled by 1/n (SUM) are brought to true scale: the result
        # once when the rule allows, else each replica's values.
        scale_result = reduce_op == ReduceOp.SUM and self.scale_equivariant
        if reduce_op == ReduceOp.SUM and not scale_result:
            per_replica = [[times(v, n) for v in vs] for vs in per_replica]
        blocks = [sparse_lib.to_dense_rows(vs) for vs in per_replica]
        has_data = None
        if shares is not None:
            has_data = tf.stack([tf.convert_to_tensor(s) > 0 for s in shares])
        result = self.apply_step(
            [b.values for b in blocks],
            state,
            has_data=has_data,
            scale=float(n) if scale_result else None,
        )
        out = [b.restore(v) for b, v in zip(blocks, result.values, strict=True)]
        return Aggregation(out, result.report, result.state)

    def apply_step(
        self,
        per_replica: Sequence[Sequence[tf.Tensor]],
        state: Any = (),
        *,
        has_data: tf.Tensor | None = None,
        scale: float | None = None,
    ) -> Aggregation:
        """`apply`, with the two passes `step` wraps around it.

        Replicas without data get zeros in place of their values (which may
        be NaN) before `apply`, and the result is multiplied by `scale`
        after it. A rule whose kernel can do both in its own pass over the
        values overrides this (`OrderStatisticsMean` does), saving two
        passes over the inputs and one over the result.

        Args:
            per_replica: Dense values, as in `apply`.
            state: As in `apply`.
            has_data: A bool `[n]` tensor, False for the replicas without
                data in this step, or `None` when every replica has data.
            scale: A factor for the result (only for `scale_equivariant`
                rules), or `None`.

        Returns:
            `apply`'s `Aggregation`, its values multiplied by `scale`.
        """
        if has_data is not None:
            per_replica = mask_replicas_without_data(per_replica, has_data)
        result = self.apply(per_replica, state)
        if scale is None:
            return result
        return result._replace(values=[times(v, scale) for v in result.values])

    def reduce_sparse(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_replica: Sequence[tf.IndexedSlices | tf.Tensor],
    ) -> tf.IndexedSlices | tf.Tensor:
        """Reduces one variable's sparse per-replica values (see `step`)."""
        return self.reduce(reduce_op, [per_replica])[0]

    # ----------------------------------------------------- serialization

    def get_config(self) -> dict[str, Any]:
        """Returns the rule's constructor arguments."""
        return {"num_byzantine": self.num_byzantine}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Aggregator:
        """Builds the rule from `get_config()`'s output.

        Raises:
            ValueError: for a key the rule does not take or an argument it
                needs, listing the ones it accepts.
        """
        check_arguments(cls, config)
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(
            f"{k}={v!r}" for k, v in self.get_config().items() if v is not None
        )
        return f"{type(self).__name__}({args})"


def check_honest_majority(
    rule: Aggregator, num_replicas: int, num_byzantine: int
) -> None:
    """The condition of the median and trimmed mean: `n > 2f`."""
    if num_replicas <= 2 * num_byzantine:
        raise ValueError(
            f"{type(rule).__name__} needs more than 2 * num_byzantine = "
            f"{2 * num_byzantine} replicas (an honest majority). Received: "
            f"{num_replicas} replicas, num_byzantine={num_byzantine}. Add "
            "replicas or lower num_byzantine."
        )


def check_int_at_least(name: str, value: Any, minimum: int) -> None:
    """Raises a `ValueError` unless `value` is an int >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"`{name}` must be an int >= {minimum}. Received: {name}={value!r}"
        )


def weighted_sum(column: Sequence[tf.Tensor], shares: Sequence[tf.Tensor]) -> tf.Tensor:
    """`sum_r shares[r] * column[r]`, leaving out replicas with share 0.

    `tf.where`, not a product: a replica without data may hold NaN, and
    `NaN * 0` is NaN.
    """
    terms = []
    for value, share in zip(column, shares, strict=True):
        share = tf.cast(share, value.dtype)
        terms.append(tf.where(share > 0, value * share, tf.zeros_like(value)))
    return tf.add_n(terms)


def mask_replicas_without_data(dense, has_data):
    """Zeros for replicas without data (their values may be NaN).

    Every replica has data in all but a partial last batch, so the masking
    pass over all values runs only when some replica has none.
    """

    def masked():
        return [
            [tf.where(has_data[r], v, tf.zeros_like(v)) for r, v in enumerate(vs)]
            for vs in dense
        ]

    return tf.cond(tf.reduce_all(has_data), lambda: dense, masked)


def times(value, n):
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(
            value.values * tf.cast(n, value.values.dtype),
            value.indices,
            value.dense_shape,
        )
    return value * tf.cast(n, value.dtype)


def column_spec(column: Sequence[tf.Tensor | tf.IndexedSlices]) -> tf.TensorSpec:
    """The spec a rule's state sees for one variable's per-replica values.

    Sparse columns become dense blocks over the touched rows, whose count
    changes every step: their first dimension is unknown (`None`).
    """
    first = column[0]
    if isinstance(first, tf.IndexedSlices):
        return tf.TensorSpec([None, *first.values.shape[1:]], first.values.dtype)
    return tf.TensorSpec(first.shape, first.dtype)
