"""Every Keras method keras_psdist replaces, in one list, installed together.

A custom `tf.distribute.Strategy` reaches most of Keras through the strategy
API (variable creators, `reduce_to`, `update`, distributed datasets). The
behaviours Keras 3 has no extension point for are added by wrapping a Keras
method; each wrapper acts only for models, optimizers and variables of a
keras_psdist strategy and passes every other call through unchanged (the
contract tests run MirroredStrategy and the default strategy in the same
process to hold it to that). `PATCHES` lists them with what Keras lacks;
`install()` applies all of them once, in that order, when the first
keras_psdist strategy is built; `uninstall()` restores Keras's own methods.

Keras 3 does not support parameter-server training (keras-team/keras#18624:
"Parameter server training is not supported in Keras 3"), so none of these
has an upstream fix to wait for; each names the smallest Keras change that
would retire it.

Examples:

>>> from keras_psdist.integration import keras_patches
>>> [p.target for p in keras_patches.PATCHES][:2]
['keras.callbacks:ModelCheckpoint._save_model', 'keras.callbacks:BackupAndRestore._save_model']
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Patch:
    """One Keras attribute keras_psdist wraps.

    Attributes:
        target: `"module:Class.attribute"` (or `"module:attribute"`).
        wrapper: `"module:function"` taking Keras's attribute and returning
            the replacement.
        why: What Keras lacks, and what would retire the patch.
        no_extension_point: The extension points of TensorFlow and Keras
            that were considered instead, and why none serves.
    """

    target: str
    wrapper: str
    why: str
    no_extension_point: str

    def resolve(self) -> tuple[object, str]:
        """The object that holds the attribute, and the attribute's name."""
        module, _, path = self.target.partition(":")
        owner = importlib.import_module(module)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        return owner, name

    def make(self, original: Callable) -> Callable:
        module, _, name = self.wrapper.partition(":")
        return getattr(importlib.import_module(module), name)(original)


def keras_reduce_per_replica(outputs, strategy):
    """What Keras's TF trainer does to a step's per-replica outputs
    (`keras.src.backend.tensorflow.trainer.reduce_per_replica`, "auto")."""
    from keras.src.backend.tensorflow.trainer import reduce_per_replica

    return reduce_per_replica(outputs, strategy, reduction="auto")


_CHIEF_ONLY = (
    "Between-graph, every worker runs the same script and the weights are "
    "shared: only the chief may write (and only its file may be restored). "
    "Keras's callbacks decide by `model.distribute_strategy`'s "
    "MultiWorkerMirroredStrategy-only logic; retired by a Keras callback hook "
    "that asks the strategy `should_checkpoint`."
)

PATCHES: tuple[Patch, ...] = (
    Patch(
        "keras.callbacks:ModelCheckpoint._save_model",
        "keras_psdist.integration.checkpointing:on_chief_only",
        _CHIEF_ONLY,
        "Keras 3's checkpoint callbacks never read the strategy's "
        "`should_checkpoint`; a callback of our own would make users swap "
        "their callbacks, breaking the one-line strategy swap.",
    ),
    Patch(
        "keras.callbacks:BackupAndRestore._save_model",
        "keras_psdist.integration.checkpointing:backup_with_training_state",
        _CHIEF_ONLY + " It also saves the strategy's training state (the "
        "aggregator's state, worker momenta) beside the weights: Keras saves "
        "only the model's and optimizer's variables.",
        "Keras 3's checkpoint callbacks never read the strategy's "
        "`should_checkpoint`; a callback of our own would make users swap "
        "their callbacks, breaking the one-line strategy swap.",
    ),
    Patch(
        "keras.callbacks:BackupAndRestore.on_train_end",
        "keras_psdist.integration.checkpointing:on_chief_only",
        _CHIEF_ONLY + " (It also deletes the backup at the end.)",
        "Keras 3's checkpoint callbacks never read the strategy's "
        "`should_checkpoint`; a callback of our own would make users swap "
        "their callbacks, breaking the one-line strategy swap.",
    ),
    Patch(
        "keras.callbacks:BackupAndRestore._load_model",
        "keras_psdist.integration.checkpointing:weights_from_chief_only",
        _CHIEF_ONLY + " It also restores the strategy's training state.",
        "Keras 3's checkpoint callbacks never read the strategy's "
        "`should_checkpoint`; a callback of our own would make users swap "
        "their callbacks, breaking the one-line strategy swap.",
    ),
    Patch(
        "keras:Model.save",
        "keras_psdist.integration.checkpointing:atomic",
        "A crash mid-save (a lost task ends a process at once) must leave the "
        "previous file whole: write beside it and rename. Retired by atomic "
        "saves in Keras's saving_lib.",
        "Keras's saving_lib writes the file in place and has no hook around "
        "the write; the process may be ended by `os._exit` (a lost task) "
        "at any point of it.",
    ),
    Patch(
        "keras:Model.save_weights",
        "keras_psdist.integration.checkpointing:atomic",
        "As Model.save.",
        "As Model.save.",
    ),
    Patch(
        "keras.src.backend.tensorflow.numpy:take",
        "keras_psdist.integration.routed_take:routed_take",
        "The TF backend's `take` reads the whole variable, then gathers: an "
        "embedding table would cross the network every step. Retired by a "
        "`take` that calls `sparse_read` on a variable (as tf.keras's "
        "Embedding did).",
        "TensorFlow's dispatch (`dispatch_for_api(tf.gather)`) and the tensor "
        "conversion registry come too late: Keras's `take` calls "
        "`convert_to_tensor(x)` first, which reads the whole table before "
        "any dispatchable op runs, and a conversion must return the whole "
        "tensor.",
    ),
    Patch(
        "keras.src.backend.tensorflow.core:Variable.assign_add",
        "keras_psdist.integration.colocated_updates:where_it_lives",
        "A Keras variable's `assign_add` is `assign(self + value)`, read and "
        "added on the caller's device: the optimizer's `iterations` went "
        "from its ps task to the worker and back in every step. Retired by "
        "the TF backend's variable calling `assign_add` of its `tf.Variable` "
        "(one op, placed with the variable).",
        "The read is a tensor conversion in the caller's device scope and the "
        "addition an op Keras makes there; the strategy sees only the "
        "`assign` that follows, with the sum already made.",
    ),
    Patch(
        "keras.src.backend.tensorflow.core:Variable.assign_sub",
        "keras_psdist.integration.colocated_updates:where_it_lives",
        "As assign_add.",
        "As assign_add.",
    ),
    Patch(
        "keras.src.backend.tensorflow.optimizer:TFOptimizer."
        "_distributed_tf_update_step",
        "keras_psdist.variables.row_separable:with_optimizer",
        "`extended.update` is told the variable and a closure, not the "
        "optimizer: a partitioned variable needs it to update each shard with "
        "its slot rows. The wrapper hands Keras's loop to the strategy's "
        "`optimizer_update` hook, which passes the optimizer to `update` as an "
        "argument. Retired by Keras passing the optimizer to `update`.",
        "`StrategyExtended.update(var, fn)` receives a closure, not the "
        "optimizer, and the variable creator runs before any optimizer "
        "exists: neither can tell a row-separable update.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.fit",
        "keras_psdist.cluster.task_loss:reporting",
        "A lost ps task surfaces as an opaque gRPC error (or a wait forever); "
        "fit must name the task. Retired by a strategy hook around a "
        "trainer's run.",
        "Keras callbacks have no hook for an exception raised in `fit`, and "
        "the strategy's hooks do not see the iterator set-up that can wait "
        "forever on a dead task.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.evaluate",
        "keras_psdist.cluster.task_loss:reporting",
        "As fit.",
        "As fit.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.predict",
        "keras_psdist.cluster.task_loss:reporting",
        "As fit.",
        "As fit.",
    ),
    Patch(
        "keras.src.optimizers.base_optimizer:BaseOptimizer.apply",
        "keras_psdist.integration.training_hooks:sync_apply",
        "A sync-replica worker must send its gradient to the chief and wait, "
        "not apply it; Keras applies inside the train step. Retired by an "
        "optimizer hook of the strategy (`extended.apply_gradients`).",
        "The strategy's `batch_reduce_to` and `update` run inside `apply`, "
        "after Keras has decided to apply (and advanced `iterations`); no "
        "hook lets a strategy send the gradient instead of applying it.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.fit",
        "keras_psdist.integration.training_hooks:sync_fit",
        "A sync-replica run has a session around fit and marks each finished "
        "step. Wraps the task-loss fit above (this order). Retired by the "
        "same trainer hook as fit above.",
        "Callbacks mark the steps (`_Progress`), but leaving the protocol "
        "must also happen when `fit` raises, and callbacks are not told.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer._make_function",
        "keras_psdist.integration.step_loop:without_step_branch",
        "Keras's loop over `steps_per_execution` steps puts each step in a "
        "`tf.cond` that repeats the loop's condition; across tasks every ps "
        "task receives that branch's predicate and pivot each step, two "
        "transfers without data. The wrapper makes the same loop with the "
        "step as its body (`integration/step_loop.py`). Retired by Keras "
        "dropping the branch (it only matters when the loop is unrolled).",
        "The loop is built inside `_make_function` around the step function "
        "Keras is given; a strategy sees only the step (`strategy.run`), not "
        "the loop around it.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer._make_function",
        "keras_psdist.integration.xla:compiled_per_replica",
        "`compile(jit_compile=True)` puts the whole step (replicas, gradient "
        "reduction, update, reads of variables on other devices) in one XLA "
        "cluster, which fails. The wrapper builds the step without XLA and "
        "compiles each replica's forward and backward pass on its device "
        "(`integration/xla.py`). Retired by a Keras trainer that compiles "
        "only the replica's pure part, as its JAX backend does.",
        "`jit_compile` is read when Keras builds the step function; the "
        "strategy's `_call_for_each_replica` runs inside the compiled function "
        "and cannot leave it, and XLA cannot call `merge_call`.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer._make_function",
        "keras_psdist.integration.step_device:on_step_device",
        "In-graph, the chief calls the train function but holds no replica: "
        "the ops of Keras's loop over `steps_per_execution` steps (its "
        "counter, its end-of-data predicates) run on the chief, and every "
        "step passes them between the chief and every worker and ps task. "
        "The wrapper calls the function on `extended.step_device`, the "
        "first worker. Retired by a strategy hook Keras calls around a step "
        "function's call.",
        "A strategy sees only what runs inside the traced function "
        "(`strategy.run`, `reduce_to`); the call itself, and the device it "
        "is made on, is Keras's.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.make_predict_function",
        "keras_psdist.integration.xla:predict_without_xla",
        "As `_make_function`: `predict` is built without XLA; its forward "
        "pass is compiled per replica by the `predict_step` patch below. "
        "Retired with it.",
        "As `_make_function`.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.predict_step",
        "keras_psdist.integration.xla:compiled_predict_step",
        "Under `jit_compile=True`, compiles the forward pass of Keras's own "
        "`predict_step` on each replica's device, the variables read outside "
        "XLA (`integration/xla.py`). Retired with `_make_function` above.",
        "`make_predict_function` takes no step function (unlike "
        "`_make_function`); Keras calls `self.predict_step` only when the "
        "predict function is first traced, after it is built.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer._maybe_symbolic_build",
        "keras_psdist.integration.one_device_steps:built_when_traced",
        "Under any strategy Keras builds the model symbolically before `fit` "
        "and raises when it cannot (a model with no `call`, as keras-io's "
        "GAN); one device builds it in the traced step, where a keras_psdist "
        "strategy can create variables too. Retired by Keras deferring the "
        "build to the step for strategies that create variables there.",
        "The failure is raised by `fit` before the strategy's first hook "
        "runs; no strategy hook is asked whether it can build in the step.",
    ),
    Patch(
        "keras.src.losses.loss:scale_loss_for_distribution",
        "keras_psdist.integration.one_device_steps:scaled_in_replicas_only",
        "Keras divides a loss by the replica count whenever a strategy's "
        "scope is active, also outside `strategy.run`, where no replicas sum "
        "the gradient: a training loop from scratch under the scope would "
        "train at 1/n the step. Retired by Keras scaling only in a replica "
        "context.",
        "Keras calls it from `Loss.__call__` by name; the strategy is not "
        "asked, and a cross-replica step has no hook of its own.",
    ),
    Patch(
        "keras.src.losses.loss:unscale_loss_for_distribution",
        "keras_psdist.integration.one_device_steps:scaled_in_replicas_only",
        "Its inverse, for the logged loss: as above.",
        "As above.",
    ),
    Patch(
        "keras.src.trainers.trainer:Trainer.compile",
        "keras_psdist.integration.compile_checks:checked_compile",
        "Keras takes each object's strategy from the scope active when it is "
        "made; pieces made outside train silently wrong (an optimizer's "
        "`iterations` advances once per replica, keras-team/keras#18624). "
        "Retired by Keras checking it (it does for models, not optimizers).",
        "Keras checks at `compile` that the model was built under the "
        "scope, not the optimizer; there is no compile hook.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.fit",
        "keras_psdist.integration.compile_checks:checked_in_scope",
        "A model made outside the scope and fit inside it, or a model of one "
        "strategy run in another's scope, meets TensorFlow's raw \"Mixing "
        'different tf.distribute.Strategy objects", which names neither '
        "the model nor the fix; fit must say what to create inside the "
        "scope. Outermost, so it runs before the sync session. Retired by "
        "Keras checking the scope at fit, as it does at compile for models.",
        "The strategy's hooks (`run`, `experimental_distribute_dataset`) do "
        "not see the model, and for a model of another strategy TensorFlow "
        "raises before any hook of ours runs.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.evaluate",
        "keras_psdist.integration.compile_checks:checked_in_scope",
        "As fit, for a model of another strategy (one of no strategy "
        "evaluates correctly inside the scope, and passes).",
        "As fit.",
    ),
    Patch(
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.predict",
        "keras_psdist.integration.compile_checks:checked_in_scope",
        "As evaluate.",
        "As fit.",
    ),
)

_lock = threading.Lock()
# (owner, name, Keras's attribute) in the order installed.
_installed: list[tuple[object, str, object]] = []


def install() -> None:
    """Applies every patch of `PATCHES`, in order, once per process."""
    with _lock:
        if _installed:
            return
        for patch in PATCHES:
            owner, name = patch.resolve()
            original = owner.__dict__[name] if name in vars(owner) else None
            current = getattr(owner, name)
            setattr(owner, name, patch.make(current))
            _installed.append((owner, name, original))


def uninstall() -> None:
    """Restores Keras's own attributes (for tests): the last patch first."""
    with _lock:
        while _installed:
            owner, name, original = _installed.pop()
            if original is None:
                delattr(owner, name)  # It was inherited: inherit again.
            else:
                setattr(owner, name, original)


def is_installed() -> bool:
    """Whether `install()` has run (and `uninstall()` has not since)."""
    return bool(_installed)
