"""Reading a config file's YAML safely: a key given twice is an error, aliases have a budget (an alias bomb is
refused before it is built), and an integer has at most 40 digits."""
from __future__ import annotations

import re

import yaml

MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_NODES = 100_000  # values in the document once its aliases are expanded (a config has a few hundred)


def _expanded_size(node, memo: dict) -> int:
    """How many values a YAML node stands for once every alias in it is expanded (an alias is a shared node)."""
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, yaml.ScalarNode):
        n = 1
    elif isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded_size(c, memo) for c in node.value)
    else:
        n = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[id(node)] = n
    return n


def _short(key) -> str:
    """A key as an error quotes it: only one that looks like a config name (the file may be no config at all: a
    shadow line parses as a key); the error names its line."""
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,63}", key):
        return f"the key {key!r}"
    return "a key that is not a config name (not shown)"


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (the last one would win silently), and
    a document that stands for more than MAX_YAML_NODES values once its aliases are expanded is refused before
    it is built (an alias bomb of 1.5 KB made the CLI run out of memory instead of answering)."""

    def construct_document(self, node):
        n = _expanded_size(node, {})
        if n > MAX_YAML_NODES:
            raise yaml.constructor.ConstructorError(None, None, f"its aliases (*name) expand to {n} values, more than "
                                                    f"the {MAX_YAML_NODES} a config may hold; write the values out",
                                                    node.start_mark)
        return super().construct_document(node)

    def construct_yaml_int(self, node):
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > 40:  # Python refuses past 4300 digits with a traceback; no field of a config needs 40
            raise yaml.constructor.ConstructorError(None, None, f"an integer of {digits} digits; a config's integers "
                                                    "have at most 40", node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"{_short(key)} is given twice in one "
                                                        "mapping (the last one would win silently)",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)


def load_yaml(text: str):
    """Parse a config file's YAML; raises yaml.YAMLError (duplicate keys included)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass



def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error as its problem and where (line, column), never a line of the file: the path given may be a
    symlink to a file that is no config (a config pointed at /etc/shadow must not print its first line)."""
    if not isinstance(err, yaml.MarkedYAMLError):
        return type(err).__name__
    parts = []
    for what, mark in ((err.context, err.context_mark), (err.problem, err.problem_mark)):
        if what:
            parts.append(what + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""))
    return "; ".join(parts) or type(err).__name__
