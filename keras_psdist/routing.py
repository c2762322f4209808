"""How Keras's row lookups and optimizer updates reach parameter devices.

Two Keras internals decide what crosses the network each step, and
`keras_psdist.integration.keras_patches` wraps both, with
`integration.routed_take.routed_take` and `row_separable.with_optimizer`, for variables of a keras_psdist strategy only
(every other call is passed through untouched):

| Keras does | keras_psdist does |
|---|---|
| `ops.take(table, ids, axis=0)` (`Embedding.call`): the TF backend first reads the *whole* table, then gathers | gathers the rows where they live: on the parameter device, or on each shard that owns some of them; only the touched rows travel to the replica |
| `optimizer.update_step(g, v, lr)` inside `extended.update` | once per shard of a partitioned `v`, on the shard's device, with the shard's rows of `g` and of every slot, when the optimizer's update is row-separable; else once, on the whole variable |

An update is row-separable when each row of the new variable and slots
depends only on that row of the old ones and of the gradient (plus scalars):
true of SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta, Adamax, Nadam, Ftrl,
Lion and ScheduleFreeAdamW. Adafactor (factored moments), Lamb (whole-tensor
trust ratio) and Muon (orthogonalises whole matrices) are not: for them a
partitioned variable is gathered and updated whole, which is exact but moves
the variable each step (a warning says so once). A custom optimizer whose
`update_step` is elementwise can say so with `register_row_separable`.

Examples:

>>> import keras
>>> is_row_separable(keras.optimizers.Adam())
True
>>> is_row_separable(keras.optimizers.Lamb())
False
"""

from keras_psdist.variables.row_separable import (
    is_row_separable,
    register_row_separable,
)

__all__ = ["is_row_separable", "register_row_separable"]
