"""A sync-replica run whose workers join and leave: its counts follow them.

`SyncReplicaStrategy(max_workers=M, replicas_to_aggregate=..., num_byzantine=...)`
(or `keras-psdist launch --max-workers M`, which sets it for every worker):
who trains is the elastic registry's (`keras_psdist.cluster.elastic`), and
each time the chief's update service sees the workers change it derives the
counts again from the rules the user stated (`keras_psdist.count_rules`):

- `replicas_to_aggregate`: `"all_but_one"`, `0.75`, `All()`...: fresh
  gradients per update for the n workers now; a fixed int stays fixed (the
  run ends, as today, when fewer than it remain);
- the backups: n minus that;
- `num_byzantine`: `0.25`, a `Fraction`...: the faulty workers the rule
  tolerates, checked by binding the rule to the new counts (Krum after a
  shrink may not bind: the run then stops, naming the count and the rule;
  while workers join, at the start, the first update waits instead for the
  fewest workers the rule runs on: `Resizing.counts_to_wait_for`).

When the change takes effect (`keras_psdist.sync.service`): a worker joins
with its first gradient and leaves with its `LEAVE` (or is found lost), each
an element of the one gradient queue, so changes are ordered against the
gradients. A join changes the counts right after the pending update (made
with the counts it began with: it never waits for more gradients than
that), or at once when none is pending. A leave changes them at once: no
update waits for a worker that is gone, and the pending update is made now
if it has the gradients the new counts ask for (the first ones; any others
count as a backup's, stale). No gradient is lost or counted twice: the
service still classifies each element once.

The rule's own state (centered clipping's centre) is kept per count: after a
change to counts seen before, the rule goes on from that state; to new
counts, from its initial state.

Examples:

>>> from keras_psdist import aggregators
>>> resizing = Resizing("all_but_one", None, aggregators.get("mean"), lambda: [0, 1, 2])
>>> resizing.counts(4)
Counts(num_workers=4, replicas_to_aggregate=3, num_byzantine=0)
>>> resizing.counts(4).backups
1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from keras_psdist import count_rules
from keras_psdist.errors import WorkerLostError


@dataclasses.dataclass(frozen=True)
class Counts:
    """The counts of a sync run for the workers it has now."""

    num_workers: int
    replicas_to_aggregate: int
    # None: the rule's own, bound once (a run whose workers are fixed).
    num_byzantine: int | None

    @property
    def backups(self) -> int:
        """Workers an update does not wait for."""
        return max(0, self.num_workers - self.replicas_to_aggregate)

    def describe(self) -> str:
        """`"4 workers: replicas_to_aggregate=3, backups=1, num_byzantine=0"`."""
        n = self.num_workers
        return (
            f"{n} worker{'' if n == 1 else 's'}: replicas_to_aggregate="
            f"{self.replicas_to_aggregate}, backups={self.backups}, "
            f"num_byzantine={self.num_byzantine}"
        )


class Resizing:
    """Derives a sync run's counts for its current workers (see the module doc).

    Args:
        replicas_to_aggregate: The user's count or rule (`None`: all).
        num_byzantine: The user's count or rule (`None`: the rule's own).
        aggregator: The unbound rule across workers.
        members: Reads the registry's member slots now.
        max_workers: The most workers the run admits (`None`: no more than
            are members now).
    """

    def __init__(
        self,
        replicas_to_aggregate: Any,
        num_byzantine: Any,
        aggregator: Any,
        members: Callable[[], list[int]],
        max_workers: int | None = None,
    ):
        self._to_aggregate = (
            count_rules.All()
            if replicas_to_aggregate is None
            else count_rules.get(replicas_to_aggregate, "replicas_to_aggregate")
        )
        self._num_byzantine = num_byzantine
        self._aggregator = aggregator
        self.members = members
        self.max_workers = max_workers
        self._bound: dict[tuple[int, int], Any] = {}

    @property
    def follows_workers(self) -> bool:
        """Whether `replicas_to_aggregate` is a rule (else a fixed number)."""
        return isinstance(self._to_aggregate, count_rules.CountRule)

    def counts(self, num_workers: int) -> Counts:
        """The counts for `num_workers` workers, the rule checked on them.

        Raises:
            WorkerLostError: if the rule cannot run on them (say Krum with
                too few), naming the counts and what to change.
        """
        to_aggregate = count_rules.count(
            self._to_aggregate, max(1, num_workers), "replicas_to_aggregate"
        )
        num_byzantine = count_rules.count(
            self._num_byzantine, max(1, num_workers), "num_byzantine"
        )
        rule = self.rule(to_aggregate, num_byzantine)
        return Counts(num_workers, to_aggregate, rule.num_byzantine)

    def counts_to_wait_for(self, num_workers: int) -> Counts:
        """The counts of the fewest workers, more than `num_workers` and at
        most `max_workers`, the rule runs on: what a run too small for its
        rule waits to fill (at its start, while workers join; the median
        with `num_byzantine=1` needs 3).

        Raises:
            WorkerLostError: if no such count exists, as `counts` does for
                `num_workers`.
        """
        for more in range(num_workers + 1, (self.max_workers or 0) + 1):
            try:
                return self.counts(more)
            except WorkerLostError:
                continue
        return self.counts(num_workers)

    def rule(self, to_aggregate: int, num_byzantine: int | None) -> Any:
        """The aggregator bound to `to_aggregate` gradients (kept per count)."""
        key = (to_aggregate, -1 if num_byzantine is None else num_byzantine)
        if key not in self._bound:
            try:
                self._bound[key] = self._aggregator.bind(to_aggregate, num_byzantine)
            except ValueError as e:
                raise WorkerLostError(
                    "The workers changed, and the rule across them cannot run on "
                    f"the new counts (replicas_to_aggregate={to_aggregate}, "
                    f"num_byzantine={num_byzantine}): {e} Keep more workers in "
                    "the job (`keras-psdist launch --min-workers`), or state "
                    "counts the rule accepts for every number of workers."
                ) from None
        return self._bound[key]
