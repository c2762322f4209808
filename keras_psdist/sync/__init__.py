"""Sync-replica training between worker processes (TF1's `SyncReplicasOptimizer`),
and bounded staleness: the machinery behind `keras_psdist.modes.sync_replicas`
and `keras_psdist.modes.bounded_staleness`.

- `protocol`: the state shared on the ps (tagged gradient queue, release
  tokens, global step, counts) and a worker's step;
- `service`: the chief's update loop (drop stale, aggregate, apply, release);
- `staging`: where the chief keeps the gradients it pops: slots on the ps,
  so that no member's gradient travels to the chief and back;
- `training`: one sync-replica process's part: its steps, its `fit`s, its
  watchdog (`SyncTraining`, a `keras_psdist.modes.Training`);
- `staleness`: one bounded-staleness worker's part (`BoundedStaleness`,
  a `keras_psdist.modes.Training`);
- `per_worker`: a worker's gradients summed over its replicas, once per step.

Where they meet Keras (`Optimizer.apply`, `Model.fit`) is
`keras_psdist.integration.training_hooks`.
"""
