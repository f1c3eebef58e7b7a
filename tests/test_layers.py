"""The package's layers, read from the code's imports (docs/architecture.md).

Every `import` / `from ... import` in src/margrpo, at module level or inside a function, is
an edge. The test asserts that the graph has no cycle and that no module imports one of a
higher layer. Layers, lowest first (a module belongs to the longest prefix that names it):
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
    # the embedded study's wiring of trainer, world and evaluation (pipeline and scripts),
    # and the benchmark scripts' shared timing helpers
    ("study", ("margrpo.study", "margrpo.benchtools")),
]


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


def test_import_graph_has_no_cycle():
    g = graph()
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
            raise AssertionError("import cycle: " + " -> ".join(cycle))


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


def test_scripts_import_no_other_script():
    """Shared code lives in the package: a script never imports another script."""
    scripts = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    offenders = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name} imports {n}" for n in names if n.split(".")[0] in scripts | {"scripts"}]
    assert not offenders, "\n".join(offenders)
