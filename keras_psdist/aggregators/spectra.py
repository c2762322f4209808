"""The largest eigenvalue of the replicas' covariance, from their Gram matrix.

SMEA and CAF judge a set of replicas by the largest eigenvalue of their
(weighted) empirical covariance over the full vector, `lambda_max(Sigma_c)`
with `Sigma_c = sum_i w_i (x_i - mu_w)(x_i - mu_w)^T` (`w` summing to 1,
`mu_w = sum_i w_i x_i`). A d x d matrix is out of the question for a model;
its nonzero eigenvalues are those of the n x n matrix

    M = W^(1/2) G_w W^(1/2),   G_w = the Gram matrix of the x_i - mu_w,

and `G_w` follows from the raw Gram matrix `K` (one pass over the values,
`distances.geometry`): `G_w = K - K w 1^T - 1 w^T K + (w^T K w) 1 1^T`. The
top eigenvector `u` of `M` gives each replica's squared projection on the
covariance's top direction `v`: `<x_i - mu_w, v>^2 = (G_w W^(1/2) u)_i^2 /
lambda_max`. Everything after `K` is on n x n matrices, in float64, exact
(`tf.linalg.eigh`), where ByzFL runs one power-method step from a random
vector.

Examples:

>>> import tensorflow as tf
>>> x = tf.constant([[0.0, 0.0], [2.0, 0.0], [1.0, 3.0]], tf.float64)
>>> w = tf.constant([0.5, 0.5, 0.0], tf.float64)
>>> value, _ = top_eigen(tf.matmul(x, x, transpose_b=True), w)
>>> float(value)  # the two weighted points: variance 1 along the first axis
1.0
"""

from __future__ import annotations

import tensorflow as tf


def centered_gram(gram: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    """`G_w`, the Gram matrix of `x_i - mu_w` (see the module docstring).

    Args:
        gram: float64 `[..., n, n]`, the raw Gram matrix `K`.
        weights: float64 `[..., n]`, summing to 1.
    """
    kw = tf.linalg.matvec(gram, weights)  # [..., n]
    wkw = tf.reduce_sum(weights * kw, axis=-1, keepdims=True)  # [..., 1]
    return gram - kw[..., :, None] - kw[..., None, :] + wkw[..., None]


def top_eigen(gram: tf.Tensor, weights: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`(lambda_max(Sigma_w), <x_i - mu_w, v>^2)` for weights summing to 1.

    Args:
        gram: float64 `[n, n]`, the raw Gram matrix.
        weights: float64 `[n]`, >= 0, summing to 1.

    Returns:
        The largest eigenvalue (a scalar) and each replica's squared
        projection on its eigenvector (`[n]`; zeros when it is 0).
    """
    centered = centered_gram(gram, weights)
    root = tf.sqrt(weights)
    values, vectors = tf.linalg.eigh(root[:, None] * centered * root[None, :])
    value = tf.maximum(values[-1], 0.0)
    along = tf.linalg.matvec(centered, root * vectors[:, -1])
    return value, tf.math.divide_no_nan(tf.square(along), value)


def largest_eigenvalues(gram: tf.Tensor, subsets) -> tf.Tensor:
    """`lambda_max` of each subset's covariance, equal weights in it.

    Args:
        gram: float64 `[n, n]`.
        subsets: int `[S, k]`, replica ids.

    Returns:
        float64 `[S]`.
    """
    k = subsets.shape[1]
    blocks = tf.gather(tf.gather(gram, subsets), subsets, axis=2, batch_dims=1)
    equal = tf.fill([len(subsets), k], tf.constant(1.0 / k, tf.float64))
    centered = centered_gram(blocks, equal)
    return tf.maximum(tf.linalg.eigvalsh(centered / k)[:, -1], 0.0)
