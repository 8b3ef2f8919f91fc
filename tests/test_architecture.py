"""The layers go one way (DESIGN.md section 1): no import cycle in pkg/ or native/, pkg/ never
names native/, and only the core (and the backends) touch a Tensor's private fields."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = (ROOT / "pkg", ROOT / "native")
PRIVATE_TENSOR_FIELDS = re.compile(r"\.(_data|_wrap|_compute|_from_compute)\b")


def modules() -> dict[str, Path]:
    found = {}
    for root in SOURCE_ROOTS:
        for path in root.rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _resolve(name: str, known: dict) -> str | None:
    """The known module an imported name lives in (a package attribute maps to the package)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _import_nodes(tree: ast.AST, module_level_only: bool):
    """Every import statement, or only those that run when the module is imported (not the
    ones inside functions, which run on first use)."""
    if not module_level_only:
        yield from ast.walk(tree)
        return
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(child for child in ast.iter_child_nodes(node)
                       if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))


def import_graph(module_level_only: bool = False) -> dict[str, set[str]]:
    known = modules()
    graph = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _import_nodes(tree, module_level_only):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                resolved = _resolve(target, known)
                # A package importing its own submodules is how packages are built, not a cycle.
                if resolved and resolved != name and not (
                        path.name == "__init__.py" and resolved.startswith(name + ".")):
                    graph[name].add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in graph:
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
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_is_read():
    graph = import_graph()
    assert "candle_web.core.tensor" in graph["candle_web.nn.layers"]
    assert "candle_web.backend" in graph["candle_native"]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_pkg_never_imports_native():
    graph = import_graph()
    wrong = sorted((source, target) for source, targets in graph.items()
                   if source.startswith("candle_web") for target in targets
                   if target.startswith("candle_native"))
    assert wrong == []


# DESIGN.md section 1: core <- backend <- nn/io/quantized/tokenizers/hub <- models/generation
# <- pipelines <- worker/batch/cli/serve. A module may import, when it is imported, only from its
# own layer or lower ones; an import inside a function (the core asking for its backend on the
# first op, the numpy backend's reference quantized kernels) runs on use and is not a layer edge.
LAYERS = {"core": 0, "backend": 1, "nn": 2, "io": 2, "quantized": 2, "tokenizers": 2, "hub": 2,
          "generation": 3, "models": 3, "pipelines": 4, "worker": 5, "batch": 5, "cli": 5,
          "serve": 5, "api": 5, "chat": 5}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "candle_web" or len(parts) == 1:
        return None  # the face re-exports the core and reaches the rest lazily
    return LAYERS[parts[1]]


def test_every_folder_has_a_layer():
    folders = {name.split(".")[1] for name in modules() if name.startswith("candle_web.")}
    assert folders - set(LAYERS) == set(), "a new folder needs its place in LAYERS"


def test_imports_at_import_time_go_down_the_layers():
    wrong = []
    for source, targets in import_graph(module_level_only=True).items():
        for target in targets:
            low, high = _layer(target), _layer(source)
            if low is not None and high is not None and low > high:
                wrong.append(f"{source} imports {target}")
    assert wrong == [], "\n".join(sorted(wrong))


def test_only_the_core_touches_private_tensor_fields():
    offenders = []
    for name, path in modules().items():
        if name.startswith(("candle_web.core", "candle_web.backend")):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PRIVATE_TENSOR_FIELDS.search(line.split("#", 1)[0]):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == [], "\n".join(offenders)
