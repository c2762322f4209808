"""The hook chain: what `tf.distribute` calls, and what it calls next.

    run.py              `Run`: the one description of a run a strategy front
                        hands its extended
    extended.py         `PSExtended`, the `StrategyExtended` every strategy of
                        ours uses: variable creation, `call_for_each_replica`,
                        `reduce_to` / `batch_reduce_to`, `update`,
                        `colocate_vars_with`, distributed datasets
    replica_writes.py   how writes made in replica context reach the one copy
    cross_replica.py    `reduce_to` / `batch_reduce_to`, gathers, broadcasts:
                        which path each value of a step takes
    reduction.py        `batch_reduce_to`'s policy: one aggregator over every
                        gradient of a step, then the attack harness
    all_reduce.py       TensorFlow's all-reduce for replicated variables
                        (`dense=`) under the plain mean
    replica_batches.py  what a replica does with its piece of the batch, an
                        empty piece included
    input/              where each replica's batches come from

Variables (creation, placement, partitioning) are `keras_psdist.variables`;
the Keras side is `keras_psdist.integration`. See docs/architecture.md for
the whole chain, from `model.fit` to the update on the parameter device.
"""
