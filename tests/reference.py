"""numpy references of every aggregation rule in `docs/aggregation_rules.md`.

Written from the spec, not from the TF code, and computed in float64. A
reference takes `per_replica`, one array per variable of shape `(n, *shape)`
holding the replicas' true-scale values, and the rule's configuration as
keywords (`f` is `num_byzantine`); it returns one array per variable, the
rule's estimate of the mean. With `report=True` it returns `(values, report)`,
`report` mapping the spec's report names to float64 arrays of shape `[n]`. A
report entry that is NaN is too close to a threshold to call in float32, and
either value is accepted there. `extreme_fraction` is not computed: the spec
names it but does not define it.

`REFERENCES` maps each string id to its reference, `condition` is the spec's
condition on n and f, and `reference_for(rule)` / `candidates(rule, ...)`
call a reference with a bound TF rule's configuration.

Examples:

>>> import numpy as np
>>> x = [np.array([[0.0], [1.0], [2.0], [100.0]])]
>>> [float(v[0]) for v in trimmed_mean(x, f=1)]
[1.5]
>>> [v.tolist() for v in krum(x + [np.zeros((4, 2))], f=0)]  # two variables
[[1.0], [0.0, 0.0]]
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

Values = list[np.ndarray]
Report = dict[str, np.ndarray]

# The report names of the spec's table (wrappers report their inner rule's).
REPORT_NAMES: dict[str, tuple[str, ...]] = {
    "mean": (),
    "median": ("extreme_fraction",),
    "trimmed_mean": ("extreme_fraction",),
    "krum": ("selected",),
    "multi_krum": ("selected",),
    "bulyan": ("selected",),
    "geometric_median": ("weight",),
    "centered_clipping": ("clipped",),
    "mda": ("selected",),
    "meamed": ("excluded_fraction",),
    "smea": ("selected",),
    "caf": ("weight",),
    "monna": ("selected",),
}


# ------------------------------------------------------------------ helpers


def _as_float64(per_replica: Sequence[np.ndarray]) -> Values:
    return [np.array(x, dtype=np.float64) for x in per_replica]


def _finite(per_replica: Values) -> np.ndarray:
    """`[n]` bool: replica r has no NaN/Inf in any variable."""
    n = per_replica[0].shape[0]
    ok = np.ones(n, bool)
    for x in per_replica:
        ok &= np.isfinite(x.reshape(n, -1)).all(axis=1)
    return ok


def _zero_non_finite(per_replica: Values, finite: np.ndarray) -> Values:
    """Whole-vector rules: a non-finite replica's values become zeros."""
    out = []
    for x in per_replica:
        mask = finite.reshape((-1,) + (1,) * (x.ndim - 1))
        out.append(np.where(mask, x, 0.0))
    return out


def _flatten(per_replica: Values) -> np.ndarray:
    """The full vectors, `[n, d]`: every variable concatenated."""
    n = per_replica[0].shape[0]
    return np.concatenate([x.reshape(n, -1) for x in per_replica], axis=1)


def _unflatten(flat: np.ndarray, like: Values) -> Values:
    out, start = [], 0
    for x in like:
        size = int(np.prod(x.shape[1:], dtype=np.int64))
        out.append(flat[start : start + size].reshape(x.shape[1:]))
        start += size
    return out


def _sorted_coordinates(x: np.ndarray) -> np.ndarray:
    """NaN -> +inf, then sort along the replica axis."""
    return np.sort(np.where(np.isnan(x), np.inf, x), axis=0)


def _middle(ordered: np.ndarray) -> np.ndarray:
    """The median of already sorted values (even count: mean of the middle 2)."""
    k = ordered.shape[0]
    with np.errstate(invalid="ignore"):
        return (ordered[(k - 1) // 2] + ordered[k // 2]) / 2.0


def _coordinate_median(per_replica: Values) -> Values:
    return [_middle(_sorted_coordinates(x)) for x in per_replica]


def squared_distances(per_replica: Sequence[np.ndarray]) -> np.ndarray:
    """`D[i, j]`: squared full-vector distance; +inf to a non-finite replica.

    NaN or overflow becomes +inf, a negative value 0; the diagonal is 0.
    """
    per_replica = _as_float64(per_replica)
    finite = _finite(per_replica)
    x = _flatten(_zero_non_finite(per_replica, finite))
    with np.errstate(over="ignore", invalid="ignore"):
        d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)
    d = np.where(np.isnan(d), np.inf, np.maximum(d, 0.0))
    bad = ~finite
    d[bad, :] = np.inf
    d[:, bad] = np.inf
    np.fill_diagonal(d, 0.0)
    return d


def _krum_scores(d: np.ndarray, members: Sequence[int], f: int) -> np.ndarray:
    """Sum of the max(|members| - f - 2, 0) smallest distances to the others."""
    k = max(len(members) - f - 2, 0)
    scores = []
    for i in members:
        others = np.sort([d[i, j] for j in members if j != i])
        scores.append(others[:k].sum())
    return np.array(scores, dtype=np.float64)


def _one_hot(n: int, chosen: Sequence[int]) -> np.ndarray:
    out = np.zeros(n)
    out[list(chosen)] = 1.0
    return out


def _finish(values: Values, rep: Report, report: bool):
    return (values, rep) if report else values


# ----------------------------------------------------------- the references


def mean(per_replica: Sequence[np.ndarray], *, f: int = 0, report: bool = False):
    """Arithmetic mean."""
    x = _as_float64(per_replica)
    with np.errstate(invalid="ignore", over="ignore"):
        return _finish([v.mean(axis=0) for v in x], {}, report)


def median(per_replica: Sequence[np.ndarray], *, f: int = 0, report: bool = False):
    """Coordinate-wise median; NaN counts as +inf."""
    return _finish(_coordinate_median(_as_float64(per_replica)), {}, report)


def trimmed_mean(
    per_replica: Sequence[np.ndarray], *, f: int = 0, report: bool = False
):
    """Coordinate-wise: drop the f smallest and f largest, average the rest."""
    out = []
    for x in _as_float64(per_replica):
        ordered = _sorted_coordinates(x)
        n = ordered.shape[0]
        with np.errstate(invalid="ignore"):
            out.append(ordered[f : n - f].mean(axis=0))
    return _finish(out, {}, report)


def krum(per_replica: Sequence[np.ndarray], *, f: int = 0, report: bool = False):
    """The replica whose n-f-2 nearest neighbours are closest (lowest index on ties)."""
    x = _as_float64(per_replica)
    n = x[0].shape[0]
    d = squared_distances(x)
    best = int(np.argmin(_krum_scores(d, range(n), f)))
    zeroed = _zero_non_finite(x, _finite(x))
    return _finish([v[best] for v in zeroed], {"selected": _one_hot(n, [best])}, report)


def multi_krum(
    per_replica: Sequence[np.ndarray],
    *,
    f: int = 0,
    m: int | None = None,
    report: bool = False,
):
    """The mean of the m replicas with the smallest Krum scores (m=None: n-f)."""
    x = _as_float64(per_replica)
    n = x[0].shape[0]
    m = n - f if m is None else m
    scores = _krum_scores(squared_distances(x), range(n), f)
    chosen = np.argsort(scores, kind="stable")[:m]
    zeroed = _zero_non_finite(x, _finite(x))
    values = [v[chosen].mean(axis=0) for v in zeroed]
    return _finish(values, {"selected": _one_hot(n, chosen)}, report)


def mda(per_replica: Sequence[np.ndarray], *, f: int = 0, report: bool = False):
    """The mean of the n - f replicas with the smallest diameter (the largest
    distance between two of them; the first subset in lexicographic order
    on ties), as ByzFL's MDA."""
    x = _as_float64(per_replica)
    n = x[0].shape[0]
    d = squared_distances(x)
    best, smallest = None, np.inf
    for subset in itertools.combinations(range(n), n - f):
        diameter = max(
            (d[i, j] for i, j in itertools.combinations(subset, 2)), default=0.0
        )
        if best is None or diameter < smallest:
            best, smallest = subset, diameter
    finite = _finite(x)
    chosen = [i for i in best if finite[i]]
    zeroed = _zero_non_finite(x, finite)
    values = [v[chosen].mean(axis=0) if chosen else np.zeros_like(v[0]) for v in zeroed]
    return _finish(values, {"selected": _one_hot(n, chosen)}, report)


def meamed(per_replica: Sequence[np.ndarray], *, f: int = 0, report: bool = False):
    """Per coordinate, the mean of the n - f values closest to the median
    (of two at one distance, the lower value); NaN counts as +inf."""
    out = []
    for x in _as_float64(per_replica):
        x = np.where(np.isnan(x), np.inf, x)
        n = x.shape[0]
        with np.errstate(invalid="ignore"):
            distance = np.abs(x - np.median(x, axis=0))
        # By distance, then by value (np.lexsort's last key is the first).
        order = np.lexsort((x, distance), axis=0)
        ranks = np.argsort(order, axis=0, kind="stable")
        kept = ranks < n - f
        out.append(np.where(kept, x, 0.0).sum(axis=0) / (n - f))
    return _finish(out, {}, report)


def _top_eigen(rows: np.ndarray, weights: np.ndarray):
    """The weighted covariance's largest eigenvalue and its eigenvector.

    The d x d covariance is `A.T @ A` with `A` the centred rows scaled by
    `sqrt(weights)`: its eigenvalues are the squares of `A`'s singular
    values and its eigenvectors `A`'s right singular vectors, so the SVD of
    the k x d `A` gives them without forming the d x d matrix (an `eigh` of
    it took seconds per call at d = 3000). The TF rules use the eigenvectors
    of the n x n Gram matrix instead: another route to the same numbers.

    >>> rows = np.array([[0.0, 0.0], [2.0, 0.0]])
    >>> value, vector, _ = _top_eigen(rows, np.array([0.5, 0.5]))
    >>> round(value, 12), np.abs(vector).tolist()
    (1.0, [1.0, 0.0])
    """
    mu = weights @ rows
    centered = rows - mu
    scaled = centered * np.sqrt(weights)[:, None]
    _, singular, right = np.linalg.svd(scaled, full_matrices=False)
    return float(singular[0]) ** 2, right[0], centered


# Subsets whose top eigenvalues differ by less than this (relative) are tied
# for `smea`'s candidates: equal in exact arithmetic, e.g. mirror images,
# their float32 values on the TF side and float64 ones here round apart
# either way (2.2222222222222215e-01 against 2.222222222222222e-01).
SMEA_TIE_RTOL = 1e-5


def smea(
    per_replica: Sequence[np.ndarray],
    *,
    f: int = 0,
    report: bool = False,
    subset: Sequence[int] | None = None,
):
    """The mean of the n - f replicas whose covariance's largest eigenvalue is
    smallest (the first subset in lexicographic order on ties); subsets with
    a non-finite replica never win while another exists. `subset`: average
    that one instead (`smea_ties`)."""
    x = _as_float64(per_replica)
    n = x[0].shape[0]
    finite = _finite(x)
    if subset is None:
        spreads = _smea_spreads(x, f)
        subset = min(spreads, key=spreads.get) if spreads else []
    chosen = list(subset)
    zeroed = _zero_non_finite(x, finite)
    values = [v[chosen].mean(axis=0) if chosen else np.zeros_like(v[0]) for v in zeroed]
    return _finish(values, {"selected": _one_hot(n, chosen)}, report)


def _smea_spreads(x: Values, f: int) -> dict[tuple[int, ...], float]:
    """Every finite subset of n - f replicas (in lexicographic order): the
    top eigenvalue of its covariance."""
    n = x[0].shape[0]
    finite = _finite(x)
    rows = _flatten(_zero_non_finite(x, finite))
    spreads = {}
    for subset in itertools.combinations(range(n), n - f):
        if finite[list(subset)].all():
            weights = np.full(len(subset), 1.0 / len(subset))
            spreads[subset] = _top_eigen(rows[list(subset)], weights)[0]
    return spreads


def smea_ties(per_replica: Sequence[np.ndarray], f: int) -> list[tuple[int, ...]]:
    """The subsets `smea` may average: those within `SMEA_TIE_RTOL` of the
    smallest top eigenvalue (the first of them is `smea`'s own choice)."""
    spreads = _smea_spreads(_as_float64(per_replica), f)
    if not spreads:
        return [()]
    smallest = min(spreads.values())
    bound = smallest + SMEA_TIE_RTOL * max(abs(smallest), 1e-12)
    return [subset for subset, value in spreads.items() if value <= bound]


def caf(per_replica: Sequence[np.ndarray], *, f: int = 0, report: bool = False):
    """The covariance-bound agnostic filter: weights 1 (0 when non-finite),
    lowered by `1 - tau_i / tau_max` (tau_max over the replicas still
    weighted) while they sum to more than n - 2f; the weighted mean of the
    round with the smallest top eigenvalue (the first on ties)."""
    x = _as_float64(per_replica)
    n = x[0].shape[0]
    finite = _finite(x)
    rows = _flatten(_zero_non_finite(x, finite))
    c = finite.astype(np.float64)
    best, smallest = c / c.sum(), np.inf
    while c.sum() > n - 2 * f:
        w = c / c.sum()
        value, vector, centered = _top_eigen(rows, w)
        if value < smallest:
            best, smallest = w, value
        tau = (centered @ vector) ** 2
        tau_max = tau[c > 0].max()
        if tau_max <= 0:
            break
        c = np.where(c > 0, np.maximum(c * (1 - tau / tau_max), 0.0), 0.0)
        c[tau >= tau_max] = 0.0
    zeroed = _zero_non_finite(x, finite)
    values = [np.tensordot(best, v, axes=1) for v in zeroed]
    return _finish(values, {"weight": best}, report)


def monna(
    per_replica: Sequence[np.ndarray],
    *,
    f: int = 0,
    reference: int = 0,
    report: bool = False,
):
    """The mean of the n - f replicas nearest to replica `reference` (itself
    included; ties: lower index), a non-finite one counted as zeros."""
    x = _as_float64(per_replica)
    n = x[0].shape[0]
    d = squared_distances(x)[reference]
    chosen = np.argsort(d, kind="stable")[: n - f]
    zeroed = _zero_non_finite(x, _finite(x))
    values = [v[chosen].sum(axis=0) / (n - f) for v in zeroed]
    return _finish(values, {"selected": _one_hot(n, chosen)}, report)


def bulyan(per_replica: Sequence[np.ndarray], *, f: int = 0, report: bool = False):
    """theta = n-2f Krum rounds, then per coordinate the beta values nearest the median.

    A non-finite replica is never selected (spec, "Non-finite inputs"), also in
    a round whose Krum score sums no distance (|R| <= f + 2, so every score is
    0): it gets score +inf.
    """
    x = _as_float64(per_replica)
    n = x[0].shape[0]
    finite = _finite(x)
    d = squared_distances(x)
    remaining, selected = list(range(n)), []
    for _ in range(n - 2 * f):
        scores = _krum_scores(d, remaining, f)
        scores[~finite[remaining]] = np.inf
        selected.append(remaining.pop(int(np.argmin(scores))))
    theta = len(selected)
    beta = theta - 2 * f
    out = []
    for v in _zero_non_finite(x, finite):
        s = np.sort(v[selected], axis=0)
        mid = _middle(s)
        starts = range(theta - beta + 1)
        cost = np.stack([np.maximum(mid - s[t], s[t + beta - 1] - mid) for t in starts])
        means = np.stack([s[t : t + beta].mean(axis=0) for t in starts])
        best = np.argmin(cost, axis=0)  # first minimum: the smallest t
        out.append(np.take_along_axis(means, best[None], axis=0)[0])
    return _finish(out, {"selected": _one_hot(n, selected)}, report)


def geometric_median(
    per_replica: Sequence[np.ndarray],
    *,
    f: int = 0,
    iterations: int = 8,
    smoothing: float = 1e-6,
    report: bool = False,
):
    """Smoothed Weiszfeld from the coordinate-wise median.

    The median starts from the zeroed values: the spec replaces a non-finite
    replica's values by zeros "before any arithmetic" in whole-vector rules.
    """
    x = _as_float64(per_replica)
    finite = _finite(x)
    zeroed = _zero_non_finite(x, finite)
    points = _flatten(zeroed)
    z = _flatten([v[None] for v in _coordinate_median(zeroed)])[0]

    def weights(z):
        w = 1.0 / np.maximum(smoothing, np.linalg.norm(points - z, axis=1))
        return np.where(finite, w, 0.0)

    w = weights(z)  # the report if there is no iteration
    for _ in range(iterations):
        w = weights(z)
        z = (w[:, None] * points).sum(axis=0) / w.sum()
    return _finish(_unflatten(z, x), {"weight": w / w.sum()}, report)


def centered_clipping(
    per_replica: Sequence[np.ndarray],
    *,
    f: int = 0,
    radius: float | str = "auto",
    iterations: int = 3,
    center: Sequence[np.ndarray | None] | None = None,
    report: bool = False,
):
    """Clipped steps from a center: the previous output, or the median.

    Args:
        radius: A float, or "auto": in each iteration the distance of the
            (n - f)-th closest finite replica to the center.
        center: One array per variable (`None` entries, or `None` for all: the
            coordinate-wise median of the zeroed inputs, as on a first step
            or for a sparse block).
    """
    fixed = radius
    x = _as_float64(per_replica)
    n = x[0].shape[0]
    finite = _finite(x)
    zeroed = _zero_non_finite(x, finite)
    medians = _coordinate_median(zeroed)
    center = [None] * len(x) if center is None else list(center)
    start = [
        med if c is None else np.asarray(c, np.float64)
        for med, c in zip(medians, center, strict=True)
    ]
    points = _flatten(zeroed)
    v = _flatten([c[None] for c in start])[0]
    clipped = np.zeros(n)
    for _ in range(iterations):
        dist = np.linalg.norm(points - v, axis=1)
        if fixed == "auto":
            finite_dist = np.sort(dist[finite])
            radius = finite_dist[min(n - f, len(finite_dist)) - 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            c = np.where(dist > 0, np.minimum(1.0, radius / dist), 1.0)
        c = np.where(finite, c, 0.0)
        clipped = np.where(dist > radius, 1.0, 0.0)
        clipped[np.abs(dist - radius) <= 1e-4 * radius] = np.nan
        clipped[~finite] = 1.0  # at distance +inf
        v = v + (c[:, None] * (points - v)).sum(axis=0) / n
    return _finish(_unflatten(v, x), {"clipped": clipped}, report)


def _inner(inner: str | Callable) -> Callable:
    return REFERENCES[inner] if isinstance(inner, str) else inner


def nnm(
    per_replica: Sequence[np.ndarray],
    *,
    f: int = 0,
    inner: str | Callable = "trimmed_mean",
    report: bool = False,
):
    """Each replica becomes the mean of its n-f nearest (by D, ties lowest index).

    Then `inner` (an id or a reference) runs on the mixed values with the same f.
    """
    x = _as_float64(per_replica)
    n = x[0].shape[0]
    d = squared_distances(x)
    zeroed = _zero_non_finite(x, _finite(x))
    neighbours = [np.argsort(d[i], kind="stable")[: n - f] for i in range(n)]
    mixed = [np.stack([v[nb].mean(axis=0) for nb in neighbours]) for v in zeroed]
    return _inner(inner)(mixed, f=f, report=report)


def bucketing(
    per_replica: Sequence[np.ndarray],
    *,
    f: int = 0,
    inner: str | Callable = "trimmed_mean",
    bucket_size: int = 2,
    permutation: Sequence[int] | None = None,
    report: bool = False,
):
    """`inner` on the means of consecutive groups of `permutation` (default: identity)."""
    x = _as_float64(per_replica)
    n = x[0].shape[0]
    order = np.arange(n) if permutation is None else np.asarray(permutation)
    buckets = [order[i : i + bucket_size] for i in range(0, n, bucket_size)]
    with np.errstate(invalid="ignore", over="ignore"):
        means = [np.stack([v[b].mean(axis=0) for b in buckets]) for v in x]
    values, inner_report = _inner(inner)(means, f=f, report=True)
    bucket_of = np.empty(n, int)
    for k, b in enumerate(buckets):
        bucket_of[b] = k
    return _finish(values, {k: r[bucket_of] for k, r in inner_report.items()}, report)


# A squared norm above this overflows float32: the replica counts as non-finite.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _clip_to(
    per_replica: Values, threshold_of: Callable[[np.ndarray], float]
) -> Values:
    """Clipping and ARC: each replica scaled to norm <= the threshold.

    A replica with a NaN/Inf anywhere, or whose squared full-vector norm
    overflows float32, is non-finite: its norm counts as +inf and its values
    become zeros. `threshold_of(norms)` picks the threshold from the norms.
    """
    n = per_replica[0].shape[0]
    finite = _finite(per_replica)
    zeroed = _zero_non_finite(per_replica, finite)
    flat = _flatten(zeroed)
    norms = np.sqrt((flat**2).sum(axis=1))
    finite &= norms**2 <= _FLOAT32_MAX
    norms[~finite] = np.inf
    threshold = threshold_of(norms)
    out = [np.zeros_like(x) for x in per_replica]
    for r in range(n):
        if not finite[r]:
            continue  # zeros
        factor = threshold / norms[r] if norms[r] > threshold else 1.0
        for v, x in enumerate(zeroed):
            out[v][r] = factor * x[r]
    return out


def clipping(
    per_replica: Sequence[np.ndarray],
    *,
    f: int = 0,
    inner: str | Callable = "trimmed_mean",
    threshold: float = 1.0,
    report: bool = False,
):
    """`inner` on the replicas scaled to full-vector norm <= `threshold`."""
    clipped = _clip_to(_as_float64(per_replica), lambda norms: threshold)
    return _inner(inner)(clipped, f=f, report=report)


def arc_clipped_count(n: int, f: int) -> int:
    """ARC's k = floor(2 * (f / n) * (n - f)), in exact arithmetic."""
    return math.floor(Fraction(2 * f, n) * (n - f))


def arc(
    per_replica: Sequence[np.ndarray],
    *,
    f: int = 0,
    inner: str | Callable = "trimmed_mean",
    report: bool = False,
):
    """`inner` on the replicas clipped to the (k+1)-th largest norm, k = ARC's."""
    x = _as_float64(per_replica)
    k = arc_clipped_count(x[0].shape[0], f)
    clipped = _clip_to(x, lambda norms: np.sort(norms)[::-1][k])
    return _inner(inner)(clipped, f=f, report=report)


REFERENCES: dict[str, Callable[..., Any]] = {
    "mean": mean,
    "median": median,
    "trimmed_mean": trimmed_mean,
    "krum": krum,
    "multi_krum": multi_krum,
    "bulyan": bulyan,
    "geometric_median": geometric_median,
    "centered_clipping": centered_clipping,
    "mda": mda,
    "meamed": meamed,
    "smea": smea,
    "caf": caf,
    "monna": monna,
    "nnm": nnm,
    "bucketing": bucketing,
    "clipping": clipping,
    "arc": arc,
}

WRAPPERS = ("nnm", "bucketing", "clipping", "arc")


def condition(name: str, n: int, f: int, **config: Any) -> bool:
    """The spec's condition on n and f (what `check` must accept)."""
    if n < 1 or f < 0:
        return False
    if name == "mean":
        return f == 0
    if name in (
        "median",
        "trimmed_mean",
        "geometric_median",
        "centered_clipping",
        "meamed",
        "caf",
    ):
        return n > 2 * f
    if name == "monna":
        return n > 2 * f and config.get("reference", 0) < n
    if name == "smea":
        return n > 2 * f and math.comb(n, f) <= 20_000
    if name == "mda":
        return n > 2 * f and math.comb(n, f) <= 200_000
    if name == "krum":
        return n >= 2 * f + 3
    if name == "multi_krum":
        m = config.get("m")
        return n >= 2 * f + 3 and (m is None or 1 <= m <= n - f)
    if name == "bulyan":
        return n >= 4 * f + 3
    if name == "nnm":
        inner, inner_config = config.get("inner", ("trimmed_mean", {}))
        return n > 2 * f and condition(inner, n, f, **inner_config)
    if name == "bucketing":
        inner, inner_config = config.get("inner", ("trimmed_mean", {}))
        buckets = math.ceil(n / config.get("bucket_size", 2))
        return condition(inner, buckets, f, **inner_config)
    if name == "clipping":
        inner, inner_config = config.get("inner", ("trimmed_mean", {}))
        return condition(inner, n, f, **inner_config)
    if name == "arc":
        inner, inner_config = config.get("inner", ("trimmed_mean", {}))
        return n > 2 * f and condition(inner, n, f, **inner_config)
    raise KeyError(f"no condition for {name!r}")


# ------------------------------------------------- calling from a TF rule

# The TF rules' constructor arguments that do not change the result.
_NO_EFFECT = {"num_byzantine", "jit_compile", "seed"}
# TF argument name -> reference keyword, where they differ.
_RENAMED = {"aggregator": "inner"}


def rule_id(rule: Any) -> str:
    """The string id a TF rule is registered under."""
    from keras_psdist import aggregators

    return aggregators.serialize(rule)["class_name"]


def spec_config(rule: Any) -> tuple[str, dict[str, Any]]:
    """`(id, reference keywords)` for a TF rule, inner rules as `(id, keywords)`.

    Raises:
        KeyError: for a constructor argument this module does not know, so a
            new option cannot silently go untested.
    """
    from keras_psdist import aggregators

    name = rule_id(rule)
    params = set(inspect.signature(REFERENCES[name]).parameters)
    out = {}
    for key, value in rule.get_config().items():
        if key in _NO_EFFECT:
            continue
        key = _RENAMED.get(key, key)
        if key not in params:
            raise KeyError(f"{name}: the reference has no argument for {key!r}")
        if key == "inner":
            value = spec_config(aggregators.get(value))
        out[key] = value
    return name, out


def _build(name: str, config: dict[str, Any], f: int) -> Callable[..., Any]:
    config = dict(config)
    if "inner" in config:
        config["inner"] = _build(*config["inner"], f)
    return functools.partial(REFERENCES[name], f=f, **config)


def reference_for(rule: Any) -> Callable[..., Any]:
    """The reference with a (bound) TF rule's configuration and f."""
    return _build(*spec_config(rule), rule.f)


def identical_output(rule: Any, value: Sequence[np.ndarray]) -> Values:
    """What a rule returns when every replica sends `value` (one array per variable).

    `value` itself, except that a static clipping anywhere in the chain of
    wrappers scales it to norm <= its threshold (no other rule moves n
    identical inputs; ARC's threshold is then their common norm).
    """
    out = _as_float64(value)
    name, config = spec_config(rule)
    while True:
        if name == "clipping":
            threshold = config.get("threshold", 1.0)
            clipped = _clip_to([x[None] for x in out], lambda _, t=threshold: t)
            out = [x[0] for x in clipped]
        if name not in WRAPPERS:
            return out
        name, config = config.get("inner", ("trimmed_mean", {}))


def bucket_orders(n: int, size: int) -> Iterator[list[int]]:
    """One permutation per way of splitting n replicas into buckets.

    Full buckets first, the smaller remainder bucket last, as a permutation
    would give; bucket order and order within a bucket are left out (they
    change nothing for a symmetric inner rule).
    """

    def full(rest):
        if not rest:
            yield []
            return
        first, others = rest[0], rest[1:]
        for mates in itertools.combinations(others, size - 1):
            left = [r for r in others if r not in mates]
            for tail in full(left):
                yield [first, *mates, *tail]

    remainder = n % size
    for last in itertools.combinations(range(n), remainder):
        for head in full([r for r in range(n) if r not in last]):
            yield head + list(last)


def candidates(rule: Any, per_replica: Sequence[np.ndarray], **extra: Any) -> Iterator:
    """Every `(values, report)` the rule may produce for these inputs, lazily.

    One for a deterministic rule; for `bucketing`, which permutes the replicas
    at random, one per bucket assignment (a bucketing nested inside another
    wrapper is not enumerated); for `smea`, one per subset tied for the
    smallest top eigenvalue (`smea_ties`).
    """
    ref = reference_for(rule)
    if rule_id(rule) == "smea":
        # Subsets tied in exact arithmetic: either rounding may pick any.
        for subset in smea_ties(per_replica, rule.f):
            yield ref(per_replica, report=True, subset=subset, **extra)
        return
    if rule_id(rule) != "bucketing":
        yield ref(per_replica, report=True, **extra)
        return
    n = np.shape(per_replica[0])[0]
    for order in bucket_orders(n, ref.keywords.get("bucket_size", 2)):
        yield ref(per_replica, permutation=order, report=True, **extra)


# ------------------------------------------------------ comparing with TF

# Reports the spec defines exactly (it names `extreme_fraction` without a formula).
COMPARED_REPORTS = ("selected", "weight", "clipped")


def _close(got, want, scale) -> bool:
    # float32 against float64: relative, and absolute at the inputs' scale.
    return np.shape(got) == np.shape(want) and np.allclose(
        got, want, rtol=1e-4, atol=1e-4 * scale, equal_nan=True
    )


def same(
    values: Sequence[np.ndarray], other: Sequence[np.ndarray], scale: float
) -> bool:
    """Two results agree to float32 precision at the inputs' `scale`."""
    return all(_close(a, b, scale) for a, b in zip(values, other, strict=True))


def _mismatch(values, report, candidate, scale):
    """Why `values`/`report` differ from one reference candidate, or None."""
    expected, expected_report = candidate
    for v, (got, want) in enumerate(zip(values, expected, strict=True)):
        if not _close(got, want, scale):
            return f"variable {v}: got\n{got}\nexpected\n{want}"
    for key in COMPARED_REPORTS:
        if report is None or key not in expected_report:
            continue
        want, got = expected_report[key], np.asarray(report[key])
        known = ~np.isnan(want)  # NaN: too close to a threshold to call
        if not np.allclose(got[known], want[known], atol=1e-4):
            return f"report {key!r}: got {got}, expected {want}"
    return None


def assert_matches(
    rule: Any,
    per_replica: Sequence[np.ndarray],
    values: Sequence[np.ndarray],
    report: dict[str, np.ndarray] | None = None,
    scale: float | None = None,
    **extra: Any,
) -> None:
    """Asserts a TF rule's output equals its reference's (one of them, for bucketing).

    Args:
        rule: The bound TF rule.
        per_replica: Its inputs, one `(n, *shape)` array per variable.
        values: Its outputs, one array per variable.
        report: Its report, or `None` not to compare it.
        scale: The honest inputs' magnitude, for the absolute tolerance;
            defaults to the largest finite input.
        **extra: Passed to the reference (e.g. `center`).
    """
    if scale is None:
        finite = [x[np.isfinite(x)] for x in per_replica]
        scale = max([1e-3] + [float(np.abs(x).max()) for x in finite if x.size])
    reasons = []
    for candidate in candidates(rule, per_replica, **extra):
        reason = _mismatch(values, report, candidate, scale)
        if reason is None:
            return
        reasons.append(reason)
    which = (
        f" under any of {len(reasons)} bucket assignments" if len(reasons) > 1 else ""
    )
    raise AssertionError(f"{rule!r} disagrees with its reference{which}: {reasons[0]}")
