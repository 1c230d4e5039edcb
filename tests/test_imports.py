"""The package's files import each other without a cycle.

A cycle between two files (a imports b, b imports a, at the top or inside a function) means
one of them holds a definition that belongs in the other's layer; it also makes the import
order matter. The graph is read from the source with `ast`, every import counted (those
inside functions too), a package's ``__init__.py`` a node of its own (an edge to it only for
the names it defines: a sibling's ``from pkg import mod`` is an edge to mod alone).
"""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]


def _module_name(path, root):
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package):
    """`{module: {modules of the package it imports}}` for the package directory `package`
    (absolute and relative imports, at any depth of the file)."""
    files = {_module_name(path, package): path for path in package.rglob("*.py")}
    graph = {name: set() for name in files}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parents = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(parents + ([base] if base else []))
                # `from pkg import mod` imports the file mod; `from pkg import name`, pkg's own
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target not in (name, package.name):
                    graph[name].add(target)
    return graph


def cycles(graph):
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..c import X\n")
    (package / "c.py").write_text("import pkg.a\nX = 1\n")
    (package / "d.py").write_text("from pkg import a, c\n")   # imports into the cycle only
    graph = import_graph(package)
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.d"] == {"pkg.a", "pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_the_package_has_no_import_cycle():
    graph = import_graph(REPO / "grpo_jax")
    assert len(graph) > 100   # every file was read
    assert cycles(graph) == []
