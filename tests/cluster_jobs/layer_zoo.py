"""A model of the layer types users train most, and data in partial batches.

Shared by tests/test_partial_batches.py (one host) and the cluster jobs
(in-graph, async, sync replicas): every layer type whose kernels might fail
on an empty batch (oneDNN's `MaxPoolGrad` aborts the process on one) sees
global batches of every size from 1 to n - 1 for n replicas.
"""

import keras
import numpy as np
import tensorflow as tf

IMAGE_SHAPE = (8, 8, 1)
SEQUENCE_LENGTH = 6
VOCABULARY = 20
CLASSES = 3


def build(seed: int = 0, stochastic: bool = True) -> keras.Model:
    """Conv1D/2D, max/average/global pooling, Embedding, LSTM, GRU,
    MultiHeadAttention, LayerNormalization and, when `stochastic`,
    BatchNormalization and Dropout (left out for exact comparisons: their
    training outputs depend on how the batch is split, or on random bits)."""
    keras.utils.set_random_seed(seed)
    image = keras.Input(IMAGE_SHAPE, name="image")
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.AveragePooling2D(2)(h)
    if stochastic:
        h = keras.layers.BatchNormalization()(h)
    image_features = keras.layers.GlobalAveragePooling2D()(h)

    tokens = keras.Input((SEQUENCE_LENGTH,), dtype="int32", name="tokens")
    s = keras.layers.Embedding(VOCABULARY, 8)(tokens)
    s = keras.layers.Conv1D(8, 3, padding="same", activation="relu")(s)
    s = keras.layers.MaxPooling1D(2)(s)
    s = keras.layers.LSTM(8, return_sequences=True)(s)
    s = keras.layers.GRU(8, return_sequences=True)(s)
    s = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(s, s)
    s = keras.layers.LayerNormalization()(s)
    s = keras.layers.AveragePooling1D(1)(s)
    sequence_features = keras.layers.GlobalMaxPooling1D()(s)

    h = keras.layers.Concatenate()([image_features, sequence_features])
    if stochastic:
        h = keras.layers.Dropout(0.2)(h)
    logits = keras.layers.Dense(CLASSES)(h)
    model = keras.Model({"image": image, "tokens": tokens}, logits)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy", ExampleCount()],
    )
    return model


class ExampleCount(keras.metrics.Metric):
    """How many examples the metric has seen (each counted once)."""

    def __init__(self, name="examples", **kwargs):
        super().__init__(name=name, **kwargs)
        self.count = self.add_variable(
            shape=(), initializer="zeros", dtype="float32", name="count"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign(
            self.count + keras.ops.cast(keras.ops.shape(y_true)[0], "float32")
        )

    def result(self):
        return self.count


def batch_sizes(num_replicas: int) -> list[int]:
    """A full batch of 2 * n before each partial size 1 ... n - 1 (and one
    after), so each step of a partial batch follows a full one."""
    full = 2 * num_replicas
    sizes = []
    for partial in range(1, num_replicas):
        sizes += [full, partial]
    return [*sizes, full]


def data(num_examples: int, seed: int = 0):
    """`(features, labels)`: images, token ids, labels in [0, CLASSES)."""
    rng = np.random.RandomState(seed)
    features = {
        "image": rng.rand(num_examples, *IMAGE_SHAPE).astype("float32"),
        "tokens": rng.randint(0, VOCABULARY, (num_examples, SEQUENCE_LENGTH)).astype(
            "int32"
        ),
    }
    labels = rng.randint(0, CLASSES, num_examples).astype("int32")
    return features, labels


def partial_batches(num_replicas: int, seed: int = 0) -> tf.data.Dataset:
    """Global batches of the sizes `batch_sizes(num_replicas)`, in order."""
    sizes = batch_sizes(num_replicas)
    features, labels = data(sum(sizes), seed)
    features = {k: tf.constant(v) for k, v in features.items()}
    labels = tf.constant(labels)
    starts = np.cumsum([0, *sizes[:-1]]).astype("int64")
    sizes = np.asarray(sizes, "int64")
    return tf.data.Dataset.from_tensor_slices((starts, sizes)).map(
        lambda start, size: (
            {k: v[start : start + size] for k, v in features.items()},
            labels[start : start + size],
        )
    )
