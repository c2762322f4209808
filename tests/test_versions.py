"""The supported version range says the same thing everywhere.

Declared in `setup.cfg`, checked on import by `keras_psdist._tf`, tested per
pair by `noxfile.py` (whose oldest pair `.ci/run` runs), stated in the README.
"""

import ast
import configparser
import re
from pathlib import Path

import pytest

from keras_psdist import _tf

ROOT = Path(__file__).resolve().parent.parent


def _setup_cfg():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config


def _requirements(config):
    """`name -> "specifier"` over install_requires and every extra."""
    lines = config["options"]["install_requires"].splitlines()
    for _, block in config["options.extras_require"].items():
        lines += block.splitlines()
    found = {}
    for line in lines:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-\[\]]+)\s*(>=[^#]*)", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def _as_range(specifier):
    """`">=2.19,<2.22"` -> `((2, 19), (2, 22))`."""
    match = re.fullmatch(r">=(\d+)\.(\d+),<(\d+)\.(\d+)", specifier)
    assert match, f"not a `>=a.b,<c.d` range: {specifier!r}"
    a, b, c, d = map(int, match.groups())
    return (a, b), (c, d)


def _nox_pairs():
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and getattr(node.targets[0], "id", "") == "PAIRS"
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("noxfile.py defines no PAIRS")


def _minor(version):
    return tuple(int(p) for p in version.split(".")[:2])


def test_metadata_declares_the_range_the_import_gate_checks():
    requirements = _requirements(_setup_cfg())
    assert _as_range(requirements["keras"]) == _tf.SUPPORTED_KERAS
    for name in ("tensorflow-cpu", "tensorflow[and-cuda]", "tensorboard", "tf_keras"):
        assert _as_range(requirements[name]) == _tf.SUPPORTED_TF, name


def test_nox_tests_both_ends_of_the_range_and_every_python_declared():
    pairs = _nox_pairs()
    tf_low, tf_high = _tf.SUPPORTED_TF
    keras_low, keras_high = _tf.SUPPORTED_KERAS
    tf_minors = {_minor(tf) for _, tf, _ in pairs}
    # Every TensorFlow minor of the range, the oldest pair first.
    assert tf_minors == {(tf_low[0], m) for m in range(tf_low[1], tf_high[1])}
    assert _minor(pairs[0][1]) == tf_low and _minor(pairs[0][2]) == keras_low
    assert (keras_high[0], keras_high[1] - 1) in {_minor(k) for _, _, k in pairs}
    declared = set(
        re.findall(
            r"Programming Language :: Python :: (3\.\d+)",
            _setup_cfg()["metadata"]["classifiers"],
        )
    )
    assert declared == {python for python, _, _ in pairs}


def test_readme_states_the_matrix():
    readme = (ROOT / "README.md").read_text()
    for python, tf, keras in _nox_pairs():
        assert re.search(
            rf"\|\s*{re.escape(tf)}\s*\|\s*{re.escape(keras)}\s*\|[^\n]*{re.escape(python)}",
            readme,
        ), f"README's version table has no row for TF {tf} / Keras {keras} / {python}"


@pytest.mark.parametrize(
    "package, version, supported",
    [
        ("keras", "3.9.2", _tf.SUPPORTED_KERAS),
        ("keras", "3.16.0", _tf.SUPPORTED_KERAS),
        ("tensorflow", "2.18.1", _tf.SUPPORTED_TF),
        ("tensorflow", "2.22.0rc0", _tf.SUPPORTED_TF),
    ],
)
def test_an_unsupported_version_is_refused_on_import_naming_it(
    package, version, supported
):
    with pytest.raises(
        ImportError, match=rf"Received: {package}=={re.escape(version)}"
    ):
        _tf._check_version(package, version, supported)


@pytest.mark.parametrize(
    "package, version, supported",
    [
        ("keras", "3.10.0", _tf.SUPPORTED_KERAS),
        ("keras", "3.15.1", _tf.SUPPORTED_KERAS),
        ("tensorflow", "2.19.0", _tf.SUPPORTED_TF),
        ("tensorflow", "2.21.0rc1", _tf.SUPPORTED_TF),
    ],
)
def test_a_supported_version_passes(package, version, supported):
    _tf._check_version(package, version, supported)
