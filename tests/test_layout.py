"""The package's layout holds: imports go one way, and each folder says what
it holds (docs/architecture.md, "The layout").

Imports are read from the source (function-level ones included), so a
circle hidden inside a function still counts.
"""

import ast
import pathlib
from collections import defaultdict

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
