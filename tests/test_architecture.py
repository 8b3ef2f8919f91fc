"""The layers go one way (DESIGN.md section 1): no import cycle in pkg/ or native/ (imports
inside functions included), pkg/ never names native/, only the core (and the backends) touch a
Tensor's private fields, and the kernels' C sources (web/kernels) depend on each other without
a circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = (ROOT / "pkg", ROOT / "native")
KERNEL_SOURCES = ROOT / "web" / "kernels"
PRIVATE_TENSOR_FIELDS = re.compile(r"\.(_data|_wrap|_compute|_from_compute)\b")


def modules(roots=SOURCE_ROOTS) -> dict[str, Path]:
    found = {}
    for root in roots:
        for path in root.rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _resolve(name: str, known: dict) -> str | None:
    """The known module an imported name lives in (a package attribute maps to the package)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _packages_above(name: str) -> list[str]:
    """The packages Python initialises before module `name`: 'a.b.c' -> ['a', 'a.b']."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


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


def _imported(node, package: str, known: dict) -> list[str]:
    """What one import statement names: modules, or the package whose namespace a name is
    read from (`from pkg import sub` names pkg.sub, `from pkg import func` names pkg)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = package
        for _ in range(node.level - 1):
            anchor = anchor.rpartition(".")[0]
        base = f"{anchor}.{base}" if base else anchor
    named = [f"{base}.{alias.name}" for alias in node.names]
    submodules = [target for target in named if target in known]
    return submodules if len(submodules) == len(named) else [base] + submodules


def import_graph(module_level_only: bool = False, known: dict | None = None) -> dict[str, set[str]]:
    """module -> the modules importing it runs, as Python runs them: importing a.b.c runs the
    packages a.b and a first. The packages above a module itself have run before it, whatever
    it reads from them (`from .. import name`), so they are no edge. A package importing its
    own submodules when it is imported is how packages are built, not an edge either; one that
    imports them inside a function (a lazy factory) does depend on them: through such an edge,
    the core asking the backend package for a backend (a function-level import) while the
    backend's wasm package imports the tensor made a circle that module-level imports alone
    never show."""
    known = modules() if known is None else known
    graph = {name: set() for name in known}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        running = set(_packages_above(name)) | {name}
        tree = ast.parse(path.read_text(encoding="utf-8"))
        at_import = {id(node) for node in _import_nodes(tree, module_level_only=True)}
        for node in _import_nodes(tree, module_level_only):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(node, package, known):
                resolved = _resolve(target, known)
                if resolved is None:
                    continue
                for module in [resolved] + _packages_above(resolved):
                    if module not in known or module in running:
                        continue
                    if is_package and module.startswith(name + ".") and id(node) in at_import:
                        continue  # the package building itself
                    graph[name].add(module)
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


def _write_package(root: Path, files: dict) -> dict:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules((root,))


def test_a_circle_through_a_lazy_import_is_found(tmp_path):
    """The circle issue 36 cut, in small: the core asks the backend package for a backend inside
    a function, the backend package builds its wasm backend inside a function, and importing
    that runs the wasm package, which imports parts, which imports the tensor. Module-level
    imports alone show no circle."""
    known = _write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/core/__init__.py": "",
        "pkg/core/device.py": "def backend():\n    from ..backend import backend_for\n"
                              "    return backend_for()\n",
        "pkg/core/tensor.py": "from .device import backend\n",
        "pkg/backend/__init__.py": "def backend_for():\n    from .wasm.backend import create\n"
                                   "    return create()\n",
        "pkg/backend/parts.py": "from ..core.tensor import backend\n",
        "pkg/backend/wasm/__init__.py": "from .. import parts\n",
        "pkg/backend/wasm/backend.py": "def create():\n    return 1\n",
    })
    assert cycles(import_graph(known=known)) == [
        ["pkg.backend", "pkg.backend.parts", "pkg.backend.wasm", "pkg.core.device",
         "pkg.core.tensor"]]
    assert cycles(import_graph(module_level_only=True, known=known)) == []


def test_a_package_building_itself_is_no_circle(tmp_path):
    """A package importing its submodules, when it is imported or in a lazy factory, while they
    read names from the packages above them (which Python has run first): how packages work
    (the backend registry's lazy wasm factory and wasm.install's registration are this)."""
    known = _write_package(tmp_path, {
        "pkg/__init__.py": "from .registry import register\nfrom . import loader\n\n"
                           "def read_any():\n    from .formats.gguf import read\n"
                           "    return read()\n",
        "pkg/registry.py": "def register():\n    return 1\n",
        "pkg/loader.py": "from . import register\n",
        "pkg/formats/__init__.py": "",
        "pkg/formats/gguf.py": "from .. import register\n\ndef read():\n    return register()\n",
    })
    graph = import_graph(known=known)
    assert "pkg.formats.gguf" in graph["pkg"]  # the lazy factory is an edge
    assert cycles(graph) == []


def test_pkg_never_imports_native():
    graph = import_graph()
    wrong = sorted((source, target) for source, targets in graph.items()
                   if source.startswith("candle_web") for target in targets
                   if target.startswith("candle_native"))
    assert wrong == []


# DESIGN.md section 1: core <- backend <- nn/io/quantized/tokenizers/hub <- models/generation
# <- pipelines <- worker/batch/cli/serve. A module may import, when it is imported, only from its
# own layer or lower ones; an import inside a function (the numpy backend's reference quantized
# kernels) runs on use and is not a layer edge (it still counts for the circles above).
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


# -- the kernels' C sources ----------------------------------------------------------------------
# A unit is a file name without its suffix (team.h and team.c are "team"); unit A depends on B
# when one of A's files includes one of B's or calls a function one of B's .c files defines.
# Prototypes are declarations, not calls: kernels.h declares what gemm.c defines.
_C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_C_INCLUDE = re.compile(r'^#include "(\w+)\.h"', re.M)
_C_DEFINITION = re.compile(
    r"^(?!static\b|typedef\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{", re.M)
_C_PROTOTYPE = re.compile(
    r"^(?!return\b)[A-Za-z_][\w \t*]*?\b[A-Za-z_]\w*\s*\([^;{}]*\)\s*;", re.M)
_C_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def kernel_source_graph(folder: Path) -> dict[str, set[str]]:
    texts = {path: _C_COMMENT.sub(" ", path.read_text(encoding="utf-8"))
             for path in sorted(folder.glob("*.[ch]"))}
    defined_in = {name: path.stem for path, text in texts.items() if path.suffix == ".c"
                  for name in _C_DEFINITION.findall(text)}
    graph = {path.stem: set() for path in texts}
    for path, text in texts.items():
        graph[path.stem].update(unit for unit in _C_INCLUDE.findall(text) if unit in graph)
        graph[path.stem].update(defined_in[name] for name in _C_CALL.findall(
            _C_PROTOTYPE.sub(" ", text)) if name in defined_in)
    return {unit: targets - {unit} for unit, targets in graph.items()}


def test_the_kernel_source_graph_is_read():
    graph = kernel_source_graph(KERNEL_SOURCES)
    assert "kernels" in graph["gemm"]  # an include
    assert "gemm" in graph["whisper_steps"]  # a call of gemm_f32, defined in gemm.c
    assert "gemm" not in graph["kernels"]  # kernels.h only declares gemm_one


def test_a_kernel_source_circle_is_found(tmp_path):
    """The circle issue 36 cut: team.c ran the steps by name while the steps called team.h's
    barrier."""
    (tmp_path / "team.h").write_text("static inline void team_barrier(int n) { (void)n; }\n"
                                     "int team_run(int job);\n")
    (tmp_path / "team.c").write_text('#include "team.h"\nvoid llama_team_step(int n);\n'
                                     "int team_run(int job) {\n    llama_team_step(job);\n"
                                     "    return 1;\n}\n")
    (tmp_path / "steps.c").write_text('#include "team.h"\nvoid llama_team_step(int n) {\n'
                                      "    team_barrier(n);\n}\n")
    assert cycles(kernel_source_graph(tmp_path)) == [["steps", "team"]]


def test_the_kernel_sources_have_no_circle():
    assert cycles(kernel_source_graph(KERNEL_SOURCES)) == []
