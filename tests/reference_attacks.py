"""numpy reference implementations of every attack, in float64.

A gradient attack's reference takes `stacked`, an array of shape `(n, ...)`
holding one variable's true-scale values of the n replicas, and the attacked
replica ids, and returns the array the aggregator should see. The TF attacks
must match them. Written independently of `keras_psdist.attacks`: the ALIE
z comes from scipy, not `statistics.NormalDist`.

Min-Max, Min-Sum and ROP (`WHOLE_MODEL`) work on distances between whole
gradients, so their references take `per_replica`, one such array per
variable, and return one array per variable; Min-Max's and Min-Sum's factor
is found by a search (as the authors' code), not by the TF attack's closed
form; ROP's reference also takes the last aggregate, `previous`.

The adaptive attacks (`ADAPTIVE`) search their factor over the whole model,
so their references take `per_replica`, one such array per variable, and
`rule`, a numpy rule from `tests/reference.py` (e.g.
`functools.partial(reference.median, f=2)`), and return one array per
variable.
"""

from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import norm


def _honest(stacked: np.ndarray, replicas) -> np.ndarray:
    mask = np.ones(len(stacked), dtype=bool)
    mask[list(replicas)] = False
    return stacked[mask].astype(np.float64)


def _replace(stacked: np.ndarray, replicas, forged) -> np.ndarray:
    out = stacked.astype(np.float64)  # a copy
    out[list(replicas)] = forged
    return out


def sign_flip(stacked, replicas, scale=1.0):
    return _replace(
        stacked, replicas, -scale * stacked[list(replicas)].astype(np.float64)
    )


def scale(stacked, replicas, factor):
    return _replace(
        stacked, replicas, factor * stacked[list(replicas)].astype(np.float64)
    )


def gaussian_noise(stacked, replicas, stddev=1.0, seed=None):
    rng = np.random.default_rng(seed)
    noise = rng.normal(0.0, stddev, size=(len(replicas), *stacked.shape[1:]))
    return _replace(stacked, replicas, noise)


def non_finite(stacked, replicas, value="nan"):
    return _replace(stacked, replicas, float(value))


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s z_max: s = floor(n/2 + 1) - f in [1, n-1], Phi^-1((n-s)/n)."""
    s = int(np.clip(np.floor(n / 2 + 1) - f, 1, n - 1))
    return float(norm.ppf((n - s) / n))


def alie(stacked, replicas, z=None):
    if z is None:
        z = alie_z(len(stacked), len(replicas))
    honest = _honest(stacked, replicas)
    forged = honest.mean(axis=0) - z * honest.std(axis=0, ddof=0)
    return _replace(stacked, replicas, forged)


def ipm(stacked, replicas, epsilon=0.1):
    return _replace(
        stacked, replicas, -epsilon * _honest(stacked, replicas).mean(axis=0)
    )


def mimic(stacked, replicas, target=None):
    """Every attacked row becomes row `target` (default: the lowest honest id)."""
    if target is None:
        target = min(set(range(len(stacked))) - set(replicas))
    return _replace(stacked, replicas, stacked[target].astype(np.float64))


# ------------------------------------------------------ adaptive attacks


def _factor_grid(low, high, num_candidates, default):
    """0, `num_candidates` geometric steps from `low` to `high`, the default."""
    grid = np.geomspace(low, high, num_candidates)
    return np.unique(np.concatenate([[0.0], grid, [default]]))


def factor_search(
    per_replica: Sequence[np.ndarray],
    replicas,
    rule: Callable,
    factors: np.ndarray,
    forge: Callable[[np.ndarray, float, np.ndarray], np.ndarray],
):
    """`(best factor, damages)`: each factor's squared distance between the
    rule's output and the honest mean, summed over variables. The first
    strictly largest wins; a NaN damage never does."""
    honest = [_honest(x, replicas) for x in per_replica]
    means = [h.mean(axis=0) for h in honest]
    damages = []
    best, best_damage = factors[0], -np.inf
    for factor in factors:
        attacked = [
            _replace(
                x, replicas, forge(h, factor, x[list(replicas)].astype(np.float64))
            )
            for x, h in zip(per_replica, honest, strict=True)
        ]
        out = rule(attacked)
        damage = sum(
            float(np.sum((np.asarray(v, np.float64) - m) ** 2))
            for v, m in zip(out, means, strict=True)
        )
        damages.append(damage)
        if damage > best_damage:
            best, best_damage = factor, damage
    return float(best), np.array(damages)


def _alie_forge(honest, z, own=None):
    return honest.mean(axis=0) - z * honest.std(axis=0, ddof=0)


def _ipm_forge(honest, epsilon, own=None):
    return -epsilon * honest.mean(axis=0)


def _label_flip_forge(honest, scale, own):
    mu = honest.mean(axis=0)
    return mu + scale * (own.mean(axis=0) - mu)


def optimal_label_flip_factors(
    n, f, num_classes=None, min_scale=0.5, max_scale=50.0, num_candidates=16
):
    return _factor_grid(min_scale, max_scale, num_candidates, 1.0)


def optimal_label_flip(per_replica, replicas, rule, num_classes, **grid):
    """The flipped gradients' departure from the honest mean, scaled by the
    factor of largest damage against `rule` (the values given for the
    attacked replicas stand for their gradients of the flipped data)."""
    n, f = len(per_replica[0]), len(replicas)
    factors = optimal_label_flip_factors(n, f, **grid)
    scale, _ = factor_search(per_replica, replicas, rule, factors, _label_flip_forge)
    return [
        _replace(
            x,
            replicas,
            _label_flip_forge(
                _honest(x, replicas), scale, x[list(replicas)].astype(np.float64)
            ),
        )
        for x in per_replica
    ]


def optimal_alie_factors(n, f, min_z=0.1, max_z=10.0, num_candidates=16):
    return _factor_grid(min_z, max_z, num_candidates, alie_z(n, f))


def optimal_ipm_factors(n, f, min_epsilon=0.01, max_epsilon=100.0, num_candidates=16):
    return _factor_grid(min_epsilon, max_epsilon, num_candidates, 0.1)


def optimal_alie(per_replica, replicas, rule, **grid):
    """ALIE with the z of largest damage against `rule` (see `factor_search`)."""
    n, f = len(per_replica[0]), len(replicas)
    factors = optimal_alie_factors(n, f, **grid)
    z, _ = factor_search(per_replica, replicas, rule, factors, _alie_forge)
    return [alie(x, replicas, z=z) for x in per_replica]


def optimal_ipm(per_replica, replicas, rule, **grid):
    """IPM with the epsilon of largest damage against `rule`."""
    n, f = len(per_replica[0]), len(replicas)
    factors = optimal_ipm_factors(n, f, **grid)
    epsilon, _ = factor_search(per_replica, replicas, rule, factors, _ipm_forge)
    return [
        _replace(x, replicas, _ipm_forge(_honest(x, replicas), epsilon))
        for x in per_replica
    ]


def _whole(per_replica, replicas):
    """The honest replicas' gradients as rows over the whole model, and
    their mean."""
    rows = np.concatenate(
        [_honest(x, replicas).reshape(len(x) - len(replicas), -1) for x in per_replica],
        axis=1,
    )
    return rows, rows.mean(axis=0)


def _perturbation(rows, mu, perturbation):
    if perturbation == "unit_vector":
        norm_mu = np.linalg.norm(mu)
        return mu / norm_mu if norm_mu > 0 else np.zeros_like(mu)
    if perturbation == "std":
        return rows.std(axis=0, ddof=1) if len(rows) > 1 else np.zeros_like(mu)
    return np.sign(mu)


def _largest_passing(passes):
    """The largest gamma >= 0 with `passes(gamma)`, by doubling then
    halving as the authors' code does (there from 10 down to 1e-5; here to
    1e-12 of the bracket, so that it matches a closed form)."""
    high = 1.0
    while passes(high) and high < 1e12:
        high *= 2
    low = 0.0
    while high - low > 1e-12 * max(1.0, high):
        middle = (low + high) / 2
        low, high = (middle, high) if passes(middle) else (low, middle)
    return low


def _distance_bounded(per_replica, replicas, perturbation, passes):
    rows, mu = _whole(per_replica, replicas)
    p = _perturbation(rows, mu, perturbation)
    gamma = _largest_passing(lambda g: passes(rows, mu - g * p))
    forged = mu - gamma * p
    out, start = [], 0
    for x in per_replica:
        size = int(np.prod(x.shape[1:]))
        piece = forged[start : start + size].reshape(x.shape[1:])
        start += size
        out.append(_replace(x, replicas, piece))
    return out


def _pairwise(rows):
    return np.linalg.norm(rows[:, None, :] - rows[None, :, :], axis=-1)


def min_max(per_replica, replicas, perturbation="unit_vector"):
    """Shejwalkar and Houmansadr's Min-Max: no farther from any honest
    gradient than the two farthest apart."""
    bound = _pairwise(_whole(per_replica, replicas)[0]).max()
    return _distance_bounded(
        per_replica,
        replicas,
        perturbation,
        lambda rows, forged: np.linalg.norm(rows - forged, axis=1).max() <= bound,
    )


def min_sum(per_replica, replicas, perturbation="unit_vector"):
    """Min-Sum as the authors' code: summed squared distances no larger than
    the smallest such sum of an honest gradient."""
    bound = (_pairwise(_whole(per_replica, replicas)[0]) ** 2).sum(axis=1).min()
    return _distance_bounded(
        per_replica,
        replicas,
        perturbation,
        lambda rows, forged: (
            (np.linalg.norm(rows - forged, axis=1) ** 2).sum() <= bound
        ),
    )


def rop(
    per_replica,
    replicas,
    z=None,
    reference_weight=0.9,
    location=1.0,
    angle=90.0,
    previous=None,
):
    """Ozfatura et al.'s ROP, as the authors' `reloc`: `previous`, the last
    aggregate over the whole model (None: the first step, zeros)."""
    rows, mu = _whole(per_replica, replicas)
    n = len(per_replica[0])
    z = alie_z(n, len(replicas)) if z is None else z
    if previous is None:
        prev, reference = np.zeros_like(mu), mu
    else:
        prev = np.concatenate([np.ravel(p) for p in previous]).astype(np.float64)
        reference = reference_weight * prev + (1 - reference_weight) * mu
    p = np.ones_like(mu)
    if reference @ reference > 0:
        p = p - reference * (p @ reference) / (reference @ reference)
        unit_reference = reference / np.linalg.norm(reference)
    else:
        unit_reference = np.zeros_like(mu)
    p = p / np.linalg.norm(p) if np.linalg.norm(p) > 0 else p
    theta = np.radians(angle)
    p = p * np.sin(theta) + unit_reference * np.cos(theta)
    forged = location * prev + (1 - location) * mu
    if np.linalg.norm(p) > 0:
        forged = forged + z * p / np.linalg.norm(p)
    out, start = [], 0
    for x in per_replica:
        size = int(np.prod(x.shape[1:]))
        out.append(
            _replace(x, replicas, forged[start : start + size].reshape(x.shape[1:]))
        )
        start += size
    return out


def label_flip(stacked, replicas, num_classes):
    """Gradients pass through: the attack is on the data (see `flip_labels`)."""
    return stacked.astype(np.float64)


def flip_labels(y: np.ndarray, num_classes: int) -> np.ndarray:
    """Integer class ids -> num_classes - 1 - y; one-hot rows -> the mirror class."""
    if np.issubdtype(y.dtype, np.integer):
        return (num_classes - 1 - y.astype(np.int64)).astype(y.dtype)
    mirrored = np.zeros_like(y)
    for c in range(num_classes):
        mirrored[..., num_classes - 1 - c] = y[..., c]
    return mirrored


REFERENCES = {
    "sign_flip": sign_flip,
    "scale": scale,
    "gaussian_noise": gaussian_noise,
    "non_finite": non_finite,
    "alie": alie,
    "ipm": ipm,
    "optimal_alie": optimal_alie,
    "optimal_ipm": optimal_ipm,
    "optimal_label_flip": optimal_label_flip,
    "mimic": mimic,
    "min_max": min_max,
    "min_sum": min_sum,
    "rop": rop,
    "label_flip": label_flip,
}
# References over the whole model (every variable's gradient joined).
WHOLE_MODEL = {"min_max", "min_sum", "rop"}
# References over the whole model that take the numpy `rule`.
ADAPTIVE = {"optimal_alie", "optimal_ipm", "optimal_label_flip"}
# Their candidate factors: `(n, f, **grid) -> ascending array`.
FACTORS = {
    "optimal_alie": optimal_alie_factors,
    "optimal_ipm": optimal_ipm_factors,
    "optimal_label_flip": optimal_label_flip_factors,
}
FORGE = {
    "optimal_alie": _alie_forge,
    "optimal_ipm": _ipm_forge,
    "optimal_label_flip": _label_flip_forge,
}
