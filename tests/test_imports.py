"""The import graph of src/: no module imports itself back, not even from inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_names(root: Path) -> dict[str, Path]:
    """{"speechrt.runtime.onnx": path, "speechrt.runtime": .../__init__.py, ...}"""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `name` imports anywhere in its body (functions included);
    imports under `if TYPE_CHECKING:` are never executed and are left out."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    todo: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while todo:
        node = todo.pop()
        if _type_checking_only(node):
            todo.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: climb from this module's package
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from pkg import module` imports pkg.module; `from pkg import name`, pkg itself
            subs = {f"{base}.{a.name}" for a in node.names} & modules.keys()
            found |= subs if len(subs) == len(node.names) else subs | {base}
    return {m for m in found if m in modules and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle [a, b, ..., a] of the directed graph, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_src_has_no_import_cycle() -> None:
    modules = module_names(SRC)
    assert "speechrt.registry" in modules and "speechrt.convert.checkpoints" in modules
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def _package(name: str) -> str:
    return ".".join(name.split(".")[:2])  # speechrt.models.hifigan -> speechrt.models


def test_packages_have_no_import_cycle() -> None:
    """Between speechrt's packages too (speechrt.models, speechrt.convert, speechrt.tts, ...):
    a module importing a sibling package's module depends on that whole package."""
    modules = module_names(SRC)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = {_package(d) for d in imports_of(name, path, modules)} - {_package(name)}
        graph.setdefault(_package(name), set()).update(deps)
    assert "speechrt.convert" in graph["speechrt.cli"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_models_import_no_conversion() -> None:
    modules = module_names(SRC)
    for name, path in modules.items():
        if name.startswith("speechrt.models"):
            deps = imports_of(name, path, modules)
            assert not {d for d in deps if d.startswith("speechrt.convert")}, name


def test_cycle_finder_sees_function_local_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
    )
    modules = module_names(tmp_path)
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph["pkg.c"] == set()
    assert find_cycle(graph) in (["pkg.a", "pkg.b", "pkg.a"], ["pkg.b", "pkg.a", "pkg.b"])
    (pkg / "b.py").write_text("def f():\n    return 1\n")
    graph["pkg.b"] = imports_of("pkg.b", pkg / "b.py", modules)
    assert find_cycle(graph) is None
