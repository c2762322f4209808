"""Numpy references of the compressors (`keras_psdist.compression`): the spec
each implementation is tested against.

Each takes one replica's value `x` (its gradient plus residual under error
feedback) and returns `(sent, residual)`: the dense value the reduction
device sees, and what the replica keeps (`x - sent`; zeros for the stateless
casts, which drop their rounding).
"""

from __future__ import annotations

import math

import numpy as np


def kept_count(ratio, size):
    """k = max(1, ceil(ratio * size)), at most size."""
    return max(1, min(size, math.ceil(ratio * size)))


def none(x):
    return x.copy(), np.zeros_like(x)


def fp16(x):
    return x.astype(np.float16).astype(x.dtype), np.zeros_like(x)


def bf16(x):
    """Round to nearest even on the upper 16 bits of float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(x.dtype), np.zeros_like(x)


def top_k(x, ratio):
    """The k largest magnitudes kept (ties to the lower index)."""
    flat = x.reshape(-1)
    k = kept_count(ratio, flat.size)
    keep = np.argsort(-np.abs(flat), kind="stable")[:k]
    sent = np.zeros_like(flat)
    sent[keep] = flat[keep]
    sent = sent.reshape(x.shape)
    return sent, x - sent


def leaders_top_k(xs, ratio, step):
    """Every replica's values at the coordinates of the leader's top-k (the
    leader of `step` is replica `step mod n`): `(sent, residuals)`, each a
    list over the replicas."""
    leader = xs[step % len(xs)].reshape(-1)
    k = kept_count(ratio, leader.size)
    keep = np.argsort(-np.abs(leader), kind="stable")[:k]
    sent = []
    for x in xs:
        flat = np.zeros(x.size, x.dtype)
        flat[keep] = x.reshape(-1)[keep]
        sent.append(flat.reshape(x.shape))
    return sent, [x - s for x, s in zip(xs, sent, strict=True)]


def random_k(x, indices):
    """The values at `indices` (flat), which the seed draws: the reference
    takes them from the implementation and checks everything else."""
    flat = x.reshape(-1)
    sent = np.zeros_like(flat)
    sent[indices] = flat[indices]
    sent = sent.reshape(x.shape)
    return sent, x - sent


def sign(x):
    """mean(|x|) * sign(x), a zero counted positive."""
    scale = np.mean(np.abs(x))
    sent = (scale * np.where(x >= 0, 1.0, -1.0)).astype(x.dtype)
    return sent, x - sent


def with_error_feedback(compress, gradients):
    """Runs `compress` with error feedback over one replica's gradients
    (a list over steps): returns the sent values and the final residual."""
    residual = np.zeros_like(gradients[0])
    sent = []
    for g in gradients:
        s, residual = compress(g + residual)
        sent.append(s)
    return sent, residual


def power_sgd(x, q):
    """One power iteration from `q`: `p = orth(M q)`, `q' = M^T p`, sent
    `p q'^T` (M: the first axis by the rest). Returns `(sent, residual, q')`;
    `sent` does not depend on the signs QR gives `p`'s columns, `q'` does."""
    m = x.reshape(x.shape[0], -1).astype(np.float64)
    p, _ = np.linalg.qr(m @ q)
    new_q = m.T @ p
    sent = (p @ new_q.T).reshape(x.shape).astype(x.dtype)
    return sent, x - sent, new_q
