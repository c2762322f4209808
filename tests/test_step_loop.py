"""Keras's loop over `steps_per_execution` steps runs each step as the loop's
body for a keras_psdist model (`integration/step_loop.py`): no branch around
the step, the same steps, batches, outputs and weights as Keras's loop."""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd

pytestmark = pytest.mark.timeout(300)


def _data(rows):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1))).astype("float32")
    return x, y


def _model(strategy_scope, initial=None, **compile_kwargs):
    with strategy_scope:
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(4), keras.layers.Dense(1)]
        )
        if initial is not None:
            model.set_weights(initial)
        model.compile(keras.optimizers.SGD(0.05), "mse", **compile_kwargs)
    return model


class StepGraphRecorder(keras.Model):
    """Records the names of the graphs the train step is traced inside."""

    seen: list = []

    def train_step(self, data):
        graph = tf.compat.v1.get_default_graph()
        names = []
        while graph is not None:
            names.append(getattr(graph, "name", ""))
            graph = getattr(graph, "outer_graph", None)
        StepGraphRecorder.seen.append(names)
        return super().train_step(data)


def _graphs_around_the_step(strategy):
    StepGraphRecorder.seen = []
    with strategy.scope():
        inputs = keras.Input((6,))
        model = StepGraphRecorder(
            inputs, keras.layers.Dense(1)(inputs), name="recorder"
        )
        model.compile(keras.optimizers.SGD(0.05), "mse", steps_per_execution=3)
    x, y = _data(48)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    return StepGraphRecorder.seen[-1]


def _between_step_and_loop(names):
    """The graphs between the step's own function and the loop's body."""
    step = next(i for i, n in enumerate(names) if "one_step_on_data" in n)
    body = next(i for i, n in enumerate(names) if "while_body" in n)
    return names[step + 1 : body]


def test_the_step_is_the_loops_body(cpu_devices):
    """Under a keras_psdist strategy no branch stands between the step and
    the loop (Keras's own loop puts the step in a `tf.cond`: on a cluster
    its predicate and pivot reach every ps task each step)."""
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:2], parameter_devices=cpu_devices[2:3]
    )
    assert _between_step_and_loop(_graphs_around_the_step(strategy)) == []


def test_other_strategies_keep_keras_loop():
    """The default strategy's model is built by Keras's own function: its
    step sits in Keras's branch."""
    between = _between_step_and_loop(
        _graphs_around_the_step(tf.distribute.get_strategy())
    )
    assert len(between) == 1 and "cond_true" in between[0]


@pytest.mark.parametrize("rows", [48, 56, 8])
@pytest.mark.parametrize("unrolled", [1, 2])
def test_fit_and_evaluate_match_one_device(cpu_devices, rows, unrolled):
    """Whole executions, a last shorter one (56 rows: 7 steps of 3 per call),
    and data that ends in the first call (8 rows: 1 step): the weights, the
    step counter, the losses and the evaluation match one device's. An
    unrolled loop (`unrolled_steps_per_execution=2`) is Keras's own."""
    x, y = _data(rows)
    initial = _model(contextlib.nullcontext()).get_weights()
    kwargs = {"steps_per_execution": 3}
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:1], parameter_devices=cpu_devices[1:2]
    )
    model = _model(strategy.scope(), initial, **kwargs)
    reference = _model(contextlib.nullcontext(), initial, **kwargs)
    for each in (model, reference):
        each.unrolled_steps_per_execution = unrolled
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    expected = reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(
        history.history["loss"], expected.history["loss"], rtol=1e-5
    )
    assert int(model.optimizer.iterations.numpy()) == int(
        reference.optimizer.iterations.numpy()
    )
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        model.evaluate(x, y, batch_size=8, verbose=0),
        reference.evaluate(x, y, batch_size=8, verbose=0),
        rtol=1e-5,
    )
