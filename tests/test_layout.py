"""The package's layout holds: imports go one way, and each folder says what
it holds (docs/architecture.md, "The layout").

Imports are read from the source (function-level ones included), so a
circle hidden inside a function still counts.
"""

import ast
import pathlib
from collections import defaultdict

import pytest

import keras_psdist

PACKAGE = pathlib.Path(keras_psdist.__file__).parent


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph():
    """`module -> modules of keras_psdist it imports`, anywhere in its code."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "keras_psdist"
            ):
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    graph[name].add(child if child in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name].update(
                    a.name for a in node.names if a.name.startswith("keras_psdist")
                )
        # The package's lazy `__init__` names the public API, from the top.
        graph[name].discard("keras_psdist")
        graph[name].discard(name)
    return modules, graph


def _circles(nodes, graph):
    """The strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in nodes:
                continue
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def _top(module):
    """`keras_psdist.distribute.extended` -> `distribute`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_no_module_imports_itself_through_others():
    modules, graph = _import_graph()
    assert _circles(set(modules) - {"keras_psdist"}, graph) == []


def test_the_extended_keeps_to_its_hooks():
    """`PSExtended` asks its mode for the run's services (heartbeats, slots,
    the server watch, its training) and imports none of the cluster code
    that runs them (`modes/services.py` does)."""
    _, graph = _import_graph()
    imported = graph["keras_psdist.distribute.extended"]
    assert not imported & {
        "keras_psdist.cluster.elastic",
        "keras_psdist.cluster.liveness",
        "keras_psdist.cluster.task_loss",
    }, sorted(imported)


def test_no_two_folders_import_each_other():
    modules, graph = _import_graph()
    folders = defaultdict(set)
    for module, imported in graph.items():
        if module in ("keras_psdist", "keras_psdist.__main__"):
            continue
        for other in imported:
            if _top(module) != _top(other):
                folders[_top(module)].add(_top(other))
    assert (
        _circles(set(folders) | {t for v in folders.values() for t in v}, folders) == []
    )


def test_the_top_level_holds_only_the_public_api_and_the_tf_gate():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == [
        "__init__",
        "__main__",
        "_tf",
        "callbacks",
        "count_rules",
        "dense_choice",
        "devices",
        "errors",
        "evaluator",
        "families",
        "heterogeneity",
        "membership",
        "partitioners",
        "placement",
        "registry",
        "routing",
        "spelling",
        "synchronization",
    ]


def test_every_folder_says_what_its_modules_do():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert doc, f"{init.relative_to(PACKAGE)} has no docstring"


def _type_checking_names():
    """The names `keras_psdist/__init__.py` imports for type checkers."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    [block] = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
    ]
    return {
        alias.asname or alias.name
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_the_public_surface_is_one_table():
    # What type checkers see, what `import *` gives and what resolves at run
    # time are the same names: `_PUBLIC`'s.
    public = set(keras_psdist._PUBLIC)
    assert _type_checking_names() == public
    assert set(keras_psdist.__all__) == public | {"__version__"}
    assert public <= set(dir(keras_psdist))
    for name in sorted(public):
        value = getattr(keras_psdist, name)
        module = keras_psdist._PUBLIC[name]
        if module == f"keras_psdist.{name}":
            assert value.__name__ == module
        else:
            assert value.__module__ == module


def test_the_docs_public_modules_resolve():
    # The docs use `kpd.spelling` and `kpd.cluster`.
    assert keras_psdist.spelling.__name__ == "keras_psdist.spelling"
    assert keras_psdist.cluster.__name__ == "keras_psdist.cluster"


@pytest.mark.parametrize(
    "old, name, new",
    [
        ("synchronization", "DenseChoice", "keras_psdist.dense_choice"),
        ("routing", "register_row_separable", "keras_psdist.partitioners"),
        ("routing", "is_row_separable", "keras_psdist.partitioners"),
        ("membership", "AllButOne", "keras_psdist.count_rules"),
        ("membership", "count", "keras_psdist.count_rules"),
    ],
)
def test_a_deprecated_name_warns_and_says_its_removal_version(old, name, new):
    import importlib
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(getattr(keras_psdist, old), name)
    [warning] = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert new in str(warning.message)
    assert f"removed in {keras_psdist._DEPRECATED[old]}" in str(warning.message)
    assert value is getattr(importlib.import_module(new), name)
    assert old not in keras_psdist.__all__


def test_an_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'spellings'"):
        keras_psdist.spellings  # noqa: B018
