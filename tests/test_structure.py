"""The shape of the package, read from its source (no GPU, no kernels).

The import graph of gemmc's modules, relative imports resolved: `from pkg import name` is an arrow to pkg.name
where that is a module, else to pkg. Importing pkg.mod also runs pkg/__init__.py; that implicit arrow is left
out, or every package whose __init__ re-exports a submodule would make a circle with each of its submodules.

Module-level imports (class bodies and if/try blocks included) make no circle. Imports inside functions still
close two, both through a package's __init__.py, and they are pinned as they are (a new one fails, and so does
removing one, so that the list is kept true):
  - gemmc.backends: `emit()` imports sm80/sm90 emit on first use, and those take Param, EmittedKernel and
    GRID_YZ_MAX from gemmc/backends/__init__.py (gemmc/backends/ is another engineer's).
  - gemmc: `gemmc.compile` is imported on first use (`__getattr__`), and the compiler's chain (cache, the
    `auto` modules of gemmc/choose and its tuning-DB reader) reads `gemmc.__version__` from gemmc/__init__.py.

gemmc/choose decides `schedule="auto"` and reads the tuning DB; gemmc/search writes the DB and trains the policy.
Nothing in gemmc/choose imports gemmc/search, at any level, and an `auto` compile loads no module of it.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gemmc"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, function_level: bool):
    """The import statements of a module: those of its top level (class bodies and if/try blocks included),
    and with `function_level` those inside its functions too."""
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if function_level or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def import_graph(function_level: bool = True) -> dict[str, set[str]]:
    """module -> the gemmc modules it imports (with `function_level`, anywhere in its body)."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path)), function_level):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module
                # `from pkg import sub` imports the submodule; `from pkg import name` only pkg
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            graph[mod].update(t for t in targets if t in files and t != mod)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph, component) -> str:
    inside = set(component)
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & inside))}" for m in component)


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    assert "gemmc.choose.schedule_policy" in graph["gemmc.choose.tuning_db"]   # inside a function, `from .x`
    assert "gemmc.output_file" in graph["gemmc.search.db"]         # `from ..output_file`
    assert "gemmc.compiler" in graph["gemmc"]                       # `from . import compiler` in __getattr__


def test_module_level_imports_have_no_circles():
    graph = import_graph(function_level=False)
    found = circles(graph)
    assert not found, "import circles:\n" + "\n\n".join(_describe(graph, c) for c in found)


# the circles that function-level imports still close (see the module docstring)
KNOWN_FUNCTION_LEVEL_CIRCLES = [
    ["gemmc.backends", "gemmc.backends.sm80.emit", "gemmc.backends.sm90.emit"],
    ["gemmc", "gemmc.build", "gemmc.cache", "gemmc.choose.auto", "gemmc.choose.db_steps", "gemmc.choose.grouped",
     "gemmc.choose.m_buckets", "gemmc.choose.resolve", "gemmc.choose.tuning_db", "gemmc.choose.tuning_db_verdict",
     "gemmc.compiled", "gemmc.compiler", "gemmc.dsl"],
]


def test_function_level_imports_close_only_the_known_circles():
    graph = import_graph()
    found = circles(graph)
    assert sorted(found) == sorted(KNOWN_FUNCTION_LEVEL_CIRCLES), (
        "import circles (module and function level) changed; now:\n" + "\n\n".join(_describe(graph, c) for c in found))


def _search_modules_after_an_auto_compile() -> set[str]:
    code = textwrap.dedent("""
        import sys
        import gemmc
        from gemmc import GemmSpec
        compiled = gemmc.compile(GemmSpec(m="M", n=4096, k=4096), schedule="auto", arch="sm_90a")
        compiled.for_m(256)
        print(" ".join(sorted(m for m in sys.modules if m.startswith("gemmc.search"))))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_an_auto_compile_and_its_m_buckets_leave_the_search_package_unimported():
    assert not _search_modules_after_an_auto_compile()


def _reachable(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """{module: the module that imports it} of every module `start` reaches through `graph`."""
    seen = {start: ""}
    todo = [start]
    while todo:
        mod = todo.pop()
        for dep in sorted(graph[mod]):
            if dep not in seen:
                seen[dep] = mod
                todo.append(dep)
    return seen


def _path(seen: dict[str, str], end: str) -> str:
    chain = [end]
    while seen[chain[-1]]:
        chain.append(seen[chain[-1]])
    return " -> ".join(reversed(chain))


def test_nothing_in_choose_imports_the_search_package():
    """Directly or through other modules, at module level (what importing it runs) or inside a function (what
    calling it may import): gemmc/choose reads what the search writes, never the search itself. gemmc/__init__.py
    is left out of the walk: its `__getattr__` reaches everything."""
    for function_level in (False, True):
        graph = import_graph(function_level)
        graph["gemmc"] = set()
        for mod in sorted(m for m in graph if m == "gemmc.choose" or m.startswith("gemmc.choose.")):
            seen = _reachable(graph, mod)
            found = sorted(m for m in seen if m == "gemmc.search" or m.startswith("gemmc.search."))
            assert not found, f"{mod} imports the search package: {_path(seen, found[0])}"


def test_importing_each_choose_module_loads_no_search_module():
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import gemmc.choose
        for info in pkgutil.iter_modules(gemmc.choose.__path__):
            importlib.import_module(f"gemmc.choose.{info.name}")
        print(" ".join(sorted(m for m in sys.modules if m.startswith("gemmc.search"))))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []


# ---- no run history in gemmc/ -----------------------------------------------------------------------------

# A dated figure ("2026-11-30", a result file named by its date) or a session number in gemmc's source is run
# history: it belongs in bench/results/ (bench/results/heuristic-rules.md keeps the heuristic's), and the code
# keeps the rule and why. Files that still carry some are pinned here until their owner moves it (a stale
# entry fails too).
RUN_HISTORY = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\bsession[ -]?\d+", re.I)
KNOWN_RUN_HISTORY: set = set()


def test_gemmc_carries_no_run_history():
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if RUN_HISTORY.search(line):
                found.setdefault(str(path.relative_to(ROOT.parent)), []).append(f"{n}: {line.strip()}")
    new = {f: lines for f, lines in found.items() if f not in KNOWN_RUN_HISTORY}
    assert not new, "run history in gemmc/ (move it to bench/results/):\n" + "\n".join(
        f"  {f}:{line}" for f, lines in new.items() for line in lines)
    assert KNOWN_RUN_HISTORY <= set(found), f"no run history left in {sorted(KNOWN_RUN_HISTORY - set(found))}: unpin it"


# ---- the tree's size ---------------------------------------------------------------------------------------

# A GPU run without a package index ships the checkout beside the CuTe DSL bundle (about 59 MB,
# ../shared/gpu/README.md) in 64 MiB: the tracked tree keeps under 8 MB (keep large reports gzipped, as
# bench/results' .json.gz files are; gemmc.bench.report.read_json reads either).
TREE_LIMIT_BYTES = 8_000_000


def test_the_tracked_tree_leaves_room_for_the_gpu_bundle():
    root = ROOT.parent
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    files = [root / f for f in out.stdout.split("\0") if f]
    sizes = {str(f.relative_to(root)): f.stat().st_size for f in files if f.is_file()}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total < TREE_LIMIT_BYTES, (f"the tracked tree is {total} bytes, over {TREE_LIMIT_BYTES}; the largest: "
                                      f"{largest} (gzip large reports, or move data out of the tree)")
