"""``config.expansion.load`` composes a document with libyaml (``CSafeLoader``: a 1,000-queue platform in about a
third of the pure-Python time) when its nesting as written is shallow, and with the pure-Python ``BoundedLoader``
otherwise or when libyaml refuses it: a valid document reads the same either way (values and the line of every
key), and a refusal is the pure-Python loader's, word for word."""

from __future__ import annotations

import pytest
import yaml

from taugrid.config import expansion
from taugrid.config.source import load_yaml
from taugrid.core.errors import ConfigError
from taugrid.core.limits import YAML_MAX_DEPTH
from tests.platforms import lab_platform, workspace

ANCHORED = """\
defaults: &defaults
  namespace: ns
  local_queue: q
workspaces:
  - name: a
    <<: *defaults
  - name: b
    <<: *defaults
    default_priority: high
numbers: [1, 2.5, 0x1f, yes, null, 2026-12-01, "quoted"]
text: |
  two
  lines
"""

REFUSED = {
    "a tab": "name: t\n\tentrypoint: t.py\n",
    "a key without a colon": "name: t\nentrypoint t.py\nworkspace: w\n",
    "a quote never closed": "name: 't\nentrypoint: t.py\n",
    "a flow mapping never closed": "name: {a: 1\nentrypoint: t.py\n",
    "a duplicate key": "name: t\nentrypoint: t.py\nname: u\n",
    "a recursive alias": "name: &a [*a]\n",
    "an undefined alias": "name: *nowhere\n",
    "a bomb": "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(6)),
    "not a mapping": "- a\n- b\n",
    "a surrogate": "name: \udc80\n",
}


def both(text: str, what: str, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    """What ``load_yaml`` gives (or the ConfigError it raises) with libyaml, then without it."""

    def outcome() -> object:
        try:
            return load_yaml(text, path=what, what=what)
        except ConfigError as err:
            return str(err), err.issues

    fast = outcome()
    monkeypatch.setattr(expansion, "_FAST_LOADER", None)
    pure = outcome()
    monkeypatch.undo()
    return fast, pure


def test_libyaml_is_built_in() -> None:
    assert expansion._FAST_LOADER is yaml.CSafeLoader  # the venv's PyYAML wheel bundles libyaml


@pytest.mark.parametrize("text", [ANCHORED, lab_platform(workspaces=[workspace("lab")])])
def test_a_valid_document_reads_the_same_with_libyaml(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert expansion._shallow(text, YAML_MAX_DEPTH)
    fast, pure = both(text, "platform.yaml", monkeypatch)
    assert isinstance(fast, tuple) and isinstance(fast[0], dict)
    assert fast == pure


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refusal_is_the_pure_python_loaders(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, pure = both(REFUSED[name], "tau.yaml", monkeypatch)
    assert isinstance(fast, tuple) and isinstance(fast[0], str)  # refused, with its issues
    assert fast == pure


def test_a_deep_document_never_reaches_libyaml_s_composer() -> None:
    """libyaml's composer recurses in C, unguarded: 100,000 levels would overflow the stack there. The flat pass
    over the events sends the document to the pure-Python loader, which refuses it at the bound."""
    levels = 100_000
    text = "name: " + "[" * levels + "]" * levels + "\n"
    assert not expansion._shallow(text, YAML_MAX_DEPTH)
    with pytest.raises(ConfigError) as err:
        load_yaml(text, path="tau.yaml", what="tau.yaml")
    assert str(err.value).startswith(f"tau.yaml:1: the document nests deeper than {YAML_MAX_DEPTH} levels of lists "
                                     "and mappings (aliases expanded)")


@pytest.mark.parametrize("text", [
    "name: a\r\nentrypoint: t.py\r\nworkspace: w\r\n",  # CRLF
    "name: a\rentrypoint: t.py\rworkspace: w\r",  # a lone CR
    "name: a\x85entrypoint: t.py\nworkspace: w\n",  # NEL, a YAML 1.1 line break
    "name: a\u2028entrypoint: t.py\nworkspace: w\n",  # LINE SEPARATOR, likewise
    "\ufeffname: a\nentrypoint: t.py\n",  # a BOM
    "name: \U0001f600\nentrypoint: t.py\n",  # outside the BMP
    "a: 0b101\nb: 1_000\nc: 0777\nd: 1:20\ne: .inf\nf: 2001-12-14t21:59:43.10-05:00\ng: !!set {x}\n",  # YAML 1.1
])
def test_line_breaks_and_yaml_1_1_scalars_read_the_same(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key lines come from libyaml's marks on the fast path: its line breaks must count as the pure reader's."""
    assert expansion._shallow(text, YAML_MAX_DEPTH)
    fast, pure = both(text, "tau.yaml", monkeypatch)
    assert isinstance(fast, tuple) and isinstance(fast[0], dict)
    assert fast == pure


@pytest.mark.parametrize("text", ["name: a\x07b\n", "name: a\x00\n", "name: a\x7fb\n", "name: a\ufffeb\n",
                                  "name: a\x9bb\n", "name: a\n---\nname: b\n", "name: !!python/object:os.system x\n"])
def test_characters_and_tags_the_pure_reader_refuses_are_refused_in_its_words(
        text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, pure = both(text, "tau.yaml", monkeypatch)
    assert isinstance(fast, tuple) and isinstance(fast[0], str)
    assert fast == pure
