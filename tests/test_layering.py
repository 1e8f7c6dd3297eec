"""The package's shape: the library never imports the lab, no modules import each other
in a loop, no module is named after a standard-library module, and modules and
functions stay small enough to read."""

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gradsift"
MODULES = sorted(SRC.rglob("*.py"))
# ``python -m gradsift`` is the command line: __main__ belongs with the lab
LIBRARY = [p for p in MODULES if "lab" not in p.relative_to(SRC).parts and p.stem != "__main__"]
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60  # of code: a docstring is read apart from it


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {_module_name(p): p for p in MODULES}


def _imports(path: Path) -> set[str]:
    """What ``path`` imports anywhere (at the top, in a function, under
    ``TYPE_CHECKING``): ``from p import m`` names the package's module ``p.m`` where
    there is one, else ``p`` (for a package, its face, which every import of one of
    its submodules runs anyway)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in NAMES
                      else node.module for a in node.names}  # fmt: skip
    return names


def test_the_scan_sees_both_halves():
    assert len(LIBRARY) > 10 and len(MODULES) - len(LIBRARY) > 10


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(SRC)))
def test_library_never_imports_the_lab(path):
    lab = sorted(n for n in _imports(path) if n == "gradsift.lab" or n.startswith("gradsift.lab."))
    assert not lab, f"{path.name} imports {lab}"


def _imported_modules(path: Path) -> set[str]:
    """The package's modules that ``path`` imports (``_imports``), itself left out."""
    return (_imports(path) & NAMES.keys()) - {_module_name(path)}


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of each loop of imports (Tarjan's strongly connected components of
    more than one module), each sorted."""
    order, low, stack, loops = {}, {}, [], []

    def visit(name):
        order[name] = low[name] = len(order)
        stack.append(name)
        for nxt in graph[name]:
            if nxt not in order:
                visit(nxt)
                low[name] = min(low[name], low[nxt])
            elif nxt in stack:
                low[name] = min(low[name], order[nxt])
        if low[name] == order[name]:
            component = stack[stack.index(name) :]
            del stack[stack.index(name) :]
            if len(component) > 1:
                loops.append(sorted(component))

    for name in sorted(graph):
        if name not in order:
            visit(name)
    return sorted(loops)


def test_no_modules_import_each_other_in_a_loop():
    assert _loops({n: _imported_modules(p) for n, p in NAMES.items()}) == []


def test_a_loop_of_imports_is_seen():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert _loops(graph) == [["a", "b", "c"], ["d", "e"]]


@functools.cache
def _loaded_by_the_library() -> tuple[str, ...]:
    """Every module that importing the library loads, in a fresh process (once)."""
    code = (
        "import json, sys, gradsift, gradsift.distributed, gradsift.integrations; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return tuple(json.loads(out.stdout))


def _loaded_after_import(tops: tuple[str, ...]) -> list[str]:
    """Modules named ``t`` or ``t.*`` for ``t`` in ``tops`` that importing the library
    loads."""
    loaded = _loaded_by_the_library()
    return [m for m in loaded if any(m == t or m.startswith(t + ".") for t in tops)]


def test_library_import_loads_no_lab_module():
    assert _loaded_after_import(("gradsift.lab",)) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_shadows_the_standard_library(path):
    assert path.stem not in sys.stdlib_module_names, path


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_modules_and_functions_are_small(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, (
        f"{path.name}: {len(text.splitlines())} lines"
    )
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if ast.get_docstring(node) is not None:
                length -= node.body[0].end_lineno - node.body[0].lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{path.name}:{node.name} is {length} lines"


def test_library_import_loads_no_training_framework():
    assert _loaded_after_import(("lightning", "pytorch_lightning", "transformers")) == []
