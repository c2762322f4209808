"""`PSStrategy(dense=...)`: replicated, all-reduced dense variables beside
parameter-server ones (the Parallax hybrid; `keras_psdist.dense_choice`).

The Keras contract (`test_keras_contract.py`, kind `ps_all_reduce`) checks
fit / evaluate / predict, exactness against one device, saving and loading
without the library under the hybrid; these tests check what is particular to
it: which variable goes where, that the copies stay equal, that sparse
gradients stay sparse, and the errors.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist.variables import row_separable
from keras_psdist.variables.values import ReplicatedVariable

NUM_REPLICAS = 4


def wide_and_deep(vocab=200, dim=4, hidden=16, seed=0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    ids = keras.Input((6,), dtype="int32")
    embedded = keras.layers.GlobalAveragePooling1D()(
        keras.layers.Embedding(vocab, dim)(ids)
    )
    hidden_layer = keras.layers.Dense(hidden, activation="relu")(embedded)
    return keras.Model(ids, keras.layers.Dense(3)(hidden_layer))


def ids_data(n=256, vocab=200, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab, size=(n, 6)).astype(np.int32)
    y = (x[:, 0] % 3).astype(np.int32)
    return x, y


def compile_model(model, optimizer=None):
    model.compile(
        optimizer=optimizer or keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def copies_of(model):
    """`{path: [copy values]}` for every replicated weight of `model`."""
    out = {}
    for weight in model.weights:
        value = weight.value
        if isinstance(value, ReplicatedVariable):
            out[weight.path] = [c.numpy() for c in value.values]
    return out


def test_dense_variables_replicated_embedding_on_ps(cpu_devices):
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS], dense="all_reduce")
    with strategy.scope():
        model = compile_model(wide_and_deep())
    x, y = ids_data()
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)

    placement = strategy.extended.placement
    embedding, kernel = model.weights[0].path, model.weights[1].path
    assert placement.synchronizer_of(embedding) == "ps"
    assert placement.synchronizer_of(kernel) == "all_reduce"
    replicated = {row.name: row for row in placement.replicated()}
    assert set(replicated[kernel].replicas) == {
        tf.DeviceSpec.from_string(d).to_string()
        for d in strategy.extended.worker_devices
    }
    # Adam's slots follow their variable: replicated with it, or on the ps.
    slots = [r for r in placement.variables if r.slot_of is not None]
    assert slots
    for slot in slots:
        assert slot.synchronizer == placement.synchronizer_of(slot.slot_of)
    # Non-trainable state stays on the parameter device.
    iterations = model.optimizer.iterations.path
    assert placement.synchronizer_of(iterations) == "ps"
    assert "all-reduced, one copy on each of 4 replicas" in str(placement)


def test_copies_stay_equal_under_a_robust_rule_and_worker_momentum(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:NUM_REPLICAS],
        dense="all_reduce",
        aggregator="trimmed_mean",
        num_byzantine=1,
        worker_momentum=0.9,
    )
    with strategy.scope():
        model = compile_model(wide_and_deep())
    x, y = ids_data()
    before = copies_of(model)
    history = model.fit(x, y, batch_size=64, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    after = copies_of(model)
    assert len(after) == 4  # two Dense layers, kernel and bias
    for path, values in after.items():
        assert not np.allclose(values[0], before[path][0]), path
        for copy in values[1:]:
            np.testing.assert_array_equal(copy, values[0], err_msg=path)


def test_replicated_embedding_gets_sparse_updates(cpu_devices, monkeypatch):
    """A table the chooser replicates is updated with `IndexedSlices` on each
    copy (never a dense `[vocab, dim]` gradient), and matches one device."""
    seen = []
    update_step = row_separable.optimizer_update_step

    def spy(variable, gradient, *args, **kwargs):
        seen.append((variable.name, type(gradient).__name__))
        return update_step(variable, gradient, *args, **kwargs)

    monkeypatch.setattr(row_separable, "optimizer_update_step", spy)
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:NUM_REPLICAS],
        dense=lambda name, shape, dtype: "all_reduce",
    )
    with strategy.scope():
        model = compile_model(wide_and_deep(), keras.optimizers.SGD(0.5))
    initial = model.get_weights()
    x, y = ids_data()
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)

    table = model.weights[0].path
    assert strategy.extended.placement.synchronizer_of(table) == "all_reduce"
    kinds = {kind for name, kind in seen if "embeddings" in name}
    assert kinds == {"IndexedSlices"}
    copies = copies_of(model)[table]
    for copy in copies[1:]:
        np.testing.assert_array_equal(copy, copies[0])

    reference = compile_model(wide_and_deep(), keras.optimizers.SGD(0.5))
    reference.set_weights(initial)
    reference.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_checkpoint_moves_between_hybrid_and_ps_only(cpu_devices, tmp_path):
    devices = cpu_devices[:NUM_REPLICAS]
    hybrid = kpd.PSStrategy(devices=devices, dense="all_reduce")
    with hybrid.scope():
        model = compile_model(wide_and_deep())
    x, y = ids_data()
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))

    plain = kpd.PSStrategy(devices=devices)
    with plain.scope():
        restored = compile_model(wide_and_deep(seed=1))
    tf.train.Checkpoint(model=restored).restore(
        path
    ).assert_existing_objects_matched().expect_partial()
    for got, want in zip(restored.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)

    # And back: every copy of a replicated variable takes the restored value.
    path = tf.train.Checkpoint(model=restored).save(str(tmp_path / "back"))
    with hybrid.scope():
        again = compile_model(wide_and_deep(seed=2))
    tf.train.Checkpoint(model=again).restore(
        path
    ).assert_existing_objects_matched().expect_partial()
    for values in copies_of(again).values():
        for copy in values[1:]:
            np.testing.assert_array_equal(copy, values[0])
    for got, want in zip(again.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_plain_tf_variables_follow_the_chooser(cpu_devices):
    """A custom loop's `tf.Variable` (trainable=None, which means True) is
    replicated like a Keras weight; trainable=False stays on the ps."""
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS], dense="all_reduce")
    with strategy.scope():
        kernel = tf.Variable(tf.ones([3, 2]), name="kernel")
        frozen = tf.Variable(tf.ones([3, 2]), name="frozen", trainable=False)
    assert isinstance(kernel, ReplicatedVariable)
    assert len(kernel.values) == NUM_REPLICAS
    assert not isinstance(frozen, ReplicatedVariable)


def test_auto_keeps_variables_on_ps_where_replicas_share_memory(cpu_devices):
    """4 logical CPUs of one process: no byte would be saved (measured in
    benchmarks/hybrid.py: replicating is 1.09x slower here)."""
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS], dense="auto")
    with strategy.scope():
        model = compile_model(wide_and_deep())
    assert not strategy.extended.placement.replicated()
    decisions = {d.name: d for d in strategy.extended.dense_decisions}
    kernel = decisions[model.weights[1].path]
    assert kernel.choice == "ps" and "share memory" in kernel.reason
    table = decisions[model.weights[0].path]
    assert table.choice == "ps" and "embedding table" in table.reason


def test_auto_keeps_variables_on_ps_under_a_robust_rule(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:NUM_REPLICAS],
        dense="auto",
        aggregator="median",
        num_byzantine=1,
    )
    with strategy.scope():
        compile_model(wide_and_deep())
    reasons = {d.reason for d in strategy.extended.dense_decisions}
    assert strategy.extended.dense_decisions
    assert all("not the plain mean" in r or "embedding" in r for r in reasons)


def test_a_callable_overrides_auto_per_variable(cpu_devices):
    """The callable decides some variables and hands the rest to "auto"."""

    def choose(name, shape, dtype):
        # The hidden layer's kernel (dim 4 x hidden 16): replicated.
        return "all_reduce" if tuple(shape) == (4, 16) else "auto"

    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS], dense=choose)
    with strategy.scope():
        model = compile_model(wide_and_deep())
    kernel, head = model.weights[1].path, model.weights[3].path
    replicated = strategy.extended.placement.replicated()
    assert [r.name for r in replicated if r.slot_of is None] == [kernel]
    decided = {d.name: d.choice for d in strategy.extended.dense_decisions}
    assert kernel not in decided
    assert decided[head] == "ps"  # auto: logical CPUs share memory


@pytest.mark.parametrize(
    "compute, parameter, expected",
    [
        # GPUs of one host: a replicated variable is read from the GPU itself.
        (["/gpu:0", "/gpu:1"], ["/cpu:0"], "all_reduce"),
        # Worker tasks and ps tasks: every read crosses the network.
        (
            ["/job:worker/task:0/cpu:0", "/job:worker/task:1/cpu:0"],
            ["/job:ps/task:0/cpu:0"],
            "all_reduce",
        ),
        (["/cpu:0", "/cpu:1"], ["/cpu:0"], "ps"),
        (["/gpu:0"], ["/cpu:0"], "ps"),  # one replica
    ],
)
def test_auto_counts_bytes_by_topology(compute, parameter, expected):
    from keras_psdist.dense_choice import AutoChoice

    choose = AutoChoice(compute, parameter, plain_mean=True)
    assert choose("dense/kernel", tf.TensorShape([512, 512]), tf.float32) == expected
    assert choose("embedding/embeddings", tf.TensorShape([9, 4]), tf.float32) == "ps"
    assert [d.choice for d in choose.decisions] == [expected, "ps"]
    between = AutoChoice(compute, parameter, plain_mean=True, between_graph=True)
    assert between("dense/kernel", tf.TensorShape([4]), tf.float32) == "ps"


@pytest.mark.parametrize(
    "dense, message",
    [
        (
            "mirrored",
            "Unknown dense='mirrored'. Expected one of: 'ps', 'all_reduce', 'auto'",
        ),
        (3, "Unknown dense=3"),
    ],
)
def test_unknown_dense_choice_is_refused(dense, message):
    with pytest.raises(ValueError, match=message):
        kpd.PSStrategy(dense=dense)


@pytest.mark.parametrize(
    "dense",
    [
        {"class_name": "all_reduce"},
        {"class_name": "all_reduce", "config": {}},
        "dense_all_reduce_instance",
    ],
)
def test_dense_choice_by_config_or_instance(cpu_devices, dense):
    from keras_psdist import dense_choice

    if dense == "dense_all_reduce_instance":
        dense = dense_choice.DenseAllReduce()
    strategy = kpd.PSStrategy(devices=cpu_devices[:2], dense=dense)
    with strategy.scope():
        model = compile_model(wide_and_deep())
    placement = strategy.extended.placement
    assert placement.synchronizer_of(model.weights[0].path) == "ps"
    assert placement.synchronizer_of(model.weights[1].path) == "all_reduce"
    assert strategy.extended.all_reduce_ops is not None


def test_an_unbound_auto_choice_is_bound_to_each_strategy(cpu_devices):
    from keras_psdist import dense_choice

    auto = dense_choice.AutoChoice()
    first = kpd.PSStrategy(devices=cpu_devices[:2], dense=auto)
    second = kpd.PSStrategy(devices=cpu_devices[:3], dense=auto)
    with first.scope():
        compile_model(wide_and_deep())
    assert first.extended.dense_decisions
    assert not second.extended.dense_decisions and not auto.decisions
    # "ps" needs no all-reduce, whatever its spelling.
    plain = kpd.PSStrategy(devices=cpu_devices[:2], dense={"class_name": "ps"})
    assert plain.extended.all_reduce_ops is None


def test_a_registered_dense_choice_is_found_by_its_id(cpu_devices):
    from keras_psdist import dense_choice
    from keras_psdist.families import DENSE_CHOICES

    class HeadOnPS(dense_choice.DenseChoice):
        def __call__(self, name, shape, dtype):
            return "ps" if tuple(shape) == (16, 3) else "all_reduce"

    dense_choice.register("head_on_ps", HeadOnPS)
    try:
        strategy = kpd.PSStrategy(devices=cpu_devices[:2], dense="head_on_ps")
        with strategy.scope():
            model = compile_model(wide_and_deep())
        kernel, head = model.weights[1].path, model.weights[3].path
        placement = strategy.extended.placement
        assert placement.synchronizer_of(kernel) == "all_reduce"
        assert placement.synchronizer_of(head) == "ps"
        assert dense_choice.serialize(HeadOnPS()) == {
            "class_name": "head_on_ps",
            "config": {},
        }
    finally:
        DENSE_CHOICES.unregister("head_on_ps")
    with pytest.raises(ValueError, match="Unknown dense='head_on_ps'"):
        kpd.PSStrategy(dense="head_on_ps")


def test_the_old_module_name_still_works_with_a_warning():
    from keras_psdist import dense_choice

    with pytest.deprecated_call(match="keras_psdist.dense_choice"):
        from keras_psdist.synchronization import AutoChoice
    assert AutoChoice is dense_choice.AutoChoice
    with pytest.deprecated_call(match="Import get_chooser from"):
        assert kpd.synchronization.get_chooser is dense_choice.get_chooser
    with pytest.raises(AttributeError):
        kpd.synchronization.no_such_name  # noqa: B018


def test_chooser_answer_is_checked(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:2], dense=lambda name, shape, dtype: "mirror"
    )
    with pytest.raises(ValueError, match="returned 'mirror' for variable"):
        with strategy.scope():
            keras.layers.Dense(2).build((None, 3))


def test_between_graph_refuses_replicated_variables():
    with pytest.raises(ValueError, match="needs one client that sees every replica"):
        kpd.PSStrategy(mode="between-graph", dense="all_reduce")
    with pytest.raises(ValueError, match="needs one client that sees every replica"):
        kpd.PSStrategy(mode="between-graph", dense={"class_name": "all_reduce"})
    # The choices that keep every variable on the ps tasks pass that check
    # (and stop at the missing cluster), whatever their spelling.
    for dense in ("ps", {"class_name": "auto"}):
        with pytest.raises(ValueError, match="needs a cluster"):
            kpd.PSStrategy(mode="between-graph", dense=dense)


def test_mean_all_reduces_replicated_gradients_with_tf_cross_device_ops(
    cpu_devices, monkeypatch
):
    """Under the plain mean, the dense gradients go through TensorFlow's own
    all-reduce (NCCL among GPUs), not the aggregator; the table's sparse
    gradient through the aggregator."""
    from keras_psdist.distribute import all_reduce

    reduced = []
    call = all_reduce.ReplicatedAllReduce.__call__

    def spy(self, reduce_op, columns, destinations, shares):
        reduced.extend(tuple(c[0].shape) for c in columns)
        return call(self, reduce_op, columns, destinations, shares)

    monkeypatch.setattr(all_reduce.ReplicatedAllReduce, "__call__", spy)
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS], dense="all_reduce")
    with strategy.scope():
        model = compile_model(wide_and_deep(), keras.optimizers.SGD(0.5))
    initial = model.get_weights()
    x, y = ids_data()
    model.fit(x[:200], y[:200], batch_size=64, epochs=1, shuffle=False, verbose=0)
    # Every Dense weight's gradient (the table's is sparse: the aggregator's).
    dense_shapes = sorted(tuple(w.shape) for w in model.trainable_weights[1:])
    assert sorted(set(reduced)) == sorted(set(dense_shapes))
    ops = strategy.extended._all_reduce.cross_device_ops
    assert isinstance(ops, tf.distribute.CrossDeviceOps)

    # 200 examples in batches of 64: the last batch of 8 leaves 2 replicas
    # without data, and the weighting still gives the one-device weights.
    reference = compile_model(wide_and_deep(), keras.optimizers.SGD(0.5))
    reference.set_weights(initial)
    reference.fit(x[:200], y[:200], batch_size=64, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.multiprocess
@pytest.mark.hosts
def test_in_graph_cluster_replicates_on_workers_and_equals_one_process(
    cpu_devices, tmp_path
):
    """Chief + 3 workers + 1 ps: the dense layers are copied on the worker
    tasks, the table stays on the ps task, the gradients are all-reduced by
    TensorFlow's collective ops (3 tasks or more), every copy stays equal,
    and the weights are those of the same replicas in one process."""
    import importlib.util
    import json
    from pathlib import Path

    import launching  # tests/cluster_jobs, see conftest.py

    job_path = Path(__file__).parent / "cluster_jobs" / "hybrid_job.py"
    # Every task on a host of its own (a network namespace).
    with launching.cluster_hosts(1, 3, chief=True) as (_, hosts):
        code, log = launching.launch_job(
            job_path,
            [tmp_path],
            num_ps=1,
            num_workers=3,
            mode="in-graph",
            timeout_s=300,
            hosts=hosts,
        )
    assert code == 0, f"launch exited {code}:\n{log[-6000:]}"
    report = json.loads((tmp_path / "hybrid.json").read_text())
    assert report["copies_equal"]
    # Across 3 worker tasks, TensorFlow's collective all-reduce over gRPC.
    assert report["all_reduce"] == "CollectiveAllReduce"
    rows = {name: (sync, devices) for name, sync, devices in report["variables"]}
    table = next(name for name in rows if name.endswith("embeddings"))
    assert rows[table][0] == "ps"
    assert all("/job:ps/" in d for d in rows[table][1])
    kernels = [name for name in rows if name.endswith("kernel")]
    assert kernels
    for name in kernels:
        sync, devices = rows[name]
        assert sync == "all_reduce"
        assert sorted(d.split("/device")[0] for d in devices) == [
            "/job:worker/replica:0/task:0",
            "/job:worker/replica:0/task:1",
            "/job:worker/replica:0/task:2",
        ]

    spec = importlib.util.spec_from_file_location("hybrid_job", job_path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    model = job.build(kpd.PSStrategy(devices=cpu_devices[:3], dense="all_reduce"))
    job.train(model)
    weights = np.load(tmp_path / "weights.npz")
    for i, w in enumerate(model.weights):
        np.testing.assert_allclose(weights[f"arr_{i}"], w.numpy(), rtol=0, atol=1e-5)
