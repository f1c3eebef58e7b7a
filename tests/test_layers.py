"""The package's layers, read from the code's imports (docs/architecture.md).

Every `import` / `from ... import` in src/margrpo, at module level or inside a function, is
an edge. The test asserts that the graph has no cycle and that no module imports one of a
higher layer. Layers, lowest first (a module belongs to the longest prefix that names it):
LAYERS below. On top sit pipeline/ (its own graph has no cycle either) and the tools:
scripts/, benchmarks/ and probes/ may import any layer, but no tool imports another tool
(shared code lives in the package) and neither the package nor pipeline/ imports a tool.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "margrpo"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # params.yaml schema, shared helpers, and the reward table (names only, no imports)
    ("base", ("margrpo", "margrpo.config", "margrpo.config_sections", "margrpo.jsonl", "margrpo.stats", "margrpo.rewards.table")),
    # the model core (knows no world, no benchmark) and the reward scorers
    ("backends", ("margrpo.models", "margrpo.rewards")),
    # GenEval / T2I-CompBench rules, detections, real-image protocols (never the world)
    ("benchmarks", ("margrpo.eval",)),
    # the embedded world: grammar, renderer, detector, evaluator, prompts, data, reward,
    # sampling and scoring a policy on its prompts
    ("world", ("margrpo.world",)),
    # process machinery: torchrun launch, ranks and their collectives
    ("ranks", ("margrpo.ranks",)),
    # the method's maths: advantages, token plan and selection, estimators, losses
    ("method", ("margrpo.method",)),
    # the training loop around it: trainer (collect, update), loop, step metrics, probes
    ("training", ("margrpo.training",)),
    # MLflow bookkeeping and the generated report
    ("reporting", ("margrpo.tracking", "margrpo.report")),
    # the measurements behind probes/ that tests also run (estimator toy, resample's bias, power)
    ("probes", ("margrpo.probes",)),
    # the embedded study's wiring of trainer, world and evaluation (pipeline and scripts),
    # the ablation's DVC experiments, the bitwise replay, and the benchmarks' shared helpers
    ("study", ("margrpo.study", "margrpo.experiments", "margrpo.replay", "margrpo.benchtools")),
]
TOOLS = ("scripts", "benchmarks", "probes")  # top-level folders of commands, on top of everything


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """margrpo modules that `path` imports (relative imports resolved)."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            # `from margrpo.x import y` may name the submodule margrpo.x.y
            out |= {f"{name}.{a.name}" for a in node.names}
    known = {module_name(p) for p in SRC.rglob("*.py")}
    return {m for m in out if m in known and m != mod}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted(SRC.rglob("*.py"))}


def layer_of(module: str) -> int:
    best, level = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    assert level is not None, f"{module} is in no layer; add it to LAYERS and docs/architecture.md"
    return level


def test_every_module_has_a_layer():
    for module in graph():
        layer_of(module)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    back = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
            for m, deps in graph().items() for d in sorted(deps) if layer_of(d) > layer_of(m)]
    assert not back, "imports against the layer order:\n" + "\n".join(back)


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """The first import cycle of graph `g` (depth first, in name order), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_import_graph_has_no_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_sees_a_back_arrow_and_a_cycle(tmp_path, monkeypatch):
    """Control: a models module importing the world, and two modules importing each other,
    are reported (so a passing run means the graph is clean, not that nothing was read)."""
    pkg = tmp_path / "margrpo"
    (pkg / "models").mkdir(parents=True)
    (pkg / "world").mkdir()
    for p in (pkg / "__init__.py", pkg / "models" / "__init__.py", pkg / "world" / "__init__.py"):
        p.write_text("")
    (pkg / "models" / "a.py").write_text("from margrpo.world import b\n")
    (pkg / "world" / "b.py").write_text("def f():\n    from margrpo.models.a import x\n")
    monkeypatch.setitem(globals(), "SRC", pkg)
    g = graph()
    assert g["margrpo.models.a"] == {"margrpo.world", "margrpo.world.b"}
    assert g["margrpo.world.b"] == {"margrpo.models.a"}
    with pytest.raises(AssertionError, match=r"margrpo\.models\.a \(backends\) imports margrpo\.world\.b \(world\)"):
        test_no_import_from_a_lower_layer_to_a_higher_one()
    with pytest.raises(AssertionError, match="import cycle: margrpo.models.a -> margrpo.world.b -> margrpo.models.a"):
        test_import_graph_has_no_cycle()


def _top_imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports in `path` (relative ones stay in their package)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def _loads_by_path(path: Path, folders) -> list[str]:
    """String constants naming a .py file in one of `folders` (runpy / importlib by path)."""
    text = path.read_text(encoding="utf-8")
    return [n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and n.value.endswith(".py") and n.value.split("/")[0] in folders]


def tool_files(root: Path = ROOT) -> dict[str, list[Path]]:
    return {folder: sorted((root / folder).glob("*.py")) for folder in TOOLS}


def tool_offenders(root: Path = ROOT) -> list[str]:
    """A tool importing another tool (by module name, its folder, or its file); the package or
    pipeline/ importing a tool."""
    tools = tool_files(root)
    stems = {p.stem for paths in tools.values() for p in paths}
    out = []
    for folder, paths in tools.items():
        for path in paths:
            for name in sorted(_top_imports(path) & (stems | set(TOOLS))):
                out.append(f"{folder}/{path.name} imports {name}")
            out += [f"{folder}/{path.name} loads {f}" for f in _loads_by_path(path, TOOLS)]
    for path in sorted([*(root / "src" / "margrpo").rglob("*.py"), *(root / "pipeline").rglob("*.py")]):
        rel = path.relative_to(root)
        out += [f"{rel} imports {name}" for name in sorted(_top_imports(path) & set(TOOLS))]
        out += [f"{rel} loads {f}" for f in _loads_by_path(path, TOOLS)]
    return out


def test_no_tool_imports_another_and_nothing_below_imports_a_tool():
    """scripts/, benchmarks/ and probes/ sit on top: shared code lives in the package."""
    offenders = tool_offenders()
    assert not offenders, "\n".join(offenders)


def test_the_tool_checker_sees_a_tool_importing_a_tool(tmp_path):
    """Control: a probe importing a benchmark, a script loading a probe by path, and a package
    module importing a script are each reported."""
    for folder in (*TOOLS, "src/margrpo", "pipeline"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "benchmarks" / "step_time.py").write_text("import torch\n")
    (tmp_path / "probes" / "grad_snr.py").write_text("from step_time import count_flops\n")
    (tmp_path / "scripts" / "check.py").write_text("import runpy\nrunpy.run_path('probes/grad_snr.py')\n")
    (tmp_path / "src" / "margrpo" / "study.py").write_text("def f():\n    from scripts import check\n")
    (tmp_path / "pipeline" / "common.py").write_text("from margrpo.probes import power\n")  # the package's: fine
    assert sorted(tool_offenders(tmp_path)) == ["probes/grad_snr.py imports step_time",
                                                "scripts/check.py loads probes/grad_snr.py",
                                                "src/margrpo/study.py imports scripts"]


def pipeline_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """pipeline.<module> -> the pipeline modules it imports (module level or in a function)."""
    mods = {p.stem for p in (root / "pipeline").glob("*.py") if p.stem != "__init__"}
    g = {}
    for path in sorted((root / "pipeline").glob("*.py")):
        if path.stem == "__init__":
            continue
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith("pipeline.")}
            elif isinstance(node, ast.ImportFrom) and node.module == "pipeline":
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline."):
                deps.add(node.module.split(".")[1])
        g[path.stem] = (deps & mods) - {path.stem}
    return g


def test_pipeline_modules_import_no_cycle():
    g = pipeline_graph()
    assert "common" in g["proc"] and "proc" not in g["common"]  # the process reads the shared paths, not back
    cycle = find_cycle(g)
    assert cycle is None, "import cycle in pipeline/: " + " -> ".join(cycle)


def test_the_pipeline_checker_sees_a_cycle(tmp_path):
    """Control: common importing proc inside a function, proc importing common, is a cycle."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "common.py").write_text("def f():\n    from pipeline import proc\n")
    (tmp_path / "pipeline" / "proc.py").write_text("from pipeline import common\n")
    assert find_cycle(pipeline_graph(tmp_path)) == ["common", "proc", "common"]
