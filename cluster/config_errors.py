"""A config's validation error as a message a person can act on: the field's path (a check across fields names the
field it is about, or the one it checked at its default), the value given, and what is allowed (an unknown field
lists the allowed ones). The model it walks is passed in (`root`), so the league's and the wave's configs share it."""
from __future__ import annotations

import re
import typing

from pydantic import BaseModel, ValidationError


def format_error(err: ValidationError, source: str, root: type[BaseModel]) -> str:
    """A pydantic error as the config's message: one line per error naming the field (a check across fields names
    the field it is about), the value given and what is allowed."""
    lines = [f"invalid wave config ({source}):"]
    for e in err.errors():
        inner = (e.get("ctx") or {}).get("error")
        if e["type"] == "value_error" and isinstance(getattr(inner, "errors", None), list) and \
                hasattr(inner, "loc"):  # a check that names places inside its field (runner.env.<KEY>)
            lines += [_line(tuple(e['loc']) + tuple(loc), value, msg) for loc, value, msg in inner.errors]
            continue
        msg = e["msg"].removeprefix("Value error, ")
        path, value = tuple(e["loc"]), e.get("input")
        named = _path_in_message(msg, root) if e["type"] == "value_error" and not path else None
        if named is not None:  # a check across fields whose message starts with the field's path: name that
            path, value = named, _value_at(e.get("input"), named, root)
        elif e["type"] == "value_error" and isinstance(value, dict) and _holds_models(path, root):  # a check across
            # a model's fields: name the one
            # (a mapping given where a list or a scalar goes, `faults: {PK1: 1}`, is that field's own error)
            key = msg.split(":", 1)[0]
            if path == ("fault_timing",) and isinstance(value.get(key), dict):  # "PK5: ...": about fault_timing.PK5
                path, value = path + (key,), value[key]
            field = _named_field(path, msg, root)
            if field is not None:  # a field not given is checked at its default: name that
                default = getattr(_model_at(path, root).model_fields.get(field), "default", None)
                path, value = path + (field,), value.get(field, default)
        if e["type"] == "extra_forbidden":
            allowed = _allowed_fields(e["loc"], root)
            msg = f"unknown field; allowed fields here: {', '.join(allowed)}"
            if not is_config_name(path[-1]):  # a line of a file that is no config (a shadow line parses as a key)
                lines.append(f"  {_loc(path[:-1]) + ': ' if path[:-1] else ''}a key that is not a config name (not "
                             f"shown): {msg}")
                continue
            lines.append(f"  field `{_loc(path)}`: value {shown(value, path, unknown=True)}: {msg}")
            continue
        if e["type"] == "missing":  # its input is the parent mapping (a whole file that is no config): never shown
            lines.append(f"  field `{_loc(path)}`: value (not given): {_bounded(msg)}")
            continue
        lines.append(_line(path, value, msg))
    return "\n".join(lines)


def _line(path: tuple, value, msg: str) -> str:
    return f"  field `{_loc(path)}`: value {shown(value, path)}: {_bounded(msg)}"


# a quoted literal opens after a non-word (never a closing quote's tail to the next opening: `'a': ... 'b'`)
_LONG_QUOTE = re.compile(r"(?<![\w'\"])'[^'\n]{80,}'(?!\w)|(?<![\w'\"])\"[^\"\n]{80,}\"(?!\w)")


def _bounded(msg: str) -> str:
    """A check's message with URL passwords masked and each long quoted value cut to its start (a check quotes the
    value it refused: `unknown fault id 'ZZZ...'`), at most 1000 characters."""
    msg = _LONG_QUOTE.sub(lambda m: f"{m.group(0)[:60]}... ({len(m.group(0)) - 2} characters)", mask_urls(msg))
    return msg if len(msg) <= 1000 else msg[:1000] + "..."


SHOWN = 200  # characters of a value's repr an error quotes: enough to name it, never a file's contents
CONFIG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
SECRET_WORDS = ("secret", "password", "passwd", "token", "credential", "private")
_FLAT = re.compile(r"[A-Za-z0-9_+.-]{1,32}")  # a string a small list may show (a fault id, a name)
_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^/@\s:]*:)[^@/\s]*@")


def is_config_name(key) -> bool:
    """Does `key` look like a config field's name? (Only such a key is quoted in an error: a key that is not may
    be a line of a file the path reached that is no config at all.)"""
    return isinstance(key, str) and CONFIG_NAME.fullmatch(key) is not None


def is_secret_name(key) -> bool:
    """Is `key` a field whose value is a secret (store.secret_key, an unknown `password`): never shown."""
    k = str(key).lower()
    return k in ("access_key", "secret_key") or any(w in k for w in SECRET_WORDS)


def mask_urls(text: str) -> str:
    """`text` with every URL's password masked (`http://u:***@host`)."""
    return _USERINFO.sub(r"\1***@", text)


def _size(value) -> str:
    if isinstance(value, dict):
        return f"a mapping of {len(value)} key{'s' * (len(value) != 1)}"
    if isinstance(value, (list, tuple, set)):
        return f"a list of {len(value)} item{'s' * (len(value) != 1)}"
    if isinstance(value, (str, bytes)):
        return f"a {type(value).__name__} of {len(value)} characters"
    return f"a {type(value).__name__}"


def _flat(value) -> bool:
    """A small list or mapping of numbers (and of short names, in a list) that is safe to quote: `[1, 2]`, `['PK3']`,
    `{'PK1': 1}`; never a file's contents."""
    def num(x):
        return x is None or isinstance(x, (bool, int, float))
    if isinstance(value, dict):
        return len(value) <= 8 and all(is_config_name(k) and not is_secret_name(k) and num(v)
                                       for k, v in value.items())
    return isinstance(value, (list, tuple)) and len(value) <= 8 and \
        all(num(x) or (isinstance(x, str) and _FLAT.fullmatch(x)) for x in value)


def shown(value, path: tuple = (), unknown: bool = False) -> str:
    """A value as an error quotes it: its repr cut to SHOWN characters, URL passwords masked. A secret's (any part
    of `path` secret-named), a whole mapping's or list's (past a few numbers or names), and an unknown field's
    string that is no name, are described by type and size only."""
    if any(is_secret_name(p) for p in path if isinstance(p, str)):
        return f"({_size(value)}, not shown)"
    if isinstance(value, (dict, list, tuple, set)) and not _flat(value):
        return f"({_size(value)}, not shown)"
    if unknown and isinstance(value, str) and not _FLAT.fullmatch(value):
        return f"({_size(value)}, not shown)"
    text = mask_urls(repr(value))
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


def _loc(path: tuple) -> str:
    """A field's path for the message: a part that is not a plain name is not shown (it may be a line of a file that
    is no config), except a runner.env variable's name, quoted so what it holds is seen and never printed raw."""
    def part(i: int, p) -> str:
        if isinstance(p, int) or re.fullmatch(r"[A-Za-z0-9_-]+", str(p)):
            return str(p)
        if i and path[i - 1] == "env" and len(repr(p)) <= 40:  # a variable's name is the user's to choose
            return repr(p)
        return "(a key that is not a config name, not shown)"  # a line of a file that is no config, perhaps

    return ".".join(part(i, p) for i, p in enumerate(path)) or "(top level)"


def _path_in_message(msg: str, root: type[BaseModel]) -> tuple | None:
    """The field path a check's message starts with (`fault_timing.PK1.after_disk_writes: ...`, `sandbox.disk 'torn'
    ...`), when its first part is a wave config field; None otherwise."""
    m = re.match(r"([a-z_]+(?:\.[A-Za-z0-9_]+)+)(?=[ :])", msg)
    if m is None or m.group(1).split(".")[0] not in root.model_fields:
        return None
    return tuple(m.group(1).split("."))


def _value_at(data, path: tuple, root: type[BaseModel]):
    """The value given at `path` in the raw config, else the field's default (a field not given is checked at it)."""
    for i, part in enumerate(path):
        if not isinstance(data, dict) or part not in data:
            last = i == len(path) - 1
            default = getattr(_model_at(path[:i], root).model_fields.get(path[i]), "default", None) if last else None
            return default if not callable(default) else None
        data = data[part]
    return data


def _model_at(loc: tuple, root: type[BaseModel]) -> type[BaseModel]:
    """The config model at `loc` (a mapping's key, as in fault_timing.PK1, is stepped over)."""
    model: type[BaseModel] = root
    parts = list(loc)
    while parts:
        field = model.model_fields.get(str(parts.pop(0)))
        ann = getattr(field, "annotation", None) if field else None
        args = typing.get_args(ann) if typing.get_origin(ann) is dict else ()
        if args and isinstance(args[-1], type) and issubclass(args[-1], BaseModel):
            ann = args[-1]
            if parts:
                parts.pop(0)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            break
        model = ann
    return model


def _holds_models(path: tuple, root: type[BaseModel]) -> bool:
    """Is the field at `path` a model (or a mapping of them), whose fields a check's message can name?"""
    if not path:
        return True
    field = _model_at(path[:-1], root).model_fields.get(str(path[-1]))
    if field is None:  # a mapping's key (fault_timing.PK1): the model it holds
        return True

    def has_model(a) -> bool:
        return (isinstance(a, type) and issubclass(a, BaseModel)) or any(has_model(x) for x in typing.get_args(a))

    return has_model(field.annotation)


def _allowed_fields(loc: tuple, root: type[BaseModel]) -> list[str]:
    return sorted(_model_at(tuple(loc)[:-1], root).model_fields)


def _named_field(loc: tuple, msg: str, root: type[BaseModel]) -> str | None:
    """The first field of the model at `loc` that a cross-field check's message names (`nodes 3 ...`,
    `sandbox.image ...`, `give one boundary per fault, not after_model_calls and ...`)."""
    fields = _model_at(loc, root).model_fields
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", msg):
        name = word.rsplit(".", 1)[-1]
        if name in fields:
            return name
    return None
