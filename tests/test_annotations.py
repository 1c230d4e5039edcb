"""The public functions of grpo_jax/training/ carry type annotations, and their count does
not regress.

A public function is a module-level function or a method whose name has no leading
underscore (nested functions and dunder methods are not counted); it is annotated when
every parameter (``self``/``cls`` aside, ``*args``/``**kwargs`` included) and its return
are. The count is read from the source with `ast`. Run this file as a script to print the
counts per file: ``python tests/test_annotations.py``.
"""

import ast
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAINING = REPO / "grpo_jax" / "training"

# The unannotated public functions training/ may hold: none, every one is annotated.
UNANNOTATED_AT_MOST = 0


def public_functions(tree: ast.Module) -> list[tuple[str | None, ast.FunctionDef]]:
    """`(class name or None, def)` for each public module-level function and public method
    (of classes at any depth) of `tree`."""
    found = []

    def visit(body: list[ast.stmt], owner: str | None) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("_"):
                    found.append((owner, node))
            elif isinstance(node, ast.ClassDef):
                visit(node.body, node.name)

    visit(tree.body, None)
    return found


def is_annotated(function: ast.FunctionDef, method: bool) -> bool:
    """Whether every parameter of `function` and its return are annotated; a method's
    first parameter (self, cls) is exempt unless it is a staticmethod."""
    args = function.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod"
                 for d in function.decorator_list)
    if method and not static and params:
        params = params[1:]
    params += [p for p in (args.vararg, args.kwarg) if p is not None]
    return function.returns is not None and all(p.annotation is not None for p in params)


def counts(directory: pathlib.Path) -> dict[str, tuple[int, int]]:
    """`{file name: (public functions, unannotated ones)}` for the .py files of `directory`."""
    result = {}
    for path in sorted(directory.glob("*.py")):
        functions = public_functions(ast.parse(path.read_text()))
        missing = sum(not is_annotated(f, owner is not None) for owner, f in functions)
        result[path.name] = (len(functions), missing)
    return result


def test_the_counter_reads_functions_methods_and_their_annotations(tmp_path):
    (tmp_path / "m.py").write_text(
        "def a(x: int) -> int: ...\n"
        "def b(x: int): ...\n"                   # return missing
        "def _private(x): ...\n"                 # not public
        "def c(*args, **kw: int) -> None: ...\n"  # *args missing
        "class K:\n"
        "    def __init__(self, x): ...\n"       # dunder: not public
        "    def m(self, y: int) -> int:\n"
        "        def nested(z): ...\n"           # nested: not counted
        "    @staticmethod\n"
        "    def s(self) -> None: ...\n"         # a staticmethod's first parameter counts
        "    @classmethod\n"
        "    def k(cls) -> 'K': ...\n")
    assert counts(tmp_path) == {"m.py": (6, 3)}


def test_unannotated_public_functions_in_training_do_not_grow():
    total, missing = map(sum, zip(*counts(TRAINING).values()))
    assert total > 200   # every file was read
    assert missing <= UNANNOTATED_AT_MOST, (
        f"{missing} public functions in grpo_jax/training/ lack annotations (at most "
        f"{UNANNOTATED_AT_MOST}): annotate every parameter and the return of the new ones "
        f"(`python tests/test_annotations.py` lists the count per file)")


if __name__ == "__main__":
    directory = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else TRAINING
    per_file = counts(directory)
    for name, (n, missing) in per_file.items():
        print(f"{name:24s} {n:4d} public, {missing:4d} unannotated")
    total, missing = map(sum, zip(*per_file.values()))
    print(f"total: {total - missing} of {total} public functions annotated, {missing} not")
