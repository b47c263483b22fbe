"""YAML with line numbers, and the translation of every config problem into ``ConfigError`` issues.

Shared by ``tau.yaml`` and ``platform.yaml`` so both speak the same way: each issue is a dict ``{field,
message, fix, file, line}`` (the shape of ``core.contracts.Issue``) and ``str(ConfigError)`` reads
``tau.yaml:7: compute.gpuz: unknown key; did you mean 'gpus'?``, one problem per line.

Invariants: YAML is parsed with ``SafeLoader`` only (no arbitrary tags); a document is refused before it is
parsed when it is over its size limit, and before anything is constructed when its aliases expand past the bounds
of ``config.expansion`` (nodes, bytes as JSON, depth: measured on the composed graph, which shares aliased nodes,
so the cost is linear in the text while a "billion laughs" would expand exponentially); a field path is dotted with list
indexes in brackets (``cluster_queues[0].cohort``); the line is that of the key (or list item) named by the
path, or of its nearest parent that has one.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

import pydantic
import yaml

from taugrid.config import expansion
from taugrid.core.errors import ConfigError
from taugrid.core.limits import (
    PLATFORM_YAML_MAX_BYTES,
    PLATFORM_YAML_MAX_EXPANDED_BYTES,
    PLATFORM_YAML_MAX_NODES,
    TAU_YAML_MAX_BYTES,
    TAU_YAML_MAX_EXPANDED_BYTES,
    YAML_MAX_NODES,
    size_text,
)

Path = tuple[str | int, ...]
Lines = dict[Path, int]


def field_path(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def line_of(lines: Lines, path: Path) -> int | None:
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def make_issue(
    path: Path | str, message: str, fix: str = "", *, file: str, lines: Lines
) -> dict[str, object]:
    if isinstance(path, str):
        return {"field": path, "message": message, "fix": fix, "file": file, "line": None}
    return {
        "field": field_path(path),
        "message": message,
        "fix": fix,
        "file": file,
        "line": line_of(lines, path),
    }


def format_issue(issue: dict[str, object]) -> str:
    where = str(issue.get("file") or "")
    if issue.get("line") is not None:
        where += f":{issue['line']}"
    head = f"{where}: " if where else ""
    field = f"{issue['field']}: " if issue.get("field") else ""
    text = f"{head}{field}{issue['message']}"
    if issue.get("fix"):
        text += f"\n    fix: {issue['fix']}"
    return text


def raise_issues(issues: list[dict[str, object]]) -> None:
    """Raise one ``ConfigError`` carrying every issue (deduplicated, sorted by line), or return if none."""
    if not issues:
        return
    seen: set[tuple[object, object]] = set()
    unique = []
    for issue in issues:
        key = (issue["field"], issue["message"])
        if key not in seen:
            seen.add(key)
            unique.append(issue)
    unique.sort(key=lambda i: (i["line"] is None, i["line"] or 0, str(i["field"])))
    raise ConfigError("\n".join(format_issue(i) for i in unique), issues=unique)


def load_yaml(text: str, *, path: str, what: str) -> tuple[dict[str, Any], Lines]:
    """Parse one YAML mapping and record the line of every key and list item. Raises ``ConfigError``."""
    limit = _MAX_BYTES.get(what, TAU_YAML_MAX_BYTES)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        _refuse(path, f"the document is {size} bytes; the limit for a {what} is {size_text(limit)}",
                "keep large data out of the config: ship it in the project folder or as a file the run reads")
    try:
        bounds = expansion.Bounds(json_bytes=_MAX_EXPANDED.get(what, TAU_YAML_MAX_EXPANDED_BYTES),
                                  nodes=_MAX_NODES.get(what, YAML_MAX_NODES))
        node, data = expansion.load(text, bounds)
    except expansion.Refused as exc:
        _refuse(path, exc.message, exc.fix, line=exc.line)
    except RecursionError:  # a backstop: expansion bounds nesting far below Python's recursion limit
        _refuse(path, "the document nests too deeply to read", "flatten the nested lists and mappings")
    except yaml.YAMLError as exc:
        line, problem, fix = yaml_problem(exc)
        _refuse(path, f"not valid YAML: {problem}", fix, line=line)
    except ValueError as exc:  # a scalar the constructor cannot make: an integer of more than 4300 digits
        _refuse(path, f"a value cannot be read: {str(exc).split(';')[0]}", "quote the value to keep it as a string")
    if data is None or not isinstance(data, dict):
        got = "empty" if data is None else f"a {type(data).__name__}"
        message = f"{what} must be a YAML mapping of keys to values; this file is {got}"
        raise ConfigError(
            f"{path}: {message}",
            issues=[
                {
                    "field": "",
                    "message": message,
                    "fix": f"start the file with top-level keys, e.g. {_EXAMPLE[what]}",
                    "file": path,
                    "line": 1,
                }
            ],
        )
    lines: Lines = {}
    duplicates: list[dict[str, object]] = []
    _walk(node, (), lines, duplicates, path)
    raise_issues(duplicates)
    return {str(k): v for k, v in data.items()}, lines


_MAX_BYTES = {"tau.yaml": TAU_YAML_MAX_BYTES, "platform.yaml": PLATFORM_YAML_MAX_BYTES}
_MAX_EXPANDED = {"tau.yaml": TAU_YAML_MAX_EXPANDED_BYTES, "platform.yaml": PLATFORM_YAML_MAX_EXPANDED_BYTES}
_MAX_NODES = {"platform.yaml": PLATFORM_YAML_MAX_NODES}  # a platform of 1,000 ClusterQueues is a real one


def yaml_problem(exc: yaml.YAMLError) -> tuple[int | None, str, str]:
    """(line, problem, fix) of a YAML syntax error. The parser notices some mistakes only on a later line (a key
    without its ':', a '{' or quote never closed); the line is then the one where the mistake was made."""
    problem_mark = getattr(exc, "problem_mark", None)
    context_mark = getattr(exc, "context_mark", None)
    problem = str(getattr(exc, "problem", None) or exc)
    context = str(getattr(exc, "context", None) or "")
    at = problem_mark.line + 1 if problem_mark is not None else None
    opened = context_mark.line + 1 if context_mark is not None else at
    if "could not find expected ':'" in problem and "simple key" in context:
        return opened, "a key without ':'", f"write 'key: value' on line {opened} (a space after the ':')"
    if "flow mapping" in context or "flow sequence" in context:
        bracket = "}" if "mapping" in context else "]"
        return opened, f"{problem} (a '{bracket}' is missing)", (
            f"close the '{'{' if bracket == '}' else '['}' opened on line {opened} with '{bracket}', or write its "
            "entries as indented lines")
    if "quoted scalar" in context:
        return opened, f"a quote is never closed ({problem})", f"close the quote opened on line {opened}"
    if "'\\t'" in problem:  # PyYAML writes the tab it found as '\t'
        return at, "a tab in the indentation", f"indent line {at} with spaces, not tabs"
    if "mapping values are not allowed" in problem:
        return at, problem, f"quote the value on line {at} if it holds ': ' (e.g. name: 'a: b')"
    if "expected <block end>" in problem:
        return at, f"line {at} is indented unlike the lines around it", (
            f"indent line {at} as its siblings are (a list item starts with '- ')")
    return at, problem, "fix the YAML syntax (indentation, quotes, colons)"


def _refuse(path: str, message: str, fix: str, *, line: int | None = None) -> None:
    issue: dict[str, object] = {"field": "", "message": message, "fix": fix, "file": path, "line": line}
    raise ConfigError(format_issue(issue), issues=[issue])


_EXAMPLE = {"tau.yaml": "'name: train' and 'entrypoint: train.py'", "platform.yaml": "'workspaces:'"}


def _walk(node: yaml.Node, path: Path, lines: Lines, issues: list[dict[str, object]], file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            sub = (*path, key)
            if key in seen and key != "<<":
                issues.append(
                    {
                        "field": field_path(sub),
                        "message": "duplicate key; YAML keeps only the last one",
                        "fix": "remove one of the two entries",
                        "file": file,
                        "line": key_node.start_mark.line + 1,
                    }
                )
            seen.add(key)
            lines.setdefault(sub, key_node.start_mark.line + 1)
            _walk(value_node, sub, lines, issues, file)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines.setdefault((*path, index), item.start_mark.line + 1)
            _walk(item, (*path, index), lines, issues, file)


# ---- pydantic errors → issues ----


def _candidates(tp: Any) -> list[Any]:
    """The concrete types inside an annotation (unwrapping Optional, Annotated and unions)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _candidates(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [c for arg in typing.get_args(tp) for c in _candidates(arg)]
    return [tp]


def _model_at(model: type[pydantic.BaseModel], loc: Path) -> type[pydantic.BaseModel] | None:
    """Follow a pydantic error location through nested models, lists and dicts to the enclosing model."""
    current: list[Any] = [model]
    for part in loc:
        nxt: list[Any] = []
        for tp in current:
            if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
                field = tp.model_fields.get(str(part))
                if field is not None:
                    nxt.extend(_candidates(field.annotation))
            elif typing.get_origin(tp) in (list, tuple) and isinstance(part, int):
                nxt.extend(c for a in typing.get_args(tp)[:1] for c in _candidates(a))
            elif typing.get_origin(tp) is dict:
                nxt.extend(_candidates(typing.get_args(tp)[1]))
        current = nxt
    for tp in current:
        if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
            return tp
    return None


def suggest(word: str, options: list[str]) -> str | None:
    import difflib  # here: only a mistake needs it, and every service that reads the platform imports this module

    found = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return found[0] if found else None


def pydantic_issues(
    exc: pydantic.ValidationError,
    model: type[pydantic.BaseModel],
    *,
    file: str,
    lines: Lines,
    elsewhere: dict[tuple[str, ...], tuple[str, str]] | None = None,
) -> list[dict[str, object]]:
    """``elsewhere``: keys people write for a setting that lives under another key: (where it is, the fix)."""
    issues = []
    for err in exc.errors(include_url=False):
        loc: Path = tuple(p for p in err["loc"] if isinstance(p, int) or not _is_union_tag(p))
        kind = err["type"]
        meant = (elsewhere or {}).get(tuple(map(str, loc))) if kind == "extra_forbidden" else None
        if meant is not None:
            message, fix = f"unknown key; {meant[0]}", meant[1]
        elif kind == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            valid = sorted(parent.model_fields) if parent else []
            guess = suggest(str(loc[-1]), valid)
            message = "unknown key" + (f"; did you mean '{guess}'?" if guess else "")
            fix = (
                f"rename '{loc[-1]}' to '{guess}'"
                if guess
                else f"remove it; valid keys here: {', '.join(valid)}"
                if valid
                else "remove it"
            )
        elif kind == "missing":
            message, fix = "required key is missing", f"add '{loc[-1]}'"
        else:
            value = err.get("input")
            shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
            message = _plain(err["msg"])
            if shown not in message:
                message += f" (got {shown})"
            fix = _FIXES.get(kind, "")
            if kind == "literal_error":
                fix = "use " + err["msg"].removeprefix("Input should be ")
            elif not fix and "; " in message:  # our validators say "<what is wrong>; <what to write>"
                message, fix = message.split("; ", 1)
            if not fix:
                fix = (f"see `tau run schema` for what {'.'.join(map(str, loc))} takes" if model.__name__ ==
                       "TauConfig" else "write a value of the kind the message names")
        issues.append(make_issue(loc, message, fix, file=file, lines=lines))
    return issues


def _is_union_tag(part: str | int) -> bool:
    # pydantic adds the union member (``str``, ``function-after[...]``) to the location of a union error
    # (lower-case names like ``function-after[_duration(), str]``); a user's key such as ``n[me`` is not one
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool", "list", "dict", "none"} or _UNION_TAG.fullmatch(part) is not None
    )


_UNION_TAG = re.compile(r"[a-z][a-z0-9-]*\[.*\]", re.S)


def _plain(msg: str) -> str:
    return msg.removeprefix("Value error, ")


_FIXES = {
    "int_parsing": "use a whole number",
    "int_type": "use a whole number",
    "int_from_float": "use a whole number",
    "float_parsing": "use a number",
    "float_type": "use a number",
    "bool_parsing": "use true or false",
    "bool_type": "use true or false",
    "string_type": "quote the value as a string",
    "list_type": "use a YAML list",
    "dict_type": "use a YAML mapping (key: value)",
    "model_type": "use a YAML mapping (key: value)",
    "greater_than": "use a larger value",
    "less_than": "use a smaller value",
    "greater_than_equal": "use a larger value",
    "less_than_equal": "use a smaller value",
}
