"""Sync-replica training between worker processes (TF1's `SyncReplicasOptimizer`).

- `protocol`: the state shared on the ps (tagged gradient queue, release
  tokens, global step, counts) and a worker's step;
- `service`: the chief's update loop (drop stale, aggregate, apply, release);
- `training`: one process's part: its steps, its `fit`s, its watchdog;
- `keras_hooks`: where it meets Keras (`Optimizer.apply`, `Model.fit`);
- `strategy`: `SyncReplicaStrategy`, the public front.
"""
