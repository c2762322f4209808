"""Packed reads and pushes: a step's tensors from one task to another travel
as one per ps task, and the step computes exactly what it did with one
tensor per variable.

One host has no second task, so these tests make every other logical CPU
count as one (`across_tasks`, conftest.py): the path a cluster takes, op
for op. `tests/test_cluster_training.py` runs it across processes.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist._tf import device_util
from keras_psdist.distribute import packed_transfers

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def packs(monkeypatch):
    """`(members, wire dtype)` of every pack made (appended at trace)."""
    made = []
    packed = packed_transfers._packed

    def counted(members, source, destination, wire_dtype=None):
        made.append((len(members), wire_dtype))
        return packed(members, source, destination, wire_dtype)

    monkeypatch.setattr(packed_transfers, "_packed", counted)
    return made


def _strategy(cpu_devices, ps=1, **kwargs):
    return kpd.PSStrategy(
        devices=cpu_devices[:2], parameter_devices=cpu_devices[2 : 2 + ps], **kwargs
    )


def _mlp(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(3),
            ]
        )
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 8)).astype(np.float32), rng.normal(size=(64, 3)).astype(
        np.float32
    )


def _fit(strategy, make=_mlp, epochs=2, pack=True):
    strategy.extended.pack_transfers = pack
    model = make(strategy)
    x, y = _data()
    history = model.fit(x, y, batch_size=16, epochs=epochs, verbose=0)
    return model, history.history["loss"]


@pytest.mark.parametrize("ps", [1, 2])
def test_fit_is_the_same_packed_and_not(cpu_devices, across_tasks, packs, ps):
    """The weights and losses of a fit, bit for bit, whether a step's reads
    and gradients travel one per variable or one per ps task; the packs
    are made as said: each replica reads each ps task's variables as one
    tensor and sends it its gradients as one."""
    alone, alone_loss = _fit(_strategy(cpu_devices, ps), pack=False)
    assert packs == []
    together, together_loss = _fit(_strategy(cpu_devices, ps))
    assert together_loss == alone_loss
    for a, b in zip(alone.get_weights(), together.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    # 6 variables over `ps` tasks: per replica, one read pack per task and
    # one pack of its gradients to the reduction device (the first task).
    reads = [n for n, _ in packs[: 2 * ps]]
    assert sum(reads) == 2 * 6, packs
    assert len(packs) == 2 * ps + 2 + (ps - 1), packs


@pytest.mark.parametrize(
    "options",
    [
        {"aggregator": "median"},  # per variable, spread over the ps tasks
        {"aggregator": "centered_clipping"},  # state on the reduction device
        {"worker_momentum": 0.9},  # each replica's momentum first: unpacked
        {"compression": "fp16"},  # compressed on the replicas: unpacked
        {"dense": "all_reduce"},  # replicated variables: neither read nor push
        {"read_dtype": "bfloat16"},
    ],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()),
)
def test_each_option_trains_the_same_packed_and_not(cpu_devices, across_tasks, options):
    """Packing beside the other options, with 2 ps tasks: the same losses
    and weights as one tensor per variable."""
    alone, alone_loss = _fit(_strategy(cpu_devices, 2, **options), pack=False)
    together, together_loss = _fit(_strategy(cpu_devices, 2, **options))
    assert together_loss == alone_loss
    for a, b in zip(alone.get_weights(), together.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_reads_travel_in_read_dtype_in_the_pack(cpu_devices, across_tasks, packs):
    strategy = _strategy(cpu_devices, read_dtype="bfloat16")
    _fit(strategy, epochs=1)
    assert (6, tf.bfloat16) in packs, packs


class ReadsAfterItsUpdate(keras.Model):
    """A custom `train_step` that reads a kernel before its tape, inside a
    `tf.cond`, and after the optimizer's update."""

    def __init__(self):
        super().__init__()
        self.first = keras.layers.Dense(4)
        self.second = keras.layers.Dense(3)

    def call(self, x):
        return self.second(tf.nn.relu(self.first(x)))

    def train_step(self, data):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        before = tf.reduce_sum(self.first.kernel)  # outside the tape
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x) - y))
            loss += tf.cond(
                before > 0.0,
                lambda: 1e-3 * tf.reduce_sum(tf.square(self.second.kernel)),
                lambda: 0.0,
            )
        variables = self.trainable_variables
        self.optimizer.apply(tape.gradient(loss, variables), variables)
        after = tf.reduce_sum(self.first.kernel)  # the updated kernel
        return {"loss": loss, "before": before, "after": after}


def _custom(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = ReadsAfterItsUpdate()
        model(np.zeros((1, 8), np.float32))
        model.compile(optimizer=keras.optimizers.SGD(0.1))
    return model


def test_a_custom_step_reads_what_it_wrote(cpu_devices, across_tasks, packs):
    """A read before the tape still takes the gradient, one in a `tf.cond`
    reads alone, and one after the update reads the updated variable: the
    same logs and weights packed and not."""
    x, y = _data()
    results = []
    for pack in (False, True):
        strategy = _strategy(cpu_devices)
        strategy.extended.pack_transfers = pack
        model = _custom(strategy)
        logs = model.train_on_batch(x, y, return_dict=True)
        results.append((logs, model.get_weights()))
    (logs_a, weights_a), (logs_b, weights_b) = results
    assert [n for n, _ in packs][:2] == [4, 4], packs  # the step's reads
    assert logs_a == logs_b
    assert logs_b["after"] != logs_b["before"]
    for a, b in zip(weights_a, weights_b, strict=True):
        np.testing.assert_array_equal(a, b)


def test_evaluate_and_predict_read_packed(cpu_devices, across_tasks, packs):
    strategy = _strategy(cpu_devices)
    model = _mlp(strategy)
    x, y = _data()
    loss = model.evaluate(x, y, batch_size=16, verbose=0)
    prediction = model.predict(x, batch_size=16, verbose=0)
    assert [n for n, _ in packs] == [6, 6, 6, 6], packs  # 2 replicas each
    strategy.extended.pack_transfers = False
    alone = _mlp(_strategy(cpu_devices))
    assert alone.evaluate(x, y, batch_size=16, verbose=0) == loss
    np.testing.assert_array_equal(
        alone.predict(x, batch_size=16, verbose=0), prediction
    )


def test_a_custom_loop_reads_each_variable_alone(cpu_devices, across_tasks, packs):
    """`strategy.run` of a function of the user's: which variables it reads
    is not known before it runs, so none is packed."""
    strategy = _strategy(cpu_devices)
    model = _mlp(strategy)

    @tf.function
    def step(x):
        return strategy.run(model, args=(x,))

    step(tf.ones([2, 8]))
    assert packs == []


def test_move_together_leaves_what_it_cannot_pack(cpu_devices, across_tasks):
    source, destination = cpu_devices[0], cpu_devices[2]
    result = {}

    @tf.function
    def moved():
        with tf.device(source):
            a = tf.reshape(tf.range(6.0), [2, 3])
            b = tf.constant([7.0])
            i = tf.constant([1, 2])
            sparse = tf.IndexedSlices(a, tf.constant([0, 1]), tf.constant([4, 3]))
        with tf.device(destination):
            here = tf.constant([9.0])
        out = packed_transfers.move_together([a, b, i, sparse, here], destination)
        result["devices"] = [t.device for t in out[:2]]
        result["untouched"] = [out[2] is i, out[3] is sparse, out[4] is here]
        return out[0], out[1]

    a, b = moved()
    np.testing.assert_array_equal(a, np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(b, [7.0])
    assert result["devices"] == [device_util.canonicalize(destination)] * 2
    assert result["untouched"] == [True, True, True]
    eager = [tf.ones([2]), tf.ones([3])]
    assert packed_transfers.move_together(eager, destination) == eager


def test_tensors_too_large_travel_alone(cpu_devices, across_tasks, monkeypatch):
    monkeypatch.setattr(packed_transfers, "MAX_PACKED_ELEMENTS", 4)
    source, destination = cpu_devices[0], cpu_devices[2]
    kept = {}

    @tf.function
    def moved():
        with tf.device(source):
            small = [tf.ones([2]), tf.ones([2])]
            large = tf.ones([5])
        out = packed_transfers.move_together([*small, large], destination)
        kept["large"] = out[2] is large
        return out

    moved()
    assert kept["large"]


def test_the_planner_packs_what_a_step_packs():
    from keras_psdist.planning import model

    assert model.PACKED_MAX_BYTES == 4 * packed_transfers.MAX_PACKED_ELEMENTS
