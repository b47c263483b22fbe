"""A small reader for the Go composite literals and builder chains of Kueue's table-driven tests.

Role: turn ``cases := map[string]struct{...}{ "name": { field: utiltestingapi.MakeWorkload("a", "").Priority(1)
.Obj(), ... } }`` into Python values, so ``extract.py`` can port the test *data* (quantities, queues, expected
victims) without retyping it. Not a Go parser: it knows expressions, composite literals, calls, selectors and
skips function literals; anything else raises ``GoSyntax`` naming the offset.

Function literals made of ``name := expr`` statements and a ``return`` (Go code computing a table value) become
``FuncLit``; any other function literal is ``Opaque``.

Values: strings/numbers as Python values; an identifier path as ``Ident("kueue.StrictFIFO")``; a call as
``Call(func, args)`` (``func`` is an ``Ident`` or a ``Sel`` on a call, which is how builder chains nest);
a composite literal as ``Lit(type, items)`` where items are ``(key, value)`` pairs (key ``None`` when absent).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_TOKEN = re.compile(r"""
    (?P<ws>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<str>"(?:\\.|[^"\\])*"|`[^`]*`)
  | (?P<num>\d[\d_]*(?:\.\d+)?(?:e[+-]?\d+)?)
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\.\.\.|:=|==|!=|<=|>=|&&|\|\||<-|[.,(){}\[\]:&*\-+/;=<>!%|^])
""", re.X | re.S)


class GoSyntax(Exception):
    pass


@dataclass(frozen=True)
class Ident:
    name: str


@dataclass
class Call:
    func: Any
    args: list[Any]


@dataclass
class Sel:
    base: Any
    name: str


@dataclass
class Lit:
    type: str
    items: list[tuple[Any, Any]] = field(default_factory=list)

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self.items:
            if isinstance(k, Ident) and k.name == key or k == key:
                return v
        return default


@dataclass
class Unary:
    op: str
    value: Any


@dataclass
class Binary:
    op: str
    left: Any
    right: Any


class Opaque:
    """A function literal or other code the port does not need."""


@dataclass
class FuncLit:
    """``func() T { a := expr; ...; return expr }``: a table value computed by straight-line Go."""

    assigns: dict[str, Any]
    result: Any


def tokenize(src: str) -> list[tuple[str, str, int]]:
    out = []
    pos = 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            raise GoSyntax(f"unexpected {src[pos:pos + 20]!r} at {pos}")
        kind = m.lastgroup
        if kind != "ws":
            out.append((kind or "", m.group(), pos))
        pos = m.end()
    return out


class Parser:
    def __init__(self, src: str, start: int = 0) -> None:
        self.toks = tokenize(src)
        self.i = next((k for k, t in enumerate(self.toks) if t[2] >= start), len(self.toks))

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.toks[j][1] if j < len(self.toks) else ""

    def kind(self, k: int = 0) -> str:
        j = self.i + k
        return self.toks[j][0] if j < len(self.toks) else ""

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if want is not None and tok != want:
            raise GoSyntax(f"want {want!r}, got {tok!r} at {self.toks[self.i][2] if self.i < len(self.toks) else -1}")
        self.i += 1
        return tok

    def skip_balanced(self, open_: str, close: str) -> None:
        depth = 0
        while True:
            tok = self.take()
            if tok == open_:
                depth += 1
            elif tok == close:
                depth -= 1
                if depth == 0:
                    return

    # -- types -----------------------------------------------------------------------------------------

    def type_expr(self) -> str:
        parts = []
        while True:
            tok = self.peek()
            if tok == "[":
                self.take()
                inner = "" if self.peek() == "]" else self.type_expr()
                self.take("]")
                parts.append(f"[{inner}]")
            elif tok == "*":
                self.take()
                parts.append("*")
            elif tok == "map":
                self.take()
                self.take("[")
                key = self.type_expr()
                self.take("]")
                parts.append(f"map[{key}]")
            elif tok == "struct":
                self.take()
                self.skip_balanced("{", "}")
                parts.append("struct{}")
                return "".join(parts)
            elif tok == "func":
                self.take()
                self.skip_balanced("(", ")")
                if self.peek() == "(":
                    self.skip_balanced("(", ")")
                elif self.kind() == "id" or self.peek() in ("*", "["):
                    self.type_expr()
                parts.append("func")
                return "".join(parts)
            elif self.kind() == "id":
                name = self.take()
                while self.peek() == "." and self.kind(1) == "id":
                    self.take()
                    name += "." + self.take()
                if self.peek() == "[" and self.peek(1) != "]":  # generic instantiation
                    self.skip_balanced("[", "]")
                parts.append(name)
                return "".join(parts)
            else:
                raise GoSyntax(f"bad type at token {tok!r}")

    # -- expressions -----------------------------------------------------------------------------------

    def expr(self) -> Any:
        left = self.unary()
        while self.peek() in ("+", "-", "*", "/") :
            op = self.take()
            left = Binary(op, left, self.unary())
        return left

    def unary(self) -> Any:
        tok = self.peek()
        if tok in ("&", "*", "-", "!"):
            self.take()
            return Unary(tok, self.unary())
        return self.postfix(self.primary())

    def primary(self) -> Any:
        kind, tok = self.kind(), self.peek()
        if kind == "str":
            self.take()
            return tok[1:-1].encode().decode("unicode_escape") if tok[0] == '"' else tok[1:-1]
        if kind == "num":
            self.take()
            tok = tok.replace("_", "")
            return float(tok) if any(c in tok for c in ".e") else int(tok)
        if tok == "(":
            self.take()
            v = self.expr()
            self.take(")")
            return v
        if tok == "func":
            self.type_expr()
            if self.peek() == "{":
                start = self.i
                try:
                    return self.func_body()
                except GoSyntax:
                    self.i = start
                    self.skip_balanced("{", "}")
            return Opaque()
        if tok == "{":
            return self.lit_body("")
        if tok in ("[", "map", "struct"):
            typ = self.type_expr()
            return self.lit_body(typ)
        if kind == "id":
            if tok in ("true", "false"):
                self.take()
                return tok == "true"
            if tok == "nil":
                self.take()
                return None
            name = self.take()
            if self.peek() == "[" and self.peek(2) == "]" and self.peek(3) in ("(", "{"):  # ptr.To[int32](0)
                self.skip_balanced("[", "]")
            return Ident(name)
        raise GoSyntax(f"unexpected token {tok!r} at {self.toks[self.i][2]}")

    def postfix(self, v: Any) -> Any:
        while True:
            tok = self.peek()
            if tok == ".":
                self.take()
                if self.peek() == "(":  # type assertion x.(T)
                    self.skip_balanced("(", ")")
                    continue
                name = self.take()
                v = Ident(f"{v.name}.{name}") if isinstance(v, Ident) else Sel(v, name)
                if self.peek() == "[" and self.peek(2) == "]" and self.peek(3) == "(":
                    self.skip_balanced("[", "]")
            elif tok == "(":
                self.take()
                args = []
                while self.peek() != ")":
                    args.append(self.expr())
                    if self.peek() == "...":
                        self.take()
                    if self.peek() == ",":
                        self.take()
                self.take(")")
                v = Call(v, args)
            elif tok == "{" and isinstance(v, Ident):
                v = self.lit_body(v.name)
            elif tok == "[":
                self.take()
                idx = self.expr()
                self.take("]")
                v = Call(Ident("index"), [v, idx])
            else:
                return v

    def func_body(self) -> FuncLit:
        """Only ``name := expr`` statements and a final ``return expr``; anything else is GoSyntax."""
        self.take("{")
        assigns: dict[str, Any] = {}
        while True:
            if self.peek() == "return":
                self.take()
                result = self.expr()
                self.take("}")
                return FuncLit(assigns, result)
            if self.kind() == "id" and self.peek(1) == ":=":
                name = self.take()
                self.take(":=")
                assigns[name] = self.expr()
                continue
            raise GoSyntax(f"statement {self.peek()!r} in a function literal")

    def lit_body(self, typ: str) -> Lit:
        self.take("{")
        lit = Lit(typ)
        while self.peek() != "}":
            first = self.expr()
            if self.peek() == ":":
                self.take()
                lit.items.append((first, self.expr()))
            else:
                lit.items.append((None, first))
            if self.peek() == ",":
                self.take()
        self.take("}")
        return lit


def parse_at(src: str, marker: str, occurrence: int = 0) -> Any:
    """Parse the expression that starts right after ``marker`` (e.g. ``"cases := "``)."""
    pos = -1
    for _ in range(occurrence + 1):
        pos = src.index(marker, pos + 1)
    p = Parser(src, pos + len(marker))
    return p.expr()


def assignments(src: str, func: str) -> dict[str, Any]:
    """Every ``name := expr`` at the top level of Go function ``func`` before its case table."""
    start = src.index(f"func {func}(")
    body = src.index("{", src.index(")", start))
    p = Parser(src, body + 1)
    out: dict[str, Any] = {}
    depth = 0
    while p.i < len(p.toks):
        tok = p.peek()
        if depth == 0 and p.kind() == "id" and p.peek(1) == ":=":
            name = p.take()
            p.take(":=")
            if name == "cases":
                break
            try:
                out[name] = p.expr()
            except GoSyntax:
                out[name] = Opaque()
            continue
        if tok in ("{", "("):
            depth += 1
        elif tok in ("}", ")"):
            depth -= 1
            if depth < 0:
                break
        p.take()
    return out
