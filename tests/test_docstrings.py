"""Every `Examples:` block in the library's docstrings runs and prints what
it shows (the docstrings are documentation users copy from)."""

import doctest
import importlib
import pkgutil

import pytest

import keras_psdist

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(keras_psdist.__path__, "keras_psdist.")
    if not info.name.endswith("__main__")
)


@pytest.mark.parametrize("name", ["keras_psdist", *MODULES])
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0, f"{result.failed} docstring examples failed in {name}"
