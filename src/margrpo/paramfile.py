"""Reading a params file: YAML with the line of every key, dotted overrides, and messages.

Every problem is reported as a few lines that name the file, the line, the dotted key,
what is wrong and the fix:

    params.yaml does not validate (1 problem):
      params.yaml:57: train.lr: Input should be a finite number (given: inf)
        fix: set train.lr to a valid value (default 0.0001)

Overrides (`-S key=value`, tests' dotted dicts) are applied here once for every caller;
list entries are addressed by index (`rewards.0.mode=geneval`), and a key the file lacks
is added (DVC's `+key=value`) so that the schema reports it if it is unknown. `lookup`,
`get`, `set_key` and `delete_key` are the one walker of dotted keys in a parsed params
tree (plain or round-trip YAML): the overrides, the guard and its restore use them.
"""
from __future__ import annotations

import copy
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined


class ParamsError(ValueError):
    """params.yaml does not validate; the message names every offending key and the fix."""


RESTORE = "restore it with `git checkout -- {path}`"


def read_yaml(path: str | Path) -> tuple[Any, dict[tuple, int]]:
    """(tree, {key path: line}) of a YAML file; ParamsError naming file and line otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: not found (looked for {path.resolve()}). Run from the repository root, "
                          f"pass the file's path, or {RESTORE.format(path=path)}.")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ParamsError(f"{path}:{line}: not UTF-8 text. Save the file as UTF-8, or {RESTORE.format(path=path)}.") from None
    return parse_yaml(text, path)


def parse_yaml(text: str, path: str | Path) -> tuple[Any, dict[tuple, int]]:
    """read_yaml of a file's text (`path` names it in the messages)."""
    path = Path(path)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        raw = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ParamsError(f"{where}: not valid YAML ({problem}). Fix that line, or {RESTORE.format(path=path)}.") from None
    finally:
        loader.dispose()
    lines: dict[tuple, int] = {}
    if node is not None:
        _key_lines(node, (), lines, path)
    return raw, lines


def _key_lines(node: yaml.Node, prefix: tuple, out: dict[tuple, int], path: Path) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = prefix + (key_node.value,)
            if key in out:
                raise ParamsError(f"{path}:{key_node.start_mark.line + 1}: {'.'.join(map(str, key))} appears twice "
                                  f"(also line {out[key]}); YAML keeps only the last one. Fix: delete one of them.")
            out[key] = key_node.start_mark.line + 1
            _key_lines(value_node, key, out, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[prefix + (i,)] = item.start_mark.line + 1
            _key_lines(item, prefix + (i,), out, path)


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """`key=value` strings (as after -S) -> {dotted key: YAML value}. A leading "+" (DVC's
    form for a key the file lacks) is dropped: the schema decides whether the key exists."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().removeprefix("+")
        if not sep or not key:
            raise ParamsError(f"override {item!r}: expected key=value, e.g. train.lr=1e-4 or rewards.0.mode=geneval")
        try:
            out[key] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ParamsError(f"override {item!r}: {text!r} is not a YAML value; quote it or fix it") from None
    return out


def _child(node: Any, part: str) -> tuple[bool, Any]:
    """(found, value) of one step of a dotted key: a mapping's key or a list's index."""
    if isinstance(node, Mapping):
        return part in node, node.get(part)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return True, node[int(part)]
    return False, None


def lookup(tree: Any, dotted: str) -> tuple[bool, Any]:
    """(found, value) of a dotted key (`train.lr`, `rewards.0.weight`) in a parsed tree."""
    node = tree
    for part in dotted.split("."):
        found, node = _child(node, part)
        if not found:
            return False, None
    return True, node


def get(tree: Any, dotted: str, default: Any = None) -> Any:
    found, value = lookup(tree, dotted)
    return value if found else default


def set_key(tree: Any, dotted: str, value: Any, source: str = "params.yaml") -> None:
    """Set a dotted key in place; missing sections are created as mappings. ParamsError
    (naming the key) when a step is a list index out of range or a value, not a section."""
    node, parts = tree, dotted.split(".")
    for depth, part in enumerate(parts):
        here = ".".join(parts[:depth]) or "the top level"
        step: Any = part
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ParamsError(f"{dotted}: {here} is a list of {len(node)} entries; "
                                  f"{part!r} is not an index of it (0 to {len(node) - 1})")
            step = int(part)
        elif not isinstance(node, dict):
            raise ParamsError(f"{dotted}: {here} in {source} is the value {node!r}, not a section")
        if depth == len(parts) - 1:
            node[step] = value
            return
        if isinstance(node, dict) and step not in node:
            node[step] = {}
        node = node[step]


def delete_key(tree: Any, dotted: str) -> bool:
    """Remove a dotted key (a list entry by index); whether it was there."""
    *parents, leaf = dotted.split(".")
    found, node = lookup(tree, ".".join(parents)) if parents else (True, tree)
    if not found or not _child(node, leaf)[0]:
        return False
    del node[int(leaf) if isinstance(node, list) else leaf]
    return True


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A copy of raw with each dotted key set; list entries by index (rewards.0.mode)."""
    out = copy.deepcopy(dict(raw))
    for dotted, value in overrides.items():
        try:
            set_key(out, dotted, value, source)
        except ParamsError as err:
            raise ParamsError(f"override {err}") from None
    return out


def problems_text(source: str, entries: list[tuple[int, str]]) -> str:
    """The message of a file with problems: (line for the order, "where key: problem\n    fix: ...")."""
    entries = sorted(entries, key=lambda t: t[0])
    n = len(entries)
    return f"{source} does not validate ({n} problem{'s' * (n != 1)}):\n" + "\n".join(f"  {t}" for _, t in entries)


def where(source: str, lines: Mapping[tuple, int], path: tuple, overrides: Mapping[str, Any]) -> str:
    """"params.yaml:57: " for a key of the file, "params.yaml (override k=v): " for an override."""
    text = tuple(str(p) for p in path)
    for key, value in overrides.items():
        parts = tuple(key.split("."))
        if text and (text[: len(parts)] == parts or parts[: len(text)] == text):
            return f"{source} (override {key}={value!r}): "
    for n in range(len(path), 0, -1):
        if path[:n] in lines:
            return f"{source}:{lines[path[:n]]}: "
    return f"{source}: "


def format_errors(err: ValidationError, source: str, lines: Mapping[tuple, int],
                  overrides: Mapping[str, Any], schema: type[BaseModel]) -> str:
    entries = []
    for e in err.errors():
        path = tuple(e["loc"])
        if e["type"] == "cross_field":
            path += tuple(e["ctx"]["key"].split("."))
        dotted = ".".join(map(str, path)) or "<top level>"
        entries.append((lines.get(path, 10**9), where(source, lines, path, overrides) + dotted + ": "
                        + _problem_text(e, path, schema)))
    return problems_text(source, entries)


def _problem_text(e: dict, path: tuple, schema: type[BaseModel]) -> str:
    dotted = ".".join(map(str, path))
    kind = e["type"]
    if kind == "extra_forbidden":
        parent = _model_at(schema, path[:-1])
        known = ", ".join(parent.model_fields) if parent else "?"
        return f"unknown key\n    fix: remove it or correct its spelling; {'.'.join(map(str, path[:-1])) or 'the top level'} takes: {known}"
    if kind == "missing" and isinstance(path[-1], int):
        parent = ".".join(map(str, path[:-1]))
        return (f"missing: {parent} is too short\n    fix: give {parent} {path[-1] + 1} values "
                f"(default {_default_at(schema, path)!r})")
    if kind == "missing":
        return "missing\n    fix: add it (the study's params.yaml sets it: git show HEAD:params.yaml)"
    if kind == "cross_field":
        return f"{e['ctx']['message']}\n    fix: {e['ctx']['fix']}"
    given = f" (given: {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""
    default = _default_at(schema, path)
    hint = f" (default {default!r})" if default is not PydanticUndefined else ""
    return f"{e['msg']}{given}\n    fix: set {dotted} to a valid value{hint}"


def _model_at(schema: type[BaseModel], path: tuple) -> type[BaseModel] | None:
    """The pydantic model that holds the fields at `path` (list indices and dict keys of
    `dict[str, Model]` are stepped over)."""
    model, i = schema, 0
    while i < len(path):
        field = model.model_fields.get(str(path[i]))
        if field is None:
            return None
        inner = _inner_model(field.annotation)
        if inner is None:
            return None
        origin = typing.get_origin(field.annotation)
        i += 2 if origin in (list, dict) else 1
        model = inner
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (found := _inner_model(arg)) is not None:
            return found
    return None


def _default_at(schema: type[BaseModel], path: tuple) -> Any:
    """The schema default of the field at path (the study's value), or PydanticUndefined."""
    for cut in range(len(path), 0, -1):  # an error inside a list / tuple value: the whole field
        model = _model_at(schema, path[: cut - 1])
        field = model.model_fields.get(str(path[cut - 1])) if model else None
        if field is not None:
            if field.default_factory is not None:
                return field.default_factory()
            return field.default
    return PydanticUndefined

