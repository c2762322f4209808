"""Where variables live and how they are written: one copy, on a parameter device.

    creation.py       the variable creator: placement, partitioning, sharing
                      between worker processes
    values.py         `PSVariable`, the one-copy variable handed to Keras, and
                      how writes made in replica context are combined
    partitioned.py    `PartitionedVariable`: a table split into row shards
    shard_layout.py   which rows each shard holds
    shard_updates.py  the update of a partitioned variable, shard by shard
    row_separable.py  the shard-by-shard update path (which optimizers: partitioners)
    staged_merge.py   synchronisation points inside control flow
    narrow_reads.py   a replica's reads from another task in a narrower dtype
                      (`read_dtype=`)

The policies a user picks are public modules of the package:
`keras_psdist.placement` (which device) and `keras_psdist.partitioners`
(how many shards).
"""
