"""Gradient compression (`keras_psdist.compression`) and its stage in the
gradient path (`keras_psdist.gradients.Compression`).

The contract every compressor keeps (shapes and dtypes back after
decompress, the numpy reference, error feedback that loses nothing), what
random-k promises (the same coordinates on every replica, deterministic in
its seed), the stage in the path (its order, its state through variables,
where its ops run), and the strategy: training with each compressor,
composed with a robust rule, worker momentum and an attack, checkpointed
and resumed, and the errors for what it refuses.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import aggregators, attacks, compression, gradients, spelling
from keras_psdist.distribute.reduction import GradientReduction
from keras_psdist.gradients import Replicas
from tests import reference
from tests import reference_compression as ref

SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN

# Every built-in, built as the tests use it.
COMPRESSORS = {
    "none": compression.NoCompression(),
    "fp16": compression.FP16(),
    "bf16": compression.BF16(),
    "top_k": compression.TopK(ratio=0.3),
    "random_k": compression.RandomK(ratio=0.3, seed=5),
    "sign": compression.Sign(),
    "power_sgd": compression.PowerSGD(rank=2),
}
WITH_ERROR_FEEDBACK = ["top_k", "random_k", "sign", "power_sgd"]
SHAPES = [(1,), (7,), (4, 5), (2, 3, 4)]


def _reference(name, compressor, x, payload, state=None):
    if name == "power_sgd":
        return ref.power_sgd(x, np.asarray(state.q, np.float64))[:2]
    if name == "top_k":
        return ref.top_k(x, compressor.ratio)
    if name == "random_k":
        return ref.random_k(x, compressor.indices(payload).numpy())
    return getattr(ref, name)(x)


def test_every_builtin_is_tested():
    assert sorted(COMPRESSORS) == sorted(compression.names())


# ---------------------------------------------------------------- contract


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_decompress_gives_the_shape_and_dtype_and_the_numpy_reference(name, shape):
    compressor = COMPRESSORS[name]
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(np.float32)
    spec = tf.TensorSpec(shape, tf.float32)
    state = compressor.init(spec)
    if name == "power_sgd" and not compressor.compresses(spec):
        assert state == ()  # sent as it is, by the stage
        with pytest.raises(ValueError, match="as it is"):
            compressor.compress(tf.constant(x), state)
        return
    payload, residual = compressor.compress(tf.constant(x), state)
    sent = compressor.decompress(payload)
    assert sent.shape == shape and sent.dtype == tf.float32
    want_sent, want_residual = _reference(name, compressor, x, payload, state)
    if name == "power_sgd":
        residual = residual.residual
    rtol = 1e-2 if name == "bf16" else 1e-6
    atol = 1e-5 if name == "power_sgd" else 1e-7
    np.testing.assert_allclose(sent.numpy(), want_sent, rtol=rtol, atol=atol)
    if compressor.error_feedback:
        assert residual.shape == shape and residual.dtype == tf.float32
        np.testing.assert_allclose(residual.numpy(), want_residual, atol=1e-6)
    else:
        assert residual == ()


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_float64_values_come_back_as_float64(name):
    compressor = COMPRESSORS[name]
    x = tf.constant(np.linspace(-1, 1, 36).reshape(6, 6), tf.float64)
    spec = tf.TensorSpec([6, 6], tf.float64)
    payload, _ = compressor.compress(x, compressor.init(spec))
    assert compressor.decompress(payload).dtype == tf.float64


@pytest.mark.parametrize("name", WITH_ERROR_FEEDBACK)
def test_error_feedback_loses_nothing(name):
    """Over the steps, what was sent plus the residual is what came in."""
    compressor = COMPRESSORS[name]
    rng = np.random.default_rng(1)
    gradients_ = [rng.normal(size=(6, 5)).astype(np.float32) for _ in range(8)]
    residual = compressor.init(tf.TensorSpec([6, 5]))
    sent = []
    for step, g in enumerate(gradients_):
        payload, residual = compressor.compress(g, residual, step=step, key=2)
        sent.append(compressor.decompress(payload).numpy())
    if name == "power_sgd":
        residual = residual.residual
    np.testing.assert_allclose(
        np.sum(sent, axis=0) + residual.numpy(),
        np.sum(gradients_, axis=0),
        rtol=1e-5,
        atol=1e-5,
    )
    # Random-k's coordinates come from the implementation; PowerSGD's
    # reference keeps its own state (below).
    if name not in ("random_k", "power_sgd"):
        want_sent, want_residual = ref.with_error_feedback(
            lambda x: _reference(name, compressor, x, None), gradients_
        )
        np.testing.assert_allclose(sent, want_sent, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(residual.numpy(), want_residual, atol=1e-5)


def test_power_sgd_matches_numpy_over_steps_with_its_warm_start():
    compressor = compression.PowerSGD(rank=2, seed=3)
    rng = np.random.default_rng(4)
    gradients_ = [rng.normal(size=(8, 3, 2)).astype(np.float32) for _ in range(5)]
    state = compressor.init(tf.TensorSpec([8, 3, 2]))
    q = state.q.numpy().astype(np.float64)
    residual = np.zeros_like(gradients_[0])
    for g in gradients_:
        payload, state = compressor.compress(g, state)
        want, residual, q = ref.power_sgd(g + residual, q)
        np.testing.assert_allclose(
            compressor.decompress(payload).numpy(), want, atol=1e-4
        )
        np.testing.assert_allclose(state.residual.numpy(), residual, atol=1e-4)
        # The warm start, up to the signs QR gives the columns.
        np.testing.assert_allclose(np.abs(state.q.numpy()), np.abs(q), atol=1e-4)
    # Rank r exactly: a rank-2 gradient (no residual) is sent whole.
    exact = compression.PowerSGD(rank=2)
    g = rng.normal(size=(8, 2)) @ rng.normal(size=(2, 6))
    payload, state = exact.compress(
        tf.constant(g, tf.float32), exact.init(tf.TensorSpec([8, 6]))
    )
    np.testing.assert_allclose(exact.decompress(payload).numpy(), g, atol=1e-4)


@pytest.mark.parametrize("rank", [0, -1, 1.5, True, "2"])
def test_a_rank_below_1_is_refused(rank):
    with pytest.raises(
        ValueError, match=r"`rank` of power_sgd must be an int >= 1.*Received: rank="
    ):
        compression.get({"class_name": "power_sgd", "config": {"rank": rank}})


def test_fp16_and_bf16_within_their_precision():
    x = np.random.default_rng(2).normal(size=1000).astype(np.float32) * 10
    for compressor, bits in ((compression.FP16(), 11), (compression.BF16(), 8)):
        payload, _ = compressor.compress(tf.constant(x))
        got = compressor.decompress(payload).numpy()
        np.testing.assert_allclose(got, x, rtol=2.0**-bits)


def test_what_a_replica_sends_is_smaller():
    x = tf.random.stateless_normal([100, 40], seed=[1, 2])
    top_k, _ = compression.TopK(0.01).compress(x, tf.zeros_like(x))
    assert top_k.indices.shape == top_k.values.shape == [40]
    random_k, _ = compression.RandomK(0.01).compress(x, tf.zeros_like(x))
    assert random_k.values.shape == [40] and random_k.seed.shape == [2]
    sign, _ = compression.Sign().compress(x, tf.zeros_like(x))
    assert sign.bits.dtype == tf.uint8 and sign.bits.shape == [500]
    fp16, _ = compression.FP16().compress(x)
    assert fp16.value.dtype == tf.float16
    power_sgd = compression.PowerSGD(rank=2)
    low_rank, _ = power_sgd.compress(x, power_sgd.init(tf.TensorSpec([100, 40])))
    assert low_rank.p.shape == [100, 2] and low_rank.q.shape == [40, 2]


def test_random_k_keeps_the_same_coordinates_on_every_replica():
    compressor = COMPRESSORS["random_k"]
    rng = np.random.default_rng(3)
    masks = []
    for _ in range(4):  # four replicas, different values, one step
        x = tf.constant(rng.normal(size=(10, 10)).astype(np.float32))
        payload, _ = compressor.compress(x, tf.zeros_like(x), step=7, key=1)
        masks.append(compressor.decompress(payload).numpy() != 0)
        indices = compressor.indices(payload).numpy()
        assert len(set(indices.tolist())) == len(indices) == 30
        assert indices.min() >= 0 and indices.max() < 100
    for mask in masks[1:]:
        np.testing.assert_array_equal(mask, masks[0])


def test_random_k_is_deterministic_in_its_seed_step_and_variable():
    def drawn(seed, step, key):
        compressor = compression.RandomK(ratio=0.1, seed=seed)
        x = tf.ones([50])
        payload, _ = compressor.compress(x, tf.zeros_like(x), step=step, key=key)
        return sorted(compressor.indices(payload).numpy().tolist())

    assert drawn(5, 3, 0) == drawn(5, 3, 0)
    assert drawn(5, 3, 0) != drawn(6, 3, 0)
    assert drawn(5, 3, 0) != drawn(5, 4, 0)
    assert drawn(5, 3, 0) != drawn(5, 3, 1)


# ---------------------------------------------------------------- lookup


@pytest.mark.parametrize(
    "identifier, expected",
    [
        ("top_k", compression.TopK(0.01)),
        ("top_k(ratio=0.05)", compression.TopK(0.05)),
        ({"class_name": "random_k", "config": {"ratio": 0.1, "seed": 2}}, compression.RandomK(0.1, 2)),
        (compression.Sign(), compression.Sign()),
        ("fp16", compression.FP16()),
    ],
)  # fmt: skip
def test_get_takes_ids_strings_configs_and_instances(identifier, expected):
    got = compression.get(identifier)
    assert compression.serialize(got) == compression.serialize(expected)
    assert compression.serialize(
        compression.deserialize(compression.serialize(got))
    ) == (compression.serialize(expected))
    assert compression.get(None) is None


@pytest.mark.parametrize("ratio", [0, -0.1, 1.5, float("nan"), "0.1", True, None])
@pytest.mark.parametrize("name", ["top_k", "random_k"])
def test_a_ratio_outside_0_1_is_refused(name, ratio):
    with pytest.raises(ValueError, match=r"ratio.*\(0, 1\].*Received: ratio="):
        compression.get({"class_name": name, "config": {"ratio": ratio}})


@pytest.mark.parametrize(
    "identifier, message",
    [
        ("topk", "Unknown compressor 'topk'. Expected one of: none, fp16, bf16, top_k, random_k, sign, power_sgd. Did you mean 'top_k'?"),
        ({"class_name": "random_k", "config": {"seed": -1}}, "`seed` of random_k must be an int >= 0"),
        ({"class_name": "top_k", "config": {"k": 3}}, "unknown argument 'k'"),
        ("top_k(0.1)", "Cannot read the argument '0.1' of 'top_k'"),
        (compression.TopK, "Received the class TopK, not an instance"),
    ],
)  # fmt: skip
def test_bad_compressors_are_refused_naming_what_was_received(identifier, message):
    with pytest.raises(ValueError) as error:
        compression.get(identifier)
    assert message in str(error.value)


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_an_integer_value_is_refused(name):
    with pytest.raises(ValueError, match="floating-point gradients.*dtype int32"):
        COMPRESSORS[name].compress(tf.constant([1, 2, 3]))


# ---------------------------------------------------------------- spelling


def test_a_configuration_may_start_with_a_compressor():
    c = spelling.parse("top_k(ratio=0.01)>nnm>trimmed_mean+wm")
    assert c.compression == {"class_name": "top_k", "config": {"ratio": 0.01}}
    assert c.stages == ("nnm", "trimmed_mean") and c.worker_momentum == 0.9
    assert (
        spelling.spell_config(c.aggregator, c.worker_momentum, c.compression)
        == "top_k(ratio=0.01)>nnm>trimmed_mean+wm"
    )
    assert spelling.parse("sign>median").compression == "sign"
    assert spelling.parse("median").compression is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("median>top_k", "The compressor 'top_k' goes first in 'median>top_k'"),
        ("nnm>sign>median", "The compressor 'sign' goes first"),
        ("top_k>sign>median", "The compressor 'sign' goes first"),
        ("top_k(ratio=0.1)", "is a compressor (what each replica sends), and a configuration ends with a rule"),
    ],
)  # fmt: skip
def test_a_compressor_out_of_place_is_refused(text, message):
    with pytest.raises(ValueError) as error:
        spelling.parse(text)
    assert message in str(error.value)


def test_aggregators_get_refuses_the_strategys_compression():
    with pytest.raises(
        ValueError, match="starts with compression.*compression='top_k'"
    ):
        aggregators.get("top_k>median")


# ---------------------------------------------------------------- the stage

N = 4


def _columns(seed, n=N, shapes=((6,), (3, 4))):
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=(n, *s)).astype(np.float32) for s in shapes]
    return arrays, [[tf.constant(a[r]) for r in range(n)] for a in arrays]


def _specs(columns):
    return [tf.TensorSpec(c[0].shape, c[0].dtype) for c in columns]


@pytest.mark.parametrize("name", ["top_k", "random_k", "sign", "fp16"])
def test_the_stage_matches_numpy_over_steps_from_keras_sums(name):
    """Keras's 1/n-scaled SUM in, each replica's residual kept at true
    scale, the mean of what was sent out."""
    compressor = COMPRESSORS[name]
    path = gradients.chain(
        gradients.Compression(compressor, N), gradients.Rule(aggregators.Mean())
    )
    state = None
    residuals = None
    for step in range(3):
        arrays, columns = _columns(step)
        scaled = [[v / N for v in column] for column in columns]
        if state is None:
            state = path.init(_specs(columns))
            residuals = [np.zeros_like(a) for a in arrays]
        out, state = path.apply(Replicas(scaled, SUM), state)
        for v, (got, a) in enumerate(zip(out.values, arrays, strict=True)):
            sent = []
            for r in range(N):
                x = a[r] + residuals[v][r] if compressor.error_feedback else a[r]
                if name == "random_k":  # the coordinates of (step, v)
                    payload = compressor.encode(tf.constant(x), step, v)
                else:
                    payload = None
                s, residuals[v][r] = _reference(name, compressor, x, payload)
                sent.append(s)
            np.testing.assert_allclose(got.numpy(), np.mean(sent, axis=0), atol=1e-5)
        if compressor.error_feedback:
            for v, column in enumerate(state[0].residuals):
                got = np.stack([t.numpy() for t in column])
                np.testing.assert_allclose(got, residuals[v], atol=1e-5)


def test_power_sgd_state_through_variables_on_the_replicas_devices(cpu_devices):
    """Its state is a residual and a `Q` per replica and matrix (none for a
    vector, sent as it is); in place, through variables, the values of
    `apply`, every part on its replica's device."""
    compressor = compression.PowerSGD(rank=1)
    stage = gradients.Compression(compressor, N, cpu_devices[:N])
    path = gradients.chain(stage, gradients.Rule(aggregators.Mean()))
    arrays, columns = _columns(5, shapes=((8, 6), (6,)))
    state = path.init(_specs(columns))
    assert state[0].residuals[1] == ()
    devices = path.state_devices(state)[0].residuals[0]
    assert [d.q for d in devices] == cpu_devices[:N]
    variables = tf.nest.map_structure(
        lambda t, d: tf.Variable(t) if d is None else _on(d, t),
        state,
        path.state_devices(state),
    )
    for _ in range(2):
        want, state = path.apply(Replicas(columns, MEAN), state)
        got = path.apply_in_place(Replicas(columns, MEAN), variables)
        for a, b in zip(got.values, want.values, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
    for var, value in zip(
        tf.nest.flatten(variables), tf.nest.flatten(state), strict=True
    ):
        np.testing.assert_allclose(var.numpy(), value.numpy(), atol=1e-5)
    # The vector went through as it is: its mean.
    np.testing.assert_allclose(
        want.values[1].numpy(), arrays[1].mean(axis=0), atol=1e-6
    )


def _on(device, tensor):
    with tf.device(device):
        return tf.Variable(tensor)


def test_a_replica_without_data_keeps_its_residual():
    compressor = compression.TopK(0.5)
    path = gradients.chain(
        gradients.Compression(compressor, N), gradients.Rule(aggregators.Mean())
    )
    _, columns = _columns(0, shapes=((4,),))
    state = path.init(_specs(columns))
    _, state = path.apply(Replicas(columns, MEAN), state)
    before = [t.numpy() for t in state[0].residuals[0]]
    columns[0][-1] = tf.fill([4], np.nan)  # no data: NaN
    shares = [tf.constant(s) for s in (0.5, 0.25, 0.25, 0.0)]
    out, state = path.apply(Replicas(columns, MEAN, shares), state)
    np.testing.assert_array_equal(state[0].residuals[0][-1].numpy(), before[-1])
    assert np.all(np.isfinite(out.values[0].numpy()))


def test_sparse_and_integer_values_pass_uncompressed():
    compressor = compression.Sign()
    stage = gradients.Compression(compressor, 2)
    sparse = [
        tf.IndexedSlices(tf.ones([2, 3]) * r, tf.constant([0, 4]), tf.constant([5, 3]))
        for r in (1.0, 2.0)
    ]
    ints = [tf.constant([1, 2]), tf.constant([3, 4])]
    dense = [tf.constant([1.0, -2.0]), tf.constant([3.0, 4.0])]
    columns = [sparse, ints, dense]
    specs = [tf.TensorSpec([None, 3]), tf.TensorSpec([2], tf.int32), tf.TensorSpec([2])]
    state = stage.init(specs)
    assert state.residuals[0] == () and state.residuals[1] == ()
    out, _ = stage.apply(Replicas(columns, SUM), state)
    assert isinstance(out.values[0][1], tf.IndexedSlices)
    np.testing.assert_array_equal(out.values[0][1].values.numpy(), 4 * np.ones([2, 3]))
    np.testing.assert_array_equal(out.values[1][1].numpy(), [6, 8])
    # True scale [2, -4]: mean magnitude 3.
    np.testing.assert_allclose(out.values[2][0].numpy(), [3.0, -3.0])


def test_the_path_order_is_momentum_compression_attack_pre_aggregation_rule():
    rule = aggregators.get("nnm>krum").bind(6, 1)
    path = gradients.gradient_path(
        rule,
        num_replicas=6,
        worker_momentum=0.9,
        attack=attacks.SignFlip(replicas=[5]),
        compression=compression.TopK(0.1),
    )
    assert [type(s) for s in path.stages] == [
        gradients.Momentum,
        gradients.Compression,
        gradients.Attacked,
        gradients.Transform,
        gradients.Rule,
    ]
    assert not gradients.is_plain_mean(path)


def test_the_compress_ops_run_on_the_replicas_devices(cpu_devices):
    """What makes it save bytes: compress (top-k, the gather of the values,
    the residual's update) on each replica's device, decompress (the
    scatter) on the reduction device; the residuals live on the replicas'
    devices."""
    replicas, reduction_device = cpu_devices[:4], cpu_devices[4]
    reduction = GradientReduction(
        aggregators.get("geometric_median").bind(4, 1),
        None,
        reduction_device,
        4,
        compression=compression.TopK(0.25),
        compute_devices=replicas,
    )

    @tf.function
    def step():
        columns = []
        for shape in ((8, 3), (3,)):
            column = []
            for device in replicas:
                with tf.device(device):
                    column.append(tf.random.normal(shape))
            columns.append(column)
        return reduction(SUM, columns, None)

    graph = step.get_concrete_function().graph
    index = lambda name: tf.DeviceSpec.from_string(name).device_index  # noqa: E731
    wanted = sorted(index(d) for d in replicas for _ in range(2))

    def placed(op_type):
        return sorted(
            index(op.device) for op in graph.get_operations() if op.type == op_type
        )

    assert placed("TopKV2") == wanted
    assert placed("TensorScatterUpdate") == wanted  # the residual
    assert placed("ScatterNd") == [index(reduction_device)] * 8
    residuals = reduction.state.kept
    assert sorted(index(v.device) for v in residuals) == wanted
    step()  # and it runs
    assert any(np.any(v.numpy() != 0) for v in residuals)


def test_through_the_strategy_the_compress_ops_run_on_the_replicas(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4],
        parameter_devices=cpu_devices[4:5],
        compression="top_k(ratio=0.25)",
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])

    @tf.function
    def step(x):
        def replica_fn(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            return tf.distribute.get_replica_context().all_reduce("sum", grads)

        return strategy.run(replica_fn, args=(x,))

    graph = step.get_concrete_function(tf.TensorSpec([2, 8])).graph
    index = lambda name: tf.DeviceSpec.from_string(name).device_index  # noqa: E731
    placed = sorted(
        index(op.device) for op in graph.get_operations() if op.type == "TopKV2"
    )
    assert placed == sorted([0, 1, 2, 3] * 2)
    scatters = {
        index(op.device) for op in graph.get_operations() if op.type == "ScatterNd"
    }
    assert scatters == {4}


# ---------------------------------------------------------------- strategies


def _blobs(seed=0, n=1280, classes=10, dim=32):
    """Gaussian blobs, a digits-like task made here: 10 classes in 32 dims,
    close enough that 4 epochs reach about 0.84 (1 epoch: about 0.5), so a
    compressor that slows training shows."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, dim)).astype(np.float32) * 0.6
    y = rng.integers(0, classes, size=n).astype(np.int32)
    x = centers[y] + rng.normal(size=(n, dim)).astype(np.float32)
    return (x[:1024], y[:1024]), (x[1024:], y[1024:])


def _mlp(strategy, dim=32):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((dim,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    return model


def _accuracy(strategy, epochs=4):
    (x, y), (x_test, y_test) = _blobs()
    model = _mlp(strategy)
    model.fit(x, y, batch_size=64, epochs=epochs, shuffle=False, verbose=0)
    return model.evaluate(x_test, y_test, verbose=0, return_dict=True)["accuracy"]


@pytest.fixture(scope="module")
def uncompressed_accuracy(cpu_devices):
    return _accuracy(kpd.PSStrategy(devices=cpu_devices[:4]))


@pytest.mark.parametrize(
    "identifier",
    [
        "fp16",
        "bf16",
        "top_k(ratio=0.1)",
        "random_k(ratio=0.25)",
        "sign",
        "power_sgd(rank=2)",
    ],
)
def test_each_compressor_trains_near_the_uncompressed_accuracy(
    cpu_devices, uncompressed_accuracy, identifier
):
    strategy = kpd.PSStrategy(devices=cpu_devices[:4], compression=identifier)
    assert strategy.extended.compression is not None
    accuracy = _accuracy(strategy)
    assert uncompressed_accuracy > 0.75
    assert accuracy >= uncompressed_accuracy - 0.05, (identifier, accuracy)


def test_none_is_no_compression(cpu_devices):
    strategy = kpd.PSStrategy(devices=cpu_devices[:2], compression="none")
    assert strategy.extended.compression is None
    assert strategy.extended._reduction.is_plain_mean


def test_compression_composes_with_a_robust_rule_momentum_and_an_attack(
    cpu_devices,
):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:5],
        aggregator="top_k(ratio=0.2)>trimmed_mean+wm",
        num_byzantine=1,
        attack=attacks.SignFlip(replicas=[4], scale=10.0),
    )
    assert "compression=TopK(ratio=0.2)" in repr(strategy)
    stages = strategy.extended._reduction.path.stages
    assert [type(s) for s in stages] == [
        gradients.Momentum,
        gradients.Compression,
        gradients.Attacked,
        gradients.Rule,
    ]
    # That it trains, within 3 points of the same defence uncompressed, under
    # the same attack (the replicas' momenta compressed at the leader's
    # coordinates, then attacked, then the trimmed mean): test_combinations.py's
    # `test_top_k_with_worker_momentum_before_a_coordinatewise_rule`.


def test_the_string_and_the_argument_must_agree(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:2],
        aggregator="top_k(ratio=0.05)>mean",
        compression={"class_name": "top_k", "config": {"ratio": 0.05}},
    )
    assert strategy.extended.compression.ratio == 0.05
    with pytest.raises(ValueError, match="Set it in one place"):
        kpd.PSStrategy(
            devices=cpu_devices[:2], aggregator="sign>mean", compression="fp16"
        )
    with pytest.raises(ValueError, match=r"ratio.*Received: ratio=0"):
        kpd.PSStrategy(devices=cpu_devices[:2], compression="top_k(ratio=0)")
    with pytest.raises(ValueError, match="Unknown compressor 'topk'"):
        kpd.PSStrategy(devices=cpu_devices[:2], compression="topk")


def test_sync_replicas_take_compression():
    """Accepted (it then needs a cluster, as without compression)."""
    with pytest.raises(ValueError, match="needs a cluster") as error:
        kpd.SyncReplicaStrategy(compression="top_k")
    assert "not supported" not in str(error.value)


def test_between_graph_takes_compression():
    """Accepted (it then needs a cluster, as without compression)."""
    with pytest.raises(ValueError, match="needs a cluster") as error:
        kpd.PSStrategy(mode="between-graph", compression="fp16")
    assert "not supported" not in str(error.value)


# ------------------------------------------- between graphs: on the wire


def _device(name):
    spec = tf.DeviceSpec.from_string(name)
    return spec.device_type, spec.device_index


def _wire(identifier, device, destination):
    from keras_psdist.gradients.wire import WireCompression

    return WireCompression(compression.get(identifier), device, lambda _: destination)


def test_wire_sends_with_error_feedback_as_the_reference(cpu_devices):
    """Over steps, what reaches the variable is top-k with error feedback of
    the worker's gradients (numpy reference); the residual stays on the
    worker's device."""
    rng = np.random.default_rng(0)
    gradients = [rng.normal(size=(6, 5)).astype(np.float32) for _ in range(4)]
    wire = _wire("top_k(ratio=0.2)", cpu_devices[0], cpu_devices[1])
    variable = tf.Variable(tf.zeros([6, 5]))
    sent = [wire([(tf.constant(g), variable)])[0][0].numpy() for g in gradients]
    expected, residual = ref.with_error_feedback(lambda x: ref.top_k(x, 0.2), gradients)
    for a, e in zip(sent, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-6)
    [kept] = wire.state.kept
    np.testing.assert_allclose(kept.numpy(), residual, rtol=1e-5, atol=1e-6)
    assert _device(kept.device) == _device(cpu_devices[0])


def test_wire_compresses_on_the_worker_and_decompresses_on_the_variables_device(
    cpu_devices,
):
    """In a step graph: the top-k runs on the worker's device, the scatter
    that rebuilds the dense gradient on the variable's; sparse and integer
    values pass as they are."""
    worker, ps = cpu_devices[0], cpu_devices[1]
    wire = _wire("top_k(ratio=0.1)", worker, ps)
    dense = tf.Variable(tf.zeros([40, 8]))
    table = tf.Variable(tf.zeros([10, 4]))

    @tf.function
    def step(g, rows):
        sparse = tf.IndexedSlices(rows, tf.constant([1, 3]), tf.constant([10, 4]))
        out = wire([(g, dense), (sparse, table)])
        return out[0][0], out[1][0].values

    graph = step.get_concrete_function(
        tf.TensorSpec([40, 8]), tf.TensorSpec([2, 4])
    ).graph
    devices = {op.type: _device(op.device) for op in graph.get_operations()}
    assert devices["TopKV2"] == _device(worker)
    assert devices["ScatterNd"] == _device(ps)
    g = np.random.default_rng(1).normal(size=(40, 8)).astype(np.float32)
    dense_out, rows_out = step(tf.constant(g), tf.ones([2, 4]))
    assert np.count_nonzero(dense_out.numpy()) == 32  # 10% of 320
    np.testing.assert_array_equal(rows_out.numpy(), np.ones([2, 4]))
    assert len(wire.state.kept) == 1  # the dense variable's residual only


@pytest.mark.parametrize("identifier", ["random_k(ratio=0.25)", "power_sgd(rank=1)"])
def test_wire_state_restores_from_a_checkpoint(cpu_devices, tmp_path, identifier):
    """The residuals (random-k's step, PowerSGD's factors) restored into a
    fresh wire give the uninterrupted run's next payload."""
    rng = np.random.default_rng(2)
    gradients = [
        tf.constant(rng.normal(size=(8, 6)).astype(np.float32)) for _ in range(3)
    ]
    variable = tf.Variable(tf.zeros([8, 6]))

    def run(wire, gs):
        return [wire([(g, variable)])[0][0].numpy() for g in gs]

    straight = _wire(identifier, cpu_devices[0], cpu_devices[1])
    expected = run(straight, gradients)[-1]
    first = _wire(identifier, cpu_devices[0], cpu_devices[1])
    run(first, gradients[:2])
    path = tf.train.Checkpoint(state=first.state).save(str(tmp_path / "wire"))
    resumed = _wire(identifier, cpu_devices[0], cpu_devices[1])
    tf.train.Checkpoint(state=resumed.state).restore(path)
    np.testing.assert_allclose(run(resumed, gradients[2:])[0], expected, atol=1e-5)
    fresh = _wire(identifier, cpu_devices[0], cpu_devices[1])
    assert not np.allclose(run(fresh, gradients[2:])[0], expected, atol=1e-5)


def _one_step(strategy, model, x, y):
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


@pytest.mark.parametrize(
    "identifier", ["top_k(ratio=0.05)", "random_k(ratio=0.1)", "power_sgd(rank=1)"]
)
def test_a_checkpoint_restores_the_residuals(cpu_devices, tmp_path, identifier):
    """Restored into a fresh strategy, the next step's update is the
    uninterrupted run's; without the residuals (and the step) it is not."""
    (x, y), _ = _blobs(1)
    make = lambda: kpd.PSStrategy(devices=cpu_devices[:4], compression=identifier)  # noqa: E731
    straight = make()
    model = _mlp(straight)
    model.fit(x[:512], y[:512], batch_size=64, epochs=1, shuffle=False, verbose=0)
    weights = model.get_weights()
    path = tf.train.Checkpoint(aggregation=straight.extended.training_state).write(
        str(tmp_path / "ckpt")
    )
    want = _one_step(straight, model, x[512:576], y[512:576])

    resumed = make()
    model = _mlp(resumed)
    model.set_weights(weights)
    tf.train.Checkpoint(aggregation=resumed.extended.training_state).read(path)
    got = _one_step(resumed, model, x[512:576], y[512:576])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    forgetful = make()  # the weights, not the residuals
    model = _mlp(forgetful)
    model.set_weights(weights)
    without = _one_step(forgetful, model, x[512:576], y[512:576])
    assert max(np.max(np.abs(a - b)) for a, b in zip(without, want, strict=True)) > 1e-4


class _Interrupted(Exception):
    pass


class _InterruptAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise _Interrupted


def test_backup_and_restore_resumes_the_residuals(cpu_devices, tmp_path):
    (x, y), _ = _blobs(2)
    x, y = x[:384], y[:384]

    def train(callbacks=()):
        strategy = kpd.PSStrategy(devices=cpu_devices[:4], compression="sign")
        model = _mlp(strategy)
        model.fit(
            x,
            y,
            batch_size=64,
            epochs=3,
            shuffle=False,
            verbose=0,
            callbacks=list(callbacks),
        )
        return strategy, model

    straight, straight_model = train()
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    with pytest.raises(_Interrupted):
        train([backup, _InterruptAt(2)])
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    resumed, resumed_model = train([backup])
    state = [v.numpy() for v in straight.extended.training_state.variables]
    assert state and all(np.any(s != 0) for s in state)
    for a, b in zip(
        [v.numpy() for v in resumed.extended.training_state.variables],
        state,
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(
        resumed_model.get_weights(), straight_model.get_weights(), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_robust_rule_on_compressed_values_matches_its_reference():
    """The rule sees exactly the decompressed values: the geometric median
    over each replica's own top-k."""
    arrays, columns = _columns(4, n=5)
    rule = aggregators.get("geometric_median").bind(5, 1)
    compressor = compression.TopK(0.5)
    path = gradients.gradient_path(rule, num_replicas=5, compression=compressor)
    out, _ = path.apply(Replicas(columns, MEAN), path.init(_specs(columns)))
    sent = [np.stack([ref.top_k(a[r], 0.5)[0] for r in range(5)]) for a in arrays]
    for got, want in zip(
        out.values, reference.geometric_median(sent, f=1), strict=True
    ):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)


def test_a_coordinatewise_rule_sees_every_replica_at_the_leaders_top_k():
    """Before the trimmed mean, top-k's coordinates are the step's leader's
    (replica `step mod n`) for every replica; over three steps each replica
    keeps the rest in its residual. Equals the numpy reference step by step,
    residuals included."""
    n, ratio = 5, 0.25
    arrays, columns = _columns(4, n=n)
    rule = aggregators.get("trimmed_mean").bind(n, 1)
    path = gradients.gradient_path(
        rule, num_replicas=n, compression=compression.TopK(ratio)
    )
    (stage,) = [s for s in path.stages if isinstance(s, gradients.Compression)]
    assert stage.leader_chooses and stage.kept_only
    state = path.init(_specs(columns))
    residuals = [[np.zeros_like(a[r]) for r in range(n)] for a in arrays]
    for step in range(3):
        out, state = path.apply(Replicas(columns, MEAN), state)
        sent = []
        for v, a in enumerate(arrays):
            xs = [a[r] + residuals[v][r] for r in range(n)]
            column, residuals[v] = ref.leaders_top_k(xs, ratio, step)
            sent.append(np.stack(column))
        for got, want in zip(
            out.values, reference.trimmed_mean(sent, f=1), strict=True
        ):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name",
    ["top_k(ratio=0.5)", "random_k(ratio=0.5)", "sign", "power_sgd", "fp16", "bf16"],
)
def test_a_sync_queue_layout_carries_a_payload_and_gives_it_back(name):
    """`SyncReplicaStrategy`'s queue: a compressed gradient goes in as its
    payload's tensors and comes out as the same payload, with its static
    parts (a cast's dtype, which crashed the queue's layout)."""
    from keras_psdist.gradients.wire import Payload
    from keras_psdist.sync.protocol import Layout

    wire = _wire(name, "/cpu:0", "/cpu:0")
    v = tf.Variable(tf.zeros([8, 8]))
    gradient = tf.reshape(tf.range(64, dtype=tf.float32) - 20.0, [8, 8])
    [payload] = wire.payloads([gradient], [v])
    grads = [payload, tf.constant([2.0]), None]
    layout = Layout.of(grads)
    assert layout.kinds == ("compressed", "dense", "none")
    components = layout.flatten(grads)
    assert [c.dtype for c in components] == layout.component_types[4:]
    back = layout.unflatten(components, [v.shape, tf.TensorShape([1]), None])
    assert isinstance(back[0], Payload) and back[2] is None
    np.testing.assert_array_equal(
        wire.decompress(back[0]).numpy(), wire.decompress(payload).numpy()
    )
    assert wire.decompress(back[0]).dtype == tf.float32


class _Shapes(gradients.Stage):
    """Passes the replicas on, noting each variable's value shape."""

    def __init__(self):
        self.shapes = []

    def apply(self, replicas, state, *, downstream=None):
        self.shapes = [tuple(column[0].shape) for column in replicas.values]
        return replicas, state


def _random_k_path(rule, n, kept_only, spy=None, attack=None):
    stages = [
        gradients.Compression(compression.RandomK(0.25, seed=2), n, None, kept_only)
    ]
    if attack is not None:
        stages.append(gradients.Attacked(attack))
    stages.extend([spy] if spy is not None else [])
    stages.append(gradients.Rule(rule))
    return gradients.chain(*stages)


@pytest.mark.parametrize(
    "rule", ["trimmed_mean", "median", "geometric_median", "multi_krum", "mean"]
)
def test_random_k_hands_the_rule_the_kept_coordinates_only(rule):
    """Random-k keeps the same coordinates on every replica: the rule runs
    on those `k` values (a quarter of each variable) and its result,
    put back at them, is what it gives on the decompressed tensors."""
    n = 5
    bound = aggregators.get(rule).bind(n, 1 if rule != "mean" else 0)
    spy = _Shapes()
    kept = _random_k_path(bound, n, kept_only=True, spy=spy)
    whole = _random_k_path(bound, n, kept_only=False)
    arrays, columns = _columns(3, n=n, shapes=((8,), (4, 6)))
    specs = _specs(columns)
    got, _ = kept.apply(Replicas(columns, MEAN), kept.init(specs))
    want, _ = whole.apply(Replicas(columns, MEAN), whole.init(specs))
    assert spy.shapes == [(2,), (6,)]  # ceil(0.25 * 8), ceil(0.25 * 24)
    for g, w, a in zip(got.values, want.values, arrays, strict=True):
        assert g.shape == a.shape[1:]
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
    # And the numpy reference: the rule over the decompressed values.
    if rule == "trimmed_mean":
        compressor = compression.RandomK(0.25, seed=2)
        sent = [
            np.stack(
                [
                    ref.random_k(
                        a[r],
                        compressor.indices(
                            compressor.encode(tf.constant(a[r]), 0, v)
                        ).numpy(),
                    )[0]
                    for r in range(n)
                ]
            )
            for v, a in enumerate(arrays)
        ]
        for g, w in zip(got.values, reference.trimmed_mean(sent, f=1), strict=True):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)


def test_the_strategy_path_runs_on_kept_coordinates_unless_a_stage_keeps_state():
    random_k = compression.RandomK(0.1)
    for rule, kept_only in [
        ("trimmed_mean", True),
        ("arc>geometric_median", True),
        ("centered_clipping", False),  # its centre has the variable's shape
    ]:
        path = gradients.gradient_path(
            aggregators.get(rule).bind(5, 1), num_replicas=5, compression=random_k
        )
        assert path.stages[0].kept_only is kept_only, rule
    leaders = gradients.gradient_path(
        aggregators.get("median").bind(5, 1),
        num_replicas=5,
        compression=compression.TopK(0.1),
    )
    assert leaders.stages[0].kept_only is True  # the leader's, on every replica
    own = gradients.gradient_path(
        aggregators.get("geometric_median").bind(5, 1),
        num_replicas=5,
        compression=compression.TopK(0.1),
    )
    assert own.stages[0].kept_only is False  # each replica its own coordinates


def test_on_kept_coordinates_an_attack_sends_only_there():
    """An attacker behind random-k can only send values at the kept
    coordinates (what the wire carries): the mean is 0 everywhere else,
    and a replica without data is masked as on the whole tensor."""
    n = 4
    attack = attacks.get(
        {"class_name": "scale", "config": {"replicas": [3], "factor": 100.0}}
    )
    path = _random_k_path(aggregators.Mean().bind(n, 0), n, True, attack=attack)
    arrays, columns = _columns(5, n=n, shapes=((40,),))
    shares = [tf.constant(s) for s in (0.5, 0.25, 0.25, 0.0)]
    out, _ = path.apply(Replicas(columns, MEAN, shares), path.init(_specs(columns)))
    value = out.values[0].numpy()
    assert np.count_nonzero(value) == 10  # ceil(0.25 * 40)
    payload = compression.RandomK(0.25, seed=2).encode(tf.constant(arrays[0][0]), 0, 0)
    kept = compression.RandomK(0.25, seed=2).indices(payload).numpy()
    assert set(np.flatnonzero(value)) == set(kept)
    # Replica 3 (the attacker) has no data: masked, the mean of the others.
    np.testing.assert_allclose(
        value[kept], arrays[0][:3, kept].sum(axis=0) / n, rtol=1e-5
    )
