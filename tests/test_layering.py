"""The packages form layers and the modules form no cycle.

app → engine → recorders, kernels, sessions; recorders → sessions; kernels → only
`sessions.errors` and `sessions.cache`; sessions → nothing. Inside the engine,
`engine.replay` → `engine.inference`, never the other way. Every import counts, top-level or inside a function:
a lazy import is still a dependency, it only moves the failure to run time."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine", "kernels", "recorders", "sessions", "assets")

# What each package may import from the others (besides itself).
MAY_IMPORT = {
    "app": {"engine", "recorders", "kernels", "sessions", "assets"},
    "engine": {"recorders", "kernels", "sessions", "assets"},
    "recorders": {"sessions", "assets"},
    "kernels": set(),
    "sessions": set(),
    "assets": set(),
}
# Single modules a package may import though it may not import their package.
# sessions is the lowest package, so it holds the foundations every layer shares: the
# vocabulary, the error base, and TTTR's cache directory with the C builder that both the
# kernels and the sandbox's helpers use.
MAY_IMPORT_MODULE = {
    "kernels": {"tttr.sessions.errors", "tttr.sessions.cache"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("tttr", *parts))


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.parent == ROOT / "assets" / "examples":
                continue  # programs a user runs under `tttr record`, shipped as data, not modules of tttr
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The tttr modules `name` imports anywhere in its body, resolved to modules where the
    name is a module (`from tttr.kernels import crow` → tttr.kernels.crow)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("tttr.") and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _package(module: str) -> str:
    return module.split(".")[1]


# The kernels the engine may reach: ops (every op, and which kernel runs), the mode switch,
# the package itself (REVISION), machine's limit probes (`bench engine --synthetic`), and
# array_ops (the same kernels on numpy arrays, for the torch-free generation path). The compiled
# helpers and `invariant` stay behind those.
ENGINE_MAY_IMPORT_KERNELS = {"tttr.kernels", "tttr.kernels.ops", "tttr.kernels.mode", "tttr.kernels.array_ops",
                             "tttr.kernels.machine"}
# Except the kernel half of `tttr bench gpu`: it times the Triton kernels against stock torch at
# the engine's shapes, so it calls them directly; no other engine module does.
BENCH_MAY_IMPORT_KERNELS = {"tttr.engine.bench.gpu_kernels": {"tttr.kernels.invariant", "tttr.kernels.triton_kernels"}}


def test_the_engine_reaches_the_kernels_only_through_ops():
    offenders = [f"{module} → {target}" for module, targets in sorted(_graph().items())
                 if module.startswith("tttr.engine.") for target in sorted(targets)
                 if _package(target) == "kernels" and target not in ENGINE_MAY_IMPORT_KERNELS
                 and target not in BENCH_MAY_IMPORT_KERNELS.get(module, ())]
    assert not offenders, "engine modules import kernels past ops:\n" + "\n".join(offenders)


def test_the_kernels_check_would_see_a_direct_import(tmp_path):
    """A helper imported by name, at the top or inside a function, resolves to its module."""
    source = tmp_path / "probe.py"
    source.write_text("from tttr.kernels import REVISION, ops\n"
                      "def f():\n    from tttr.kernels import crow\n    from tttr.kernels.cquant import attach\n")
    found = _imports("tttr.engine.probe", source, set(_modules()))
    assert found == {"tttr.kernels", "tttr.kernels.ops", "tttr.kernels.crow", "tttr.kernels.cquant"}
    assert found - ENGINE_MAY_IMPORT_KERNELS == {"tttr.kernels.crow", "tttr.kernels.cquant"}


def test_the_graph_sees_known_imports():
    graph = _graph()
    assert "tttr.kernels.ops" in graph["tttr.engine.inference.model"]  # `from tttr.kernels import ops`
    assert "tttr.engine.bench.store" in graph["tttr.engine.bench.suite"]  # a function-level import


def test_no_lower_package_imports_a_higher_one():
    offenders = []
    for module, targets in sorted(_graph().items()):
        package = _package(module)
        for target in sorted(targets):
            other = _package(target)
            if other == package or other in MAY_IMPORT[package]:
                continue
            if target in MAY_IMPORT_MODULE.get(package, ()):
                continue
            offenders.append(f"{module} → {target}")
    assert not offenders, "imports against the layering:\n" + "\n".join(offenders)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" ↔ ".join(c) for c in cycles)


def test_inference_imports_neither_replay_nor_serve():
    offenders = [f"{module} → {target}" for module, targets in sorted(_graph().items())
                 if module.startswith("tttr.engine.inference") for target in sorted(targets)
                 if target.startswith(("tttr.engine.replay", "tttr.engine.serve"))]
    assert not offenders, "the model side imports what is built on it:\n" + "\n".join(offenders)


def _third_party_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_the_app_is_the_cli_and_the_tui_and_the_http_server_is_engine_code():
    """A run kind's record/replay/fork lives in the engine (a recorded program's in
    tttr.engine.program), and so does the HTTP server (tttr.engine.serve.server, Starlette):
    app/ holds the command line and the terminal app. Only the server's package imports
    Starlette; the app starts uvicorn (`tttr serve`), the engine's runners start it too."""
    modules = _modules()
    assert not [m for m in modules if m.startswith(("tttr.app.program", "tttr.app.server"))]
    starlette = sorted(m for m, path in modules.items() if "starlette" in _third_party_imports(path))
    assert starlette and all(m.startswith("tttr.engine.serve.") for m in starlette), starlette
    assert "tttr.engine.program.record" in modules and "tttr.engine.serve.server" in modules


# What the app asks a run's kind for (engine/kinds.py: check_fork/fork, check_experiment/triage/
# bisect) and so never calls itself: each kind's own modules for those verbs, and the agent's
# check-then-act functions (engine/replay/runs.py; the app's demo records with `record`).
KINDS_OWN = {"tttr.engine.replay.triage", "tttr.engine.replay.bisect", "tttr.engine.replay.calls",
             "tttr.engine.program.triage", "tttr.engine.program.fork", "tttr.engine.program.replay",
             "tttr.engine.traces.against"}
RUNS_VERBS = {"replay", "fork", "check_replay", "check_fork", "AgentPlan"}


def test_the_app_forks_and_experiments_through_the_runs_kind_only():
    """The CLI and the TUI ask `kind_of(run)` / `pair_kind(...)` and call the kind: no app module
    imports a kind's own replay, fork, triage or bisect (the TUI's fork worker and triage screen
    did, and so branched on the kind themselves)."""
    graph = _graph()
    direct = sorted(f"{m} -> {t}" for m, ts in graph.items() if m.startswith("tttr.app") for t in ts & KINDS_OWN)
    assert not direct, direct
    named = []
    for name, path in _modules().items():
        if not name.startswith("tttr.app"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "tttr.engine.replay.runs":
                named += [f"{name}: {a.name}" for a in node.names if a.name in RUNS_VERBS]
            elif isinstance(node, ast.ImportFrom) and node.module == "tttr.engine.replay":
                named += [f"{name}: runs" for a in node.names if a.name == "runs"]
    assert not named, named
    assert "tttr.engine.kinds" in graph["tttr.app.forking"] and "tttr.engine.kinds" in graph["tttr.app.screens.triage"]
    # ... nor asks "which kind is this run?" by a predicate of its own (the edit dialog asked is_program)
    which = re.compile(r"\bis_(program|call|imported)(_run)?\(")
    asking = [f"{name}:{i}" for name, path in _modules().items() if name.startswith("tttr.app")
              for i, line in enumerate(path.read_text().splitlines(), 1) if which.search(line)]
    assert not asking, asking


def test_traces_in_and_out_live_in_the_engine_and_only_they_import_opentelemetry():
    """OpenTelemetry export and import (`tttr export`, `tttr import`) is engine code in
    tttr.engine.traces: it reads runs of every kind and writes the imported kind's runs, and it
    is the only package that imports `opentelemetry` (the optional `otel` extra), so nothing
    else needs the extra installed. It never imports the app."""
    modules = _modules()
    assert "tttr.engine.traces.otlp" in modules and not [m for m in modules if m.startswith("tttr.app.traces")]
    otel = sorted(m for m, path in modules.items() if "opentelemetry" in _third_party_imports(path))
    assert otel and all(m.startswith("tttr.engine.traces.") for m in otel), otel
    graph = _graph()
    assert not [t for m, ts in graph.items() if m.startswith("tttr.engine.traces") for t in ts
                if t.startswith("tttr.app")]


def test_a_runs_steps_and_divergences_are_low_modules_that_every_kind_can_import():
    """engine/replay/steps.py (a run's steps for diff and the compare screen) and
    engine/replay/divergence.py (Divergence, compared values) import nothing of tttr above
    sessions/: the kinds (engine/kinds.py), the replays and diff all import them, and diff asks
    the kinds, so anything more would close a cycle. diff itself asks `kind_of`, never branches."""
    graph = _graph()
    for low in ("tttr.engine.replay.steps", "tttr.engine.replay.divergence"):
        assert all(_package(t) == "sessions" for t in graph[low]), (low, sorted(graph[low]))
    assert "tttr.engine.kinds" in graph["tttr.engine.replay.diff"]
    assert "tttr.engine.replay.steps" in graph["tttr.engine.kinds"]
    importers = sorted(m for m, ts in graph.items() if "tttr.engine.replay.diff" in ts and m.startswith("tttr.engine."))
    assert importers == ["tttr.engine.bench.replay"], importers  # diff is a top: only a benchmark and the app use it


def test_the_benchmarks_are_a_top_that_only_the_app_runs():
    """Every `tttr bench NAME` is tttr.engine.bench.NAME (with its helpers beside it; the
    package's docstring is the index), registered by tttr.app.commands.bench; `bench app`
    drives the terminal app, so it is tttr.app.bench. Nothing else imports a benchmark: the
    engine, kernels, recorders and sessions work without them."""
    graph = _graph()
    assert "tttr.engine.bench" in graph and "tttr.app.commands.bench" in graph
    elsewhere = sorted(m for m in graph if m.rpartition(".")[2].startswith("bench")
                       and not m.startswith("tttr.engine.bench") and m not in ("tttr.app.bench", "tttr.app.commands.bench"))
    assert not elsewhere, f"benchmark modules outside engine/bench/: {elsewhere}"
    offenders = sorted(f"{m} → {t}" for m, ts in graph.items() for t in ts
                       if t.startswith("tttr.engine.bench") and not m.startswith(("tttr.engine.bench", "tttr.app.")))
    assert not offenders, "a benchmark imported below the app:\n" + "\n".join(offenders)
