"""The import layers (issue 44): every module's imports walked with ast, at module level and inside functions (the
lazy imports that keep the CLI's start cheap). Held: no module imports another's `_private` name; no import cycle
among the product's modules, at module level or through imports inside functions (a lazy import that closes a
cycle only hides it: move the shared piece down a floor); `fleet/`, `storage/` and `faults/` never import
`cluster/` (the wave, the grader and the CLI sit above the fleet, the store and the faults, never below them).
Each check is proven on a small tree of its own first, so a walker that sees nothing cannot pass."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cluster", "fleet", "storage", "faults")
LOWER = ("fleet", "storage", "faults")  # the floors below cluster/


@dataclass(frozen=True)
class Import:
    importer: str  # the module that imports
    module: str  # the module imported (a submodule named in `from pkg import sub` is that submodule)
    name: str | None  # the name taken from it (`from m import name`), None for a module itself
    line: int
    lazy: bool  # inside a function (or a lambda)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    return {_module_name(root, p): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))
            if ".venv" not in p.parts}


def imports(root: Path = ROOT, packages=PACKAGES) -> list[Import]:
    """Every import statement of the packages' modules that names one of the packages, module-level or lazy."""
    mods = modules(root, packages)
    found: list[Import] = []
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"

        def walk(node, lazy: bool, name=name, is_pkg=is_pkg):
            for child in ast.iter_child_nodes(node):
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.Import):
                    found.extend(Import(name, a.name, None, child.lineno, lazy) for a in child.names)
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:  # relative: from the importer's package
                        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                        pkg = pkg[:len(pkg) - (child.level - 1)]
                        base = ".".join(pkg + ([child.module] if child.module else []))
                    for a in child.names:
                        sub = f"{base}.{a.name}"
                        found.append(Import(name, sub, None, child.lineno, lazy) if sub in mods
                                     else Import(name, base, a.name, child.lineno, lazy))
                walk(child, inner)

        walk(ast.parse(path.read_text(), str(path)), False)
    return [i for i in found if i.module.split(".")[0] in packages]


def private_imports(found: list[Import]) -> set[tuple[str, str, str]]:
    """(importer, module, name) of each `_name` (not a dunder) one module takes from another."""
    return {(i.importer, i.module, i.name) for i in found
            if i.name and i.name.startswith("_") and not i.name.startswith("__") and i.module != i.importer}


def upward_imports(found: list[Import], lower=LOWER, upper: str = "cluster") -> list[Import]:
    """Imports of `upper` made by a module of a lower floor (module-level or lazy)."""
    return [i for i in found if i.importer.split(".")[0] in lower and i.module.split(".")[0] == upper]


def module_level_cycles(found: list[Import], mods, lazy: bool = False) -> set[tuple[str, ...]]:
    """The strongly connected components (more than one module, or a module importing itself) of the module-level
    import graph among the given modules (Tarjan's algorithm, iterative); `lazy`: the imports inside functions are
    edges too."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for i in found:
        if (lazy or not i.lazy) and i.module in graph:
            graph[i.importer].add(i.module)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[tuple[str, ...]] = set()
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
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
                scc = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    scc.append(m)
                    if m == node:
                        break
                if len(scc) > 1 or node in graph[node]:
                    out.add(tuple(sorted(scc)))
    return out


# -- each check proven on a tree made to break it ------------------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_the_walker_finds_private_upward_and_cyclic_imports_in_a_made_tree(tmp_path):
    root = _tree(tmp_path, {
        "cluster/__init__.py": "",
        "cluster/a.py": "from cluster import b\n",
        "cluster/b.py": "from cluster.c import thing\n",
        "cluster/c.py": "import cluster.a\nfrom .b import _hidden\n",
        "cluster/sub/__init__.py": "from . import d\n",
        "cluster/sub/d.py": "def f():\n    from cluster.a import _lazy\n",
        "fleet/__init__.py": "",
        "fleet/x.py": "def g():\n    import cluster.a\n",
        "cluster/e.py": "def h():\n    from cluster import f\n",  # a cycle closed only inside a function
        "cluster/f.py": "from cluster import e\n",
    })
    found = imports(root, ("cluster", "fleet"))
    mods = modules(root, ("cluster", "fleet"))
    assert private_imports(found) == {("cluster.c", "cluster.b", "_hidden"), ("cluster.sub.d", "cluster.a", "_lazy")}
    assert [(i.importer, i.module, i.lazy) for i in upward_imports(found, ("fleet",))] == [("fleet.x", "cluster.a",
                                                                                            True)]
    assert module_level_cycles(found, mods) == {("cluster.a", "cluster.b", "cluster.c")}
    assert module_level_cycles(found, mods, lazy=True) == {("cluster.a", "cluster.b", "cluster.c"),
                                                           ("cluster.e", "cluster.f")}
    lazy_only = [i for i in found if i.importer != "cluster.c"]  # the cycle broken: none left at module level
    assert module_level_cycles(lazy_only, mods) == set()
    assert module_level_cycles(lazy_only, mods, lazy=True) == {("cluster.e", "cluster.f")}
    assert any(i.module == "cluster.sub.d" for i in found)  # a relative `from . import d` is the submodule


# -- the product ------------------------------------------------------------------------------------------------------

def test_the_product_is_walked():
    found = imports()
    assert len(modules()) > 100 and len(found) > 300
    assert any(i.lazy for i in found) and any(not i.lazy for i in found)


def test_no_private_name_is_imported_across_modules():
    found = private_imports(imports())
    assert not found, ("a `_name` imported from another module: give it a public name where it is defined, or move "
                       f"it to the room that owns its concern (importer, module, name): {sorted(found)}")


def test_no_import_cycle_at_module_level():
    cycles = module_level_cycles(imports(), modules())
    assert not cycles, f"module-level import cycles (move the shared part down a floor): {sorted(cycles)}"


def test_no_import_cycle_through_imports_inside_functions():
    cycles = module_level_cycles(imports(), modules(), lazy=True)
    assert not cycles, ("import cycles closed by an import inside a function (move the shared part down a floor, or "
                        f"pass it in; never hide it in a function): {sorted(cycles)}")


def test_fleet_storage_and_faults_never_import_cluster():
    up = upward_imports(imports())
    assert not up, "a lower floor imports cluster/: " + ", ".join(f"{i.importer}:{i.line} -> {i.module}" for i in up)
