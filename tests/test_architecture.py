"""The shape of the code, read from the code (attributes and imports, not comments):
vLLM's internals are reached from one module only (`tts/backends/vllm/internals.py`), so a
vLLM version bump is one place to change; and no import cycles in `cli/`, `tts/` or `eval/`,
counting the imports inside functions too."""

import ast
from pathlib import Path

import tts

ROOT = Path(tts.__file__).parent
REPO = ROOT.parent
HOME = ROOT / "backends" / "vllm" / "internals.py"
# vLLM's parts that are not public API: the in-process engine core and its executor, the
# scheduler's admission and counters, the KV cache manager's usage and config, the renderer
INTERNAL_ATTRS = {"engine_core", "model_executor", "driver_worker", "renderer", "render_cmpl",
                  "max_num_active_reqs", "max_num_running_reqs", "get_request_counts",
                  "kv_cache_config", "kv_cache_tensors", "num_gpu_blocks", "max_num_scheduled_tokens"}
INTERNAL_MODULES = ("vllm.v1", "vllm.config", "vllm.logger")


def uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in INTERNAL_ATTRS:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(INTERNAL_MODULES):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module}")
        elif isinstance(node, ast.Constant) and node.value in INTERNAL_ATTRS:  # getattr(x, "engine_core")
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return found


# A model class for vLLM (our plugin's PRM architectures) is written against vLLM's model
# API, as vLLM's own model files are: it lives beside the plugin, not in internals.py.
MODEL_FILES = (ROOT / "backends" / "vllm" / "prm_models.py",)


def test_vllm_internals_are_reached_from_one_module() -> None:
    outside = [use for path in sorted(ROOT.rglob("*.py")) if path != HOME and path not in MODEL_FILES
               for use in uses(path)]
    assert not outside, "vLLM internals outside tts/backends/vllm/internals.py:\n" + "\n".join(outside)
    assert len(uses(HOME)) >= len(INTERNAL_ATTRS) // 2  # the check sees what it looks for


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in it: a function-level import
    is a dependency too, and so is one under `if TYPE_CHECKING:`, which a circle of types
    is in the design as much as one of calls)."""
    files = {}
    for package in ("tts", "eval", "cli"):
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            files[name] = path

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges: set[str] = set()
        stack = [ast.parse(path.read_text(), str(path))]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                edges |= {resolve(f"{node.module}.{a.name}") or resolve(node.module) for a in node.names}
            elif isinstance(node, ast.Import):
                edges |= {resolve(a.name) for a in node.names}
            stack.extend(ast.iter_child_nodes(node))
        graph[name] = {e for e in edges if e and e != name}
    return graph


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert "tts.runner" in graph and "tts.bench.loop" in graph["tts.runner"]  # the graph is read
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def reached(graph: dict[str, set[str]], module: str) -> set[str]:
    """Every project module `module` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def test_no_arrows_back_up_from_results_trace_and_replay() -> None:
    """A run's layers, bottom up: the trace format (`tts/trace/`), the results
    (`tts/results/`), the bench loop (`tts/bench/`), and the two verbs that call it, `tts
    replay` (`tts/replay/`) and `tts bench` (`tts.runner`). No module reaches a layer above
    its own, directly or through another, counting the imports in functions and under
    `TYPE_CHECKING`: results/ reads a trace through `tts.trace`, never `tts.replay`, and
    replay/ runs its variants through `tts.bench`, never `tts.runner`."""
    graph = import_graph()
    above = {"tts.trace": ("tts.results", "tts.bench", "tts.replay", "tts.runner"),
             "tts.results": ("tts.bench", "tts.replay", "tts.runner"),
             "tts.bench": ("tts.replay", "tts.runner"),
             "tts.replay": ("tts.runner",)}

    def inside(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    upward = {m: sorted(e for e in reached(graph, m) if any(inside(e, p) for p in above[layer]))
              for m in graph for layer in above if inside(m, layer)}
    assert not {m: e for m, e in upward.items() if e}, {m: e for m, e in upward.items() if e}
    # the graph holds the arrows down that the layers are for
    assert "tts.trace.format" in graph["tts.results.store"] and "tts.trace.format" in graph["tts.results.tree"]
    assert "tts.bench.loop" in graph["tts.replay.run"] and "tts.bench.loop" in graph["tts.runner"]


def test_the_memory_model_is_only_the_model() -> None:
    """`tts/memory/` (device profiles, roofline, allocator, split policies) imports no backend,
    engine or runner of tts, and neither torch nor vLLM."""
    graph = import_graph()
    memory = [m for m in graph if m.startswith("tts.memory")]
    assert "tts.memory.allocator" in memory
    upward = {m: sorted(e for e in graph[m] if not e.startswith(("tts.memory", "tts.config", "conf")))
              for m in memory}
    assert not any(upward.values()), upward
    heavy = []
    for m in memory:
        path = REPO / (m.replace(".", "/") + ("/__init__.py" if m == "tts.memory" else ".py"))
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            heavy += [f"{m}: {n}" for n in names if n.split(".")[0] in ("torch", "vllm", "transformers")]
    assert not heavy, heavy


def python_files() -> list[Path]:
    return [p for root in ("cli", "tts", "eval") for p in sorted((REPO / root).rglob("*.py"))]


def test_no_file_over_400_lines_nor_function_over_60() -> None:
    too_long = []
    for path in python_files():
        text = path.read_text()
        if len(text.splitlines()) > 400:
            too_long.append(f"{path.relative_to(REPO)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert len(python_files()) > 50  # the tree is read
    assert not too_long, too_long


def test_the_engine_writes_metrics_only_through_events() -> None:
    """No engine module writes a field of a problem's metrics: it emits events, and the
    collector (`tts.metrics.collector`) attributes them."""
    from dataclasses import fields

    from tts.metrics.measures import ProblemMetrics

    names = {f.name for f in fields(ProblemMetrics)}

    def is_metrics(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in ("m", "metrics")) or (
            isinstance(node, ast.Attribute) and node.attr == "metrics")

    writes = []
    engine = sorted((REPO / "tts" / "engine").rglob("*.py"))
    for path in engine:
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AugAssign) else [])
            writes += [f"{path.name}:{node.lineno}" for t in targets
                       if isinstance(t, ast.Attribute) and t.attr in names and is_metrics(t.value)]
    assert len(engine) > 10
    assert not writes, writes


def test_schedules_get_their_parts_and_never_reach_back_into_the_engine() -> None:
    """A schedule works with what it is handed (`ScheduleParts`): no engine module but the
    engine itself imports `tts.engine.engine`, not even for typing, and none reads an
    `engine` attribute; the disciplines' registry imports the schedules, the engine the
    registry."""
    engine_dir = ROOT / "engine"
    reaching = []
    for path in sorted(engine_dir.rglob("*.py")):
        if path.name == "engine.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "tts.engine.engine":
                reaching.append(f"{path.name}:{node.lineno}: imports tts.engine.engine")
            elif isinstance(node, ast.Attribute) and node.attr == "engine":
                reaching.append(f"{path.name}:{node.lineno}: .engine")
    assert not reaching, reaching
    graph = import_graph()
    assert {"tts.engine.barrier", "tts.engine.decoupled"} <= graph["tts.engine.disciplines"]
    assert "tts.engine.disciplines" in graph["tts.engine.engine"]


def test_engine_objects_hold_what_they_are_given_and_copy_nothing_off_it() -> None:
    """No `__init__` under `tts/engine/` copies an attribute off another object it is given
    (`self.runner = parts.runner`): an object holds what it is given, and reads the rest
    through it, so there is one copy of each part."""

    def root(node: ast.AST) -> str | None:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    copies = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(fn, ast.FunctionDef) and fn.name == "__init__"):
                continue
            given = {a.arg for a in fn.args.args + fn.args.kwonlyargs}  # self included
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                targets = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                if any(root(t) == "self" for t in targets if isinstance(t, ast.Attribute)) and any(
                        isinstance(v, ast.Attribute) and root(v) in given for v in values):
                    copies.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert len(list((ROOT / "engine").rglob("*.py"))) > 10
    assert not copies, "\n".join(copies)


def package(module: str) -> str:
    """A module's layer: its package under tts/ (`tts.results`), a top-level module of tts/
    (`tts.runner`), or `eval` and `cli`."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "tts" and len(parts) > 1 else parts[0]


# Every package of tts/, eval/ and cli/, bottom up; a module imports only from its own layer
# or those below it (docs/design.md's map names each).
LAYERS = (
    ("tts", "eval", "tts.clock", "tts.token_hash", "tts.markdown", "tts.plotting", "tts.quiet"),
    ("tts.memory",),
    ("tts.config",),
    ("tts.models",),
    ("tts.backends",),
    ("tts.metrics", "tts.search"),
    ("tts.engine",),
    ("tts.assembly",),
    ("tts.trace",),
    ("tts.results",),
    ("tts.wandb_sink", "tts.problems", "tts.kv_budget"),
    ("tts.bench", "tts.benchmarks"),
    ("tts.replay",),
    ("tts.profiling", "tts.report", "tts.saved"),
    ("tts.runner",),
    ("tts.hydra_app", "tts.cli_support"),
    ("cli",),
)
# Imports that run up a layer where removing them is wrong (docs/design.md, "Arrows up"):
# module -> the modules above it that it may import, in a function, lazily.
UPWARD = {
    # which model a config names, and whether its folder is here, is the registry's: the
    # check of the context length runs at composition, before any model loads
    "tts.config.limits": {"tts.models.registry", "tts.models.tiny", "tts.models.cache"},
    # a pulled model's dtype note says what `dtype: auto` runs it in on this host, which is
    # the vLLM backend's rule (`resolve_dtype`); one rule, read where it is said
    "tts.models.provision": {"tts.backends.vllm.engine"},
    # which search algorithms there are, and what each asks of the other search options (a
    # tree search's n a multiple of its beam width), is the search registry's: checked at
    # composition, as any other value is, before any model loads (a user's own imported)
    "tts.config.compose": {"tts.search"},
}


def test_no_import_runs_back_up_the_layers() -> None:
    """Every package has a layer (`LAYERS`), and no module imports one above its own, counting
    the imports in functions and under `TYPE_CHECKING`, but the few `UPWARD` names."""
    graph = import_graph()
    rank = {p: i for i, layer in enumerate(LAYERS) for p in layer}
    unplaced = sorted({package(m) for m in graph} - rank.keys())
    assert not unplaced, f"packages with no layer: {unplaced}"
    upward = sorted(f"{m} -> {e}" for m, edges in graph.items() for e in edges
                    if rank[package(e)] > rank[package(m)] and e not in UPWARD.get(m, ()))
    assert not upward, upward


# What loads a model: vLLM, transformers (its model classes and their loaders), the vLLM
# backend of tts, and what builds a run's backends (`tts.backends.factory`) or its engines
# (`tts.assembly.build`). Not torch: the host line asks it what the hardware is (`host_info`).
MODEL_LOADERS = ("vllm", "transformers", "tts.backends.vllm", "tts.backends.factory", "tts.assembly.build")


def test_results_load_no_model() -> None:
    """No module under tts/results/ imports what loads a model (`MODEL_LOADERS`, any module
    under those names), at its top or in a function: results/ reads and summarises a run's
    files. (It may read a module that names the PRM adapters or prices memory, which load
    nothing.)"""
    paths = sorted((ROOT / "results").rglob("*.py"))
    assert ROOT / "results" / "summary.py" in paths
    loading = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            loading += [f"{path.name}:{node.lineno}: {n}" for n in names
                        if any(n == x or n.startswith(x + ".") for x in MODEL_LOADERS)]
    assert not loading, loading


def test_no_module_imports_another_ones_private_name() -> None:
    """No module of tts/, cli/ or eval/ imports a private name (`from x import _y`) of another
    module: what a module shares is public."""
    private = []
    for path in python_files():
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != module and (
                    node.module or "").split(".")[0] in ("tts", "cli", "eval"):
                private += [f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import {a.name}"
                            for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, private


def _top_level_names(path: Path) -> tuple[set[str], set[str], set[str]]:
    """What a module defines at its top level, what it only imports there, and its `__all__`."""
    defined, imported, exported = set(), set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                defined |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                if isinstance(target, ast.Name) and target.id == "__all__" and isinstance(node.value, ast.List):
                    exported |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported |= {a.asname or a.name.split(".")[0] for a in node.names}
    return defined, imported - defined, exported


def test_every_name_is_imported_from_where_it_lives() -> None:
    """No module of the repository (tests included) imports a name from a module that only
    imports it itself: one place for each thing, no re-export kept for old importers. A
    package's `__init__` and a name a module lists in its `__all__` (its public face) may
    pass names on."""
    files = python_files() + sorted((REPO / "tests").glob("*.py"))
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0
                    and (node.module or "").split(".")[0] in ("tts", "cli", "eval")):
                continue
            source = REPO / Path(*node.module.split(".")).with_suffix(".py")
            if not source.exists():
                continue  # a package: its __init__ may pass names on
            _, only_imported, exported = _top_level_names(source)
            found += [f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import {a.name}"
                      for a in node.names if a.name in only_imported and a.name not in exported
                      and not (source.parent / a.name).is_dir() and not (source.parent / f"{a.name}.py").exists()]
    assert not found, found
