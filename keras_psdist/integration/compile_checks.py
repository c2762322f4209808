"""Refuses, at `model.compile` and `model.fit`, the set-ups that would train
silently wrong or fail with TensorFlow's raw errors.

Keras takes the distribution strategy from whatever scope is active when each
object is made: the model at creation, the optimizer at creation, metrics at
`compile`. A piece made outside `strategy.scope()` belongs to the default
strategy and still trains, but wrongly: an optimizer made outside advances its
step counter once per replica (so learning-rate schedules run n times too
fast), a model made outside trains on one device. Under a keras_psdist
strategy, `compile` checks each piece and raises a `ValueError` that names the
piece and the fix:

| mistake                                   | what it would do                  |
|-------------------------------------------|-----------------------------------|
| model created outside the scope           | `fit` runs on one device          |
| `compile` called outside the scope        | the optimizer and metrics it      |
|                                           | makes are not the strategy's      |
| optimizer created outside the scope       | `iterations` advances once per    |
|                                           | replica, schedules run n x fast   |
| `compile(jit_compile=True)` with a custom | the step cannot be cut where XLA  |
| `train_step` / `test_step`, or between-   | must stop (`integration/xla.py`)  |
| graph and sync-replica runs               |                                   |

`fit` checks the scope it is called in (a model made and compiled outside,
then fit inside, would otherwise meet TensorFlow's "Mixing different
tf.distribute.Strategy objects"); `fit`, `evaluate` and `predict` check that
no other strategy's scope is active:

| mistake                                   | what it would do                  |
|-------------------------------------------|-----------------------------------|
| model made and compiled outside the       | `RuntimeError: Mixing different   |
| scope, `fit` inside it                    | tf.distribute.Strategy objects`   |
| model of one strategy, `fit`, `evaluate`  | the same, naming two look-alike   |
| or `predict` in another strategy's scope  | strategies                        |

Models of other strategies (or none) are left alone: the checks look only at
models and scopes of a keras_psdist strategy. A model of no strategy fit or
evaluated outside any scope, and one evaluated inside a scope (Keras runs it
correctly), pass untouched.

One set-up trains, but worse than the user meant, and is warned about rather
than refused: an optimizer with its own momentum (`SGD(momentum=...)`,
Adam's `beta_1`) under `worker_momentum`, where the two momenta compound.

`checked_compile` wraps Keras's `Trainer.compile`, `checked_in_scope` its
`fit`, `evaluate` and `predict` (`keras_psdist.integration.keras_patches`).
"""

from __future__ import annotations

import functools

import tensorflow as tf
from absl import logging

from keras_psdist.integration import xla
from keras_psdist.integration.training_hooks import sync_training_of


def checked_compile(compile_):
    """Wraps `Trainer.compile` with `check_scope` and `check_compiled`."""

    @functools.wraps(compile_)
    def compile(self, *args, **kwargs):
        check_scope(self)
        result = compile_(self, *args, **kwargs)
        check_compiled(self)
        return result

    return compile


def checked_in_scope(method):
    """Wraps `fit`, `evaluate` or `predict` with `check_call_scope`."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        check_call_scope(self, method.__name__)
        return method(self, *args, **kwargs)

    return wrapper


def is_ours(strategy) -> bool:
    from keras_psdist.distribute.extended import PSExtended

    return strategy is not None and isinstance(
        getattr(strategy, "extended", None), PSExtended
    )


def _model_strategy(model):
    return getattr(model, "_distribute_strategy", None)


def check_scope(model) -> None:
    """Before `compile`: the model and this call are in the same scope."""
    built_under = _model_strategy(model)
    current = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    name = type(model).__name__
    if is_ours(current) and built_under is not current:
        raise ValueError(
            f"This {name} was created outside `strategy.scope()` of "
            f"{type(current).__name__}, and is compiled inside it: its variables "
            "are not on the strategy's parameter devices, and `fit` would train "
            "on one device. Create the model inside the scope too:\n"
            "    with strategy.scope():\n"
            "        model = build_model()\n"
            "        model.compile(...)"
        )
    if is_ours(built_under) and current is not built_under:
        raise ValueError(
            f"model.compile() was called outside `strategy.scope()` of the "
            f"{type(built_under).__name__} this {name} was created under: the "
            "optimizer and metrics it makes would not belong to the strategy "
            "(the optimizer's step counter would advance once per replica). "
            "Call compile inside the same scope:\n"
            "    with strategy.scope():\n"
            "        model = build_model()\n"
            "        model.compile(...)"
        )


def check_call_scope(model, method: str) -> None:
    """Before `fit`, `evaluate` or `predict`: no other strategy's scope.

    Outside any scope, Keras runs the model under the strategy it was
    created under, and a model of no strategy on one device. Inside a scope,
    a model of another strategy cannot run; a model of no strategy cannot
    train (its variables have no parameter device), though it evaluates.

    Raises:
        ValueError: naming both strategies (or the missing one) and the fix.
    """
    if not tf.distribute.has_strategy():
        return
    current = tf.distribute.get_strategy()
    built_under = _model_strategy(model)
    if built_under is current or not (is_ours(current) or is_ours(built_under)):
        return
    name = type(model).__name__
    scope = type(current).__name__
    if built_under is None:
        if method != "fit":
            return
        raise ValueError(
            f"This {name} was created and compiled outside `strategy.scope()` "
            f"of {scope}, and `fit` is called inside it: its variables and "
            "optimizer belong to no strategy, so they have no parameter device "
            "and it cannot train under this one. Create and compile the model "
            "inside the scope (fit may then be called inside or after it):\n" + _FIX
        )
    owner = type(built_under).__name__
    if owner == scope:
        owner, scope = f"one {owner}", f"another {scope} (a different object)"
    raise ValueError(
        f"This {name} was created under the scope of {owner}, and `{method}` "
        f"is called inside the scope of {scope}: a model runs only under the "
        f"strategy it was created under. Call {method} outside the "
        "`with strategy.scope():` block (Keras uses the model's own "
        "strategy), or inside the scope of the strategy it was created under. "
        "To train under the strategy whose scope is active instead, create "
        "and compile the model inside that scope:\n" + _FIX
    )


_FIX = (
    "    with strategy.scope():\n"
    "        model = build_model()\n"
    "        model.compile(...)\n"
    "    model.fit(...)"
)


def check_compiled(model) -> None:
    """After `compile`: the optimizer is the strategy's, and XLA (if on) can
    compile each replica's step."""
    strategy = _model_strategy(model)
    if not is_ours(strategy):
        return
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    for opt in {id(o): o for o in (optimizer, inner) if o is not None}.values():
        owner = getattr(opt, "_distribution_strategy", strategy)
        if owner is not strategy:
            kind = type(opt).__name__
            raise ValueError(
                f"The optimizer {kind} was created outside `strategy.scope()` "
                f"(it belongs to {_describe(owner)}), and compiled into a model "
                f"of {type(strategy).__name__}: its step counter `iterations` "
                f"would advance once per replica ({strategy.num_replicas_in_sync} "
                "per step), so learning-rate schedules would run that much "
                "faster. Create the optimizer inside the scope:\n"
                "    with strategy.scope():\n"
                "        model = build_model()\n"
                f"        model.compile(optimizer=keras.optimizers.{kind}(...), ...)\n"
                "or pass its name (optimizer='sgd'), which compile creates in "
                "the scope."
            )
    _warn_if_momentum_compounds(strategy, inner)
    if getattr(model, "jit_compile", False) is True:
        xla.check_supported(model, strategy)


def _worker_momentum_of(strategy) -> float:
    """The strategy's `worker_momentum` (a replica's under `PSStrategy`, a
    worker process's under `SyncReplicaStrategy`), 0 when off."""
    extended = strategy.extended
    sync = sync_training_of(strategy)
    return getattr(sync, "worker_momentum", 0.0) or extended.worker_momentum


def _warn_if_momentum_compounds(strategy, optimizer) -> None:
    """Warns when the optimizer keeps a momentum of the aggregate on top of
    the replicas' own (`worker_momentum`): the two compound."""
    beta = _worker_momentum_of(strategy)
    if not beta or optimizer is None:
        return
    kind = type(optimizer).__name__
    own = getattr(optimizer, "momentum", None)
    if isinstance(own, int | float) and own > 0:
        setting = f"momentum={own:g}"
        fix = (
            f"{kind}(learning_rate=lr * {1 / (1 - beta):g}) without momentum, "
            f"e.g. SGD(0.05, momentum={beta:g}) becomes SGD({0.05 / (1 - beta):g})"
        )
    else:
        own = getattr(optimizer, "beta_1", None)
        if not (isinstance(own, int | float) and own > 0):
            return
        setting = f"beta_1={own:g}"
        fix = f"{kind}(beta_1=0.0), which keeps its second moment"
    logging.warning(
        "worker_momentum=%g and %s(%s): the optimizer averages the aggregated "
        "momenta again, so the two momenta compound and each gradient acts "
        "over many more steps, late (training slows or swings). Keep one: "
        "%s (docs/byzantine.md, Worker momentum).",
        beta,
        kind,
        setting,
        fix,
    )


def _describe(strategy) -> str:
    if type(strategy).__name__ == "_DefaultDistributionStrategy":
        return "no strategy"
    return f"another strategy, {type(strategy).__name__}"
