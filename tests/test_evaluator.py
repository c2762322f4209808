"""The side-car evaluator (`keras_psdist.SidecarEvaluator`) and its task.

In one process: checkpoints written by a training `fit`, the evaluator
following them. Across processes (`launch(evaluator=True)`):
`test_cluster_training.py::test_the_evaluator_evaluates_every_checkpoint_of_the_chief_once`.
"""

import json
import os
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import cluster

TF_CONFIG = {
    "cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
    "task": {"type": "evaluator", "index": 0},
}


def _build(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _data(n=96):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """3 epochs of 6 steps, a checkpoint per epoch; the weights after each."""
    directory = tmp_path_factory.mktemp("checkpoints")
    model, (x, y) = _build(), _data()
    after = []

    class Keep(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            after.append([w.numpy() for w in self.model.weights])

    model.fit(
        x,
        y,
        batch_size=16,
        epochs=3,
        verbose=0,
        callbacks=[
            keras.callbacks.ModelCheckpoint(
                str(directory / "epoch{epoch}.weights.h5"), save_weights_only=True
            ),
            Keep(),
        ],
    )
    return directory, after


def _expected(weights, x, y):
    model = _build(seed=1)
    model.set_weights(weights[: len(model.weights)])
    return model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)


def test_each_checkpoint_is_evaluated_once_in_order_at_its_step(trained):
    directory, after = trained
    x, y = _data()
    evaluator = kpd.SidecarEvaluator(
        _build(seed=1), (x, y), directory, max_evaluations=3, stop_file=None
    )
    evaluations = evaluator.start()
    assert [os.path.basename(e.checkpoint) for e in evaluations] == [
        "epoch1.weights.h5",
        "epoch2.weights.h5",
        "epoch3.weights.h5",
    ]
    assert [e.step for e in evaluations] == [6, 12, 18]
    # Each with the weights of its epoch (not the last ones).
    for evaluation, weights in zip(evaluations, after, strict=True):
        expected = _expected(weights, x, y)
        assert evaluation.results == pytest.approx(expected, rel=1e-6)
    assert evaluations[0].results != evaluations[2].results


def test_it_writes_tensorboard_scalars_at_each_step(trained, tmp_path):
    directory, _ = trained
    x, y = _data()
    kpd.SidecarEvaluator(
        _build(), (x, y), directory, log_dir=tmp_path, max_evaluations=3, stop_file=None
    ).start()
    seen = {}
    for path in (tmp_path / "evaluation").glob("events.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                seen.setdefault(value.tag, []).append(event.step)
    assert seen == {
        "evaluation_loss_vs_iterations": [6, 12, 18],
        "evaluation_accuracy_vs_iterations": [6, 12, 18],
    }


def test_the_stop_file_ends_it_after_the_checkpoints_written_before(trained, tmp_path):
    """As `launch --evaluator` ends it: checkpoints appear while it waits,
    then the stop file; none written before the stop file is missed."""
    source, _ = trained
    directory, stop = tmp_path / "ckpt", tmp_path / "training-ended"
    directory.mkdir()
    x, y = _data()
    evaluator = kpd.SidecarEvaluator(
        _build(), (x, y), directory, poll_s=0.05, stop_file=stop
    )
    thread = threading.Thread(target=evaluator.start)
    thread.start()
    for epoch in (1, 2, 3):
        data = (source / f"epoch{epoch}.weights.h5").read_bytes()
        partial = directory / f".epoch{epoch}.tmp"
        partial.write_bytes(data)
        partial.rename(directory / f"epoch{epoch}.weights.h5")
    stop.write_text("training ended\n")
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert [e.step for e in evaluator.evaluations] == [6, 12, 18]


def test_min_interval_evaluates_only_the_newest_checkpoint(trained, tmp_path):
    """Checkpoints faster than `min_interval_s`: the newest is evaluated,
    the superseded ones listed as skipped; the last one is never skipped."""
    directory, after = trained
    x, y = _data()
    evaluator = kpd.SidecarEvaluator(
        _build(seed=1),
        (x, y),
        directory,
        min_interval_s=3600,
        stop_file=tmp_path / "ended",
    )
    (tmp_path / "ended").write_text("")
    evaluations = evaluator.start()
    assert [e.step for e in evaluations] == [18]
    assert [os.path.basename(p) for p in evaluator.skipped] == [
        "epoch1.weights.h5",
        "epoch2.weights.h5",
    ]
    assert evaluations[0].results == pytest.approx(_expected(after[2], x, y), rel=1e-6)


def test_the_stop_file_from_the_launcher_s_environment(monkeypatch, tmp_path):
    stop = tmp_path / "training-ended"
    stop.write_text("")
    monkeypatch.setenv("KERAS_PSDIST_EVALUATOR_STOP_FILE", str(stop))
    x, y = _data()
    # Nothing to evaluate, training already ended: it returns at once.
    assert kpd.SidecarEvaluator(_build(), (x, y), tmp_path).start() == []


def test_idle_timeout_ends_it(tmp_path):
    x, y = _data()
    evaluator = kpd.SidecarEvaluator(
        _build(), (x, y), tmp_path, idle_timeout_s=0.2, poll_s=0.05, stop_file=None
    )
    assert evaluator.start() == []


def test_a_checkpoint_of_another_model_is_a_clear_error(tmp_path):
    other = keras.Sequential([keras.Input((8,)), keras.layers.Dense(5)])
    other.compile("adam", "mse")
    other.save_weights(str(tmp_path / "other.weights.h5"))
    x, y = _data()
    evaluator = kpd.SidecarEvaluator(
        _build(), (x, y), tmp_path, poll_s=0.01, idle_timeout_s=30, stop_file=None
    )
    with pytest.raises(ValueError, match="cannot load checkpoint .*other.weights.h5"):
        evaluator.start()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"model": "model"}, "must be a Keras model .* Received: str"),
        ({"model": "uncompiled"}, "not compiled: compile it"),
        ({"checkpoint_dir": 3}, "`checkpoint_dir` must be .* Received: 3"),
        ({"max_evaluations": 0}, "`max_evaluations` must be an integer >= 1"),
        (
            {"steps": 1.5},
            r"`steps` must be an integer >= 1 or None. Received: steps=1.5",
        ),
        ({"poll_s": 0}, "`poll_s` must be a number of seconds > 0"),
        ({"poll_s": None}, "`poll_s` must be a number of seconds > 0. Received"),
        ({"min_interval_s": -1}, "`min_interval_s` must be a number of seconds >= 0"),
        ({"idle_timeout_s": "1"}, "`idle_timeout_s` must be a number of seconds"),
    ],
)
def test_bad_arguments_are_named(kwargs, match, tmp_path):
    args = {"model": _build(), "data": _data(), "checkpoint_dir": tmp_path}
    if kwargs.get("model") == "uncompiled":
        kwargs = {"model": keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        kpd.SidecarEvaluator(**args)


# ------------------------------------------------------------- the task


def test_the_evaluator_task_in_tf_config():
    config = cluster.from_tf_config(TF_CONFIG)
    assert config.is_evaluator and not config.is_chief
    assert config.task_name == "evaluator:0"
    assert cluster.from_tf_config(config.to_tf_config()) == config
    # TensorFlow's test clusters list it in "cluster" too: it is not a
    # training job (no server, no device of it in any spec).
    listed = dict(TF_CONFIG, cluster={**TF_CONFIG["cluster"], "evaluator": ["h:9"]})
    config = cluster.from_tf_config(listed)
    assert config.is_evaluator and "evaluator" not in config.cluster_spec().jobs
    with pytest.raises(ValueError, match="no address: it is outside"):
        _ = config.task_address


@pytest.mark.parametrize(
    "value, match",
    [
        (dict(TF_CONFIG, task={"type": "evaluator", "index": 1}), "must have index 0"),
        (
            dict(
                TF_CONFIG, cluster={**TF_CONFIG["cluster"], "evaluator": ["a:1", "b:2"]}
            ),
            "lists 2 evaluator tasks; a job has at most one",
        ),
        (
            dict(TF_CONFIG, cluster={**TF_CONFIG["cluster"], "evaluator": "a:1"}),
            "'evaluator' must be a list",
        ),
    ],
)
def test_bad_evaluator_tasks_are_named(value, match):
    with pytest.raises(ValueError, match=match):
        cluster.from_tf_config(value)


def test_is_evaluator_reads_tf_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(TF_CONFIG))
    assert cluster.is_evaluator()
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps(dict(TF_CONFIG, task={"type": "worker", "index": 0}))
    )
    assert not cluster.is_evaluator()
    monkeypatch.delenv("TF_CONFIG")
    assert not cluster.is_evaluator()


@pytest.mark.parametrize("make", [kpd.PSStrategy, kpd.SyncReplicaStrategy])
def test_a_strategy_on_the_evaluator_is_refused_with_the_fix(make, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(TF_CONFIG))
    kwargs = {} if make is kpd.SyncReplicaStrategy else {"mode": "between-graph"}
    with pytest.raises(
        ValueError, match="this process is the evaluator .*SidecarEvaluator"
    ):
        make(**kwargs)
