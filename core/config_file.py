"""The config file (``GOVERNOR_CONFIG=governor.yaml``): read, checked, explained.

The file is YAML and holds :class:`core.settings.Settings` fields by the
names of the shipped JSON Schema (``docs/settings.schema.json``, from
:func:`core.settings.json_schema`): the environment, the file and the docs
share that one schema.  Reading is hostile-input safe:

1. at most :data:`MAX_BYTES`, UTF-8, parsed with PyYAML's safe loader; a
   duplicate key, a key that is not a string and anchors/aliases (``&a`` /
   ``*a``: their expansion is unbounded) are refused; the top level must be
   a mapping;
2. sections group fields: a key that is a field name takes its value as is
   (``pid_gains: {ki: 0.05}``); a top-level key that names a component's
   section (:data:`core.settings.SECTIONS`, the README table's first column)
   holds that section's fields by their names (``loop: {window_s: 5}``); any
   other key must hold a mapping whose keys join it with ``_`` to field names
   (``scrape: {interval_s: 5}`` sets ``scrape_interval_s``), at any depth.  An
   unknown key is an error, with a "did you mean" when a field name is close;
3. the fields are checked against the JSON Schema (``jsonschema``), then
   turned into values by each field's codec and checked again by the
   dataclasses themselves (cross-field rules such as zone_redundancy below
   the number of zones).

Every error is a :class:`core.settings.SettingsError` whose message names the
file and the path of the value in it, in plain words, e.g.
``governor.yaml: models[1].ttft_slo_ms: must be > 0 (got -5)``.  Secret
values are never shown.

>>> import tempfile, os
>>> with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
...     _ = fh.write("zones: [eu-1, eu-2]\\nscrape:\\n  interval_s: 2\\n")
>>> cfg = ConfigFile.read(fh.name)
>>> cfg.values["zones"], cfg.values["scrape_interval_s"], cfg.paths["scrape_interval_s"]
(('eu-1', 'eu-2'), 2.0, 'scrape.interval_s')
>>> os.unlink(fh.name)
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import yaml

from core.settings import CODECS, REQUEST_CLASSES, SECTIONS, Settings, SettingsError, json_schema

__all__ = ["MAX_BYTES", "ConfigFile"]

#: The largest config file read (a config is a few kB; more is a mistake or an attack).
MAX_BYTES = 1 << 20

_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
_SECRET = frozenset(name for name, f in _FIELDS.items() if f.metadata["kind"] == "secret")
# Every prefix of a field name that ends at a "_": the sections a file may group fields in.
_SECTIONS = frozenset(name[:i] for name in _FIELDS for i, ch in enumerate(name) if ch == "_")
_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # (PyYAML has no type stubs here)
    """PyYAML's safe loader that refuses duplicate keys, non-string keys and aliases."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "anchors and aliases (*name) are not supported", mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[str] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                why = f"keys must be strings (got {key!r}; quote it)"
                raise yaml.constructor.ConstructorError(None, None, why, key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


@dataclass(frozen=True)
class ConfigFile:
    """A read and checked config file: field -> value, and field -> its path in the file."""

    path: str
    values: dict[str, Any]
    paths: dict[str, str]

    @classmethod
    def read(cls, path: str) -> ConfigFile:
        """Read and check ``path``; raises :class:`SettingsError` naming the file and the value's path."""
        doc = _parse(path, _read(path))
        flat, paths = _flatten(path, doc)
        _check_schema(path, flat, paths)
        values: dict[str, Any] = {}
        for name, raw in flat.items():
            kind = _FIELDS[name].metadata["kind"]
            try:
                values[name] = _load_models(path, paths[name], raw) if kind == "models" else CODECS[kind].load(raw)
            except (TypeError, ValueError) as exc:
                if isinstance(exc, SettingsError) and str(exc).startswith(f"{path}: "):
                    raise
                raise _error(path, paths[name], str(exc)) from None
        return cls(path, values, paths)

    def explain(self, exc: SettingsError, sources: Mapping[str, str]) -> SettingsError:
        """``exc`` (raised building the settings) in the file's words when the file set the value.

        A field error names the value's path in the file; any other message has
        the environment variables of the file's fields replaced by their paths.
        """
        if exc.field in self.paths and sources.get(exc.field) == "file" and exc.reason is not None:
            shown = "" if exc.field in _SECRET else _got(self.values[exc.field], exc.field)
            return _error(self.path, self.paths[exc.field], f"{exc.reason}{shown}")
        text = str(exc)
        for name, where in self.paths.items():
            if sources.get(name) == "file":
                text = re.sub(rf"\b{re.escape(_FIELDS[name].metadata['env'])}\b", where, text)
        return SettingsError(f"{self.path}: {text}" if text != str(exc) else text)


def _error(path: str, where: str, reason: str) -> SettingsError:
    return SettingsError(f"{path}: {where}: {reason}" if where else f"{path}: {reason}")


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size > MAX_BYTES:
                raise _error(path, "", f"the file is larger than {MAX_BYTES // 1024} KiB")
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise _error(path, "", f"cannot read the file: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise _error(path, "", f"the file is larger than {MAX_BYTES // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error(path, "", f"not UTF-8 text (byte {exc.start})") from None


def _parse(path: str, text: str) -> dict[str, Any]:
    try:
        doc = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise _error(path, where, f"not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise _error(path, "", f"not valid YAML: {exc}") from None
    except RecursionError:
        raise _error(path, "", "nested too deeply") from None
    if not isinstance(doc, dict):
        what = "empty" if doc is None else _TYPE_WORDS.get(_json_type(doc), f"a {type(doc).__name__}")
        raise _error(path, "", f"the top level must be a mapping of settings (the file is {what})")
    return doc


def _flatten(path: str, doc: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Field -> raw value and field -> path in the file, in file order (see the module docstring)."""
    flat: dict[str, Any] = {}
    paths: dict[str, str] = {}

    def walk(section: Mapping[str, Any], prefix: str, where: str) -> None:
        for key, value in section.items():
            name, here = prefix + key, f"{where}.{key}" if where else key
            if name in _FIELDS:
                if name in flat:
                    raise _error(path, here, f"sets {name} again (already set at {paths[name]})")
                flat[name], paths[name] = value, here
            elif not prefix and key in SECTIONS and isinstance(value, dict):
                own = {k: v for k, v in value.items() if k in SECTIONS[key]}
                walk(own, "", here)  # a component's section: its fields by their own names
                rest = {k: v for k, v in value.items() if k not in own}
                if rest and key not in _SECTIONS:
                    k = next(iter(rest))
                    raise _error(path, f"{here}.{k}", f"unknown key{_did_you_mean(k, '')} (section {key})")
                walk(rest, key + "_", here)
            elif name in _SECTIONS and isinstance(value, dict):
                walk(value, name + "_", here)
            elif name in _SECTIONS and not _did_you_mean(key, prefix, fields_only=True):
                fields = sorted(n[len(name) + 1 :] for n in _FIELDS if n.startswith(name + "_"))
                raise _error(path, here, f"is a section: give a mapping of {', '.join(fields[:6])}{_more(fields)}")
            else:
                raise _error(path, here, f"unknown key{_did_you_mean(key, prefix)}")

    walk(doc, "", "")
    return flat, paths


def _more(items: list[str]) -> str:
    return ", ..." if len(items) > 6 else ""


def _did_you_mean(key: str, prefix: str, *, fields_only: bool = False) -> str:
    """`` (did you mean 'x'?)`` for the closest field (or section) name under ``prefix``, else ``''``."""
    names = {n[len(prefix) :] for n in [*_FIELDS, *([] if fields_only else _SECTIONS)] if n.startswith(prefix)}
    close = difflib.get_close_matches(key, sorted(names - {key}), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


@functools.cache
def _validator() -> Any:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _check_schema(path: str, flat: dict[str, Any], paths: dict[str, str]) -> None:
    order = {name: i for i, name in enumerate(flat)}

    def rank(err: Any) -> tuple[Any, ...]:
        where = list(err.absolute_path)
        return (
            order.get(where[0], -1) if where else -1,
            [(0, p, "") if isinstance(p, int) else (1, 0, p) for p in where],
        )

    errors = sorted(_validator().iter_errors(flat), key=rank)
    if errors:
        err = errors[0]
        where = list(err.absolute_path)
        field = str(where[0]) if where else ""
        text = paths.get(field, field) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where[1:])
        extra, reason = _words(err, secret=field in _SECRET)
        raise _error(path, text + extra, reason)


def _words(err: Any, *, secret: bool) -> tuple[str, str]:
    """(path suffix, plain words) of one JSON Schema error."""
    kind, want, value = err.validator, err.validator_value, err.instance
    got = "" if secret else _got(value)
    if kind == "type":
        types = [want] if isinstance(want, str) else list(want)
        return "", f"must be {' or '.join(_TYPE_WORDS.get(t, t) for t in types)}{got}"
    bounds = {"exclusiveMinimum": ">", "minimum": ">=", "exclusiveMaximum": "<", "maximum": "<="}
    if kind in bounds:
        return "", f"must be {bounds[kind]} {want}{got}"
    if kind == "enum" and "propertyNames" in err.schema_path:
        return f".{value}", f"unknown request class (choose from {', '.join(REQUEST_CLASSES)})"
    if kind == "enum":
        return "", f"choose one of {', '.join(map(str, want))}{got}"
    if kind == "minItems":
        return "", f"must have at least {want} item{'s' if want != 1 else ''}{got}"
    if kind == "maxItems":
        return "", f"must have at most {want} item{'s' if want != 1 else ''}{got}"
    if kind == "minLength":
        return "", "must not be empty"
    if kind == "required":
        missing = [k for k in want if k not in value]
        return "", f"missing the key {missing[0]!r}"
    if kind == "additionalProperties":
        known = sorted(err.schema.get("properties", {}))
        extra = sorted(k for k in value if k not in known)
        close = difflib.get_close_matches(extra[0], known, n=1, cutoff=0.7)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
        return f".{extra[0]}", f"unknown key{hint}"
    return "", str(err.message)


def _load_models(path: str, where: str, items: list[dict[str, Any]]) -> tuple[Any, ...]:
    """The models of a file, each error naming its index (the schema has checked the shapes)."""
    out = []
    for i, item in enumerate(items):
        try:
            out.extend(CODECS["models"].load([item]))
        except (TypeError, ValueError) as exc:
            raise _error(path, f"{where}[{i}]", re.sub(r"^model [^:]*: ", "", str(exc))) from None
    return tuple(out)


def _got(value: Any, field: str | None = None) -> str:
    """`` (got V)``: a short rendering of a value for an error (nothing for a whole list of models)."""
    if field is not None and _FIELDS[field].metadata["kind"] in ("models", "gains", "pairs"):
        return ""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = repr(value)
    elif isinstance(value, int | float) or value is None:
        text = repr(value)
    else:
        try:
            text = json.dumps(list(value) if isinstance(value, tuple) else value, default=str)
        except (TypeError, ValueError):
            text = f"<{type(value).__name__}>"
    return f" (got {text if len(text) <= 80 else text[:77] + '...'})"


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else type(value).__name__
