"""Overrides of ``configuration.specchaos`` from outside the experiment file.

An override sets one dotted path of the ``specchaos`` block (``load.users``,
``phases.baseline_s``, ``stack.extra_args``, ``safeguards.0.limit``) to a value. The
sources, applied in this order (a later one wins on the same path):

1. the experiment file itself;
2. ``--var-file FILE`` (each in the order given): a YAML or JSON mapping of dotted paths
   to values;
3. environment variables ``SPECCHAOS_SET_<PATH>``: the path upper-cased, each dot written
   ``__`` (``SPECCHAOS_SET_LOAD__USERS=8``, ``SPECCHAOS_SET_STACK__MODELS_DIR=/models``),
   applied shortest path first;
4. ``configuration.specchaos_set`` of the experiment, as Chaos Toolkit resolved it (so
   ``chaos run --var 'specchaos_set=load.users=8;phases.baseline_s=60'`` reaches the
   block): ``PATH=VALUE`` items separated by ``;`` or new lines, a list of them, or a
   mapping of paths to values;
5. ``--set PATH=VALUE`` (each in the order given).

Values are YAML: ``8`` is a number, ``true`` a boolean, ``null`` unsets a field to its
default, ``[a, b]`` a list, ``'8'`` a string; a value that is not valid YAML is taken as the
plain string. A mapping value sets each of its leaves (``stack={target: t, draft: d}`` is
``stack.target=t`` plus ``stack.draft=d``); a list replaces the whole list.

Every path is checked against the pydantic models of the block
(:class:`harness.experiment.config.SpecchaosConfig`) before it is applied: an unknown
field is an :class:`~harness.errors.ExperimentError` naming the override and the fields
known there. The block with the overrides applied is then validated like the file
(:func:`harness.experiment.config.parse_config`), an invalid value named by its override.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml
from pydantic import BaseModel

from harness.errors import ExperimentError

__all__ = ["Override", "VAR_FILE", "ENV", "CONFIG", "SET", "ENV_PREFIX", "CONFIG_VAR", "parse_set", "read_var_file", "env_overrides", "config_var_overrides",
           "collect_overrides", "apply_overrides", "override_at"]

#: Prefix of the environment variables that override a path (``SPECCHAOS_SET_LOAD__USERS``).
ENV_PREFIX = "SPECCHAOS_SET_"
#: The Chaos Toolkit configuration key that carries overrides (``chaos run --var specchaos_set=...``).
CONFIG_VAR = "specchaos_set"


#: Precedence of each source (applied lowest first; the file itself is below them all).
VAR_FILE, ENV, CONFIG, SET = 1, 2, 3, 4


@dataclass(frozen=True)
class Override:
    """One override: ``path`` (dotted, relative to ``configuration.specchaos``), its
    ``value`` (parsed), ``source``, how the user wrote it (named in errors), and ``rank``,
    its source's precedence (:data:`VAR_FILE` < :data:`ENV` < :data:`CONFIG` < :data:`SET`)."""

    path: str
    value: Any
    source: str
    rank: int = SET

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "value": self.value, "source": self.source}


def _yaml_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _leaves(path: str, value: Any, source: str, rank: int) -> list[Override]:
    """A mapping value as one override per leaf (an empty mapping is a leaf)."""
    if isinstance(value, Mapping) and value:
        out: list[Override] = []
        for k, v in value.items():
            out += _leaves(f"{path}.{k}" if path else str(k), v, source, rank)
        return out
    return [Override(path, value, source, rank)]


def parse_set(text: str, source: str = "--set", rank: int = SET) -> list[Override]:
    """``PATH=VALUE`` as overrides (one, or one per leaf of a mapping value).

    Raises:
        ExperimentError: no ``=``, or an empty path.
    """
    label = f"{source} {text}"
    path, eq, value = text.partition("=")
    path = path.strip()
    if not eq or not path:
        raise ExperimentError("an override is PATH=VALUE (e.g. load.users=8)", where=label)
    return _leaves(path, _yaml_value(value.strip()), label, rank)


def read_var_file(path: str | Path) -> list[Override]:
    """The overrides of a var file: a YAML or JSON mapping of dotted paths to values
    (nested mappings are read as dotted paths), in file order.

    Raises:
        ExperimentError: missing or unreadable file, invalid YAML/JSON, not a mapping.
    """
    p = Path(path)
    where = f"--var-file {p}"
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ExperimentError(f"cannot read the var file: {getattr(exc, 'strerror', None) or exc}", where=where) from None
    try:
        doc = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark else where
        raise ExperimentError(f"not valid {'JSON' if p.suffix == '.json' else 'YAML'}: "
                              f"{getattr(exc, 'problem', None) or exc}", where=at) from None
    if doc is None:
        return []
    if not isinstance(doc, dict):
        raise ExperimentError("a var file is a mapping of dotted paths to values (e.g. load.users: 8)", where=where)
    out: list[Override] = []
    for k, v in doc.items():
        out += _leaves(str(k), v, f"{p}: {k}", VAR_FILE)
    return out


def env_overrides(environ: Mapping[str, str] | None = None) -> list[Override]:
    """The ``SPECCHAOS_SET_<PATH>`` variables of ``environ`` (default ``os.environ``) as
    overrides, shortest path first (then by name), so ``SPECCHAOS_SET_STACK__TARGET`` wins
    over a ``target`` inside ``SPECCHAOS_SET_STACK``."""
    env = os.environ if environ is None else environ
    out: list[Override] = []
    for name in sorted(env, key=lambda n: (n.count("__"), n)):
        if not name.startswith(ENV_PREFIX) or len(name) == len(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX):].lower().replace("__", ".")
        out += _leaves(path, _yaml_value(env[name]), f"${name}={env[name]}", ENV)
    return out


def config_var_overrides(value: Any, where: str = f"configuration.{CONFIG_VAR}") -> list[Override]:
    """The overrides of ``configuration.specchaos_set``: ``None``/empty for none, a string of
    ``PATH=VALUE`` items separated by ``;`` or new lines, a list of such strings, or a
    mapping of paths to values.

    Raises:
        ExperimentError: another type, or an item without ``=``.
    """
    if value is None or value == "":
        return []
    if isinstance(value, Mapping):
        out: list[Override] = []
        for k, v in value.items():
            out += _leaves(str(k), v, f"{where}: {k}", CONFIG)
        return out
    if isinstance(value, str):
        items = [s for s in value.replace("\n", ";").split(";") if s.strip()]
    elif isinstance(value, list) and all(isinstance(s, str) for s in value):
        items = value
    else:
        raise ExperimentError("must be 'PATH=VALUE;PATH=VALUE', a list of PATH=VALUE or a mapping of paths to values",
                              where=where)
    return [ov for item in items for ov in parse_set(item.strip(), source=where, rank=CONFIG)]


def collect_overrides(sets: Iterable[str] = (), var_files: Iterable[str | Path] = (),
                      environ: Mapping[str, str] | None = None) -> list[Override]:
    """Every override of the command line and the environment, lowest precedence first:
    the var files, then ``SPECCHAOS_SET_*`` of ``environ`` (default ``os.environ``), then
    ``sets`` (``--set PATH=VALUE``). ``configuration.specchaos_set`` ranks between the
    environment and ``--set`` (:func:`apply_overrides` orders by rank).

    Raises:
        ExperimentError: a var file or a ``--set`` that cannot be read.
    """
    out: list[Override] = []
    for f in var_files:
        out += read_var_file(f)
    out += env_overrides(environ)
    for s in sets:
        out += parse_set(s)
    return out


# ---------------------------------------------------------------------- paths against the models
def _members(tp: Any) -> list[Any]:
    """The alternatives of a type: ``X | None`` → [X, NoneType]; Annotated unwrapped."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _members(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(tp) for m in _members(a)]
    return [tp]


def _describe(tp: Any) -> str:
    names = [getattr(m, "__name__", str(m)) for m in _members(tp) if m is not type(None)]
    return " | ".join(names) or "null"


def _fields(tp: Any) -> dict[str, Any]:
    """Field name → annotation of the pydantic models among the alternatives of ``tp``."""
    return {name: f.annotation for m in _members(tp) if inspect.isclass(m) and issubclass(m, BaseModel)
            for name, f in m.model_fields.items()}


def unknown_field_hint(name: str, fields: Iterable[str]) -> str:
    """``did you mean X? known: a, b, ...`` for a field ``name`` that is none of ``fields``."""
    fields = list(fields)
    near = difflib.get_close_matches(name, fields, n=1)
    return (f"did you mean {near[0]}? " if near else "") + f"known: {', '.join(fields)}"


def _step(tp: Any, part: str, at: str, where: str) -> Any:
    """The type at ``part`` inside a value of type ``tp`` (``at`` is its dotted location,
    ``where`` what an error names).

    Raises:
        ExperimentError: ``tp`` has no such field, index or key.
    """
    members = _members(tp)
    if any(m is Any for m in members):
        return Any
    fields = _fields(tp)
    if fields:
        if part in fields:
            return fields[part]
        raise ExperimentError(f"unknown field {part!r} in {at}", where=where, hint=unknown_field_hint(part, fields))
    for m in members:
        origin = typing.get_origin(m)
        if origin in (dict, Mapping):
            return typing.get_args(m)[1] if typing.get_args(m) else Any
        if origin is list:
            if not part.isdigit():
                raise ExperimentError(f"{at} is a list: the next part of the path is an index (0, 1, ...), "
                                      f"not {part!r}", where=where)
            return typing.get_args(m)[0] if typing.get_args(m) else Any
    raise ExperimentError(f"{at} is a single value ({_describe(tp)}); it has no field {part!r}", where=where)


def known_fields(model: type[BaseModel], parts: Sequence[str]) -> list[str]:
    """The field names of the model found at ``parts`` (a path of field names, list indices
    and dict keys) inside ``model``, walked as overrides are (:func:`_step`); [] when that
    place is no model or the path leads nowhere. For the "did you mean" of an unknown field
    in a file."""
    tp: Any = model
    for part in parts:
        try:
            tp = _step(tp, part, "", "")
        except ExperimentError:
            return []
    return list(_fields(tp))


def _check_path(ov: Override, model: type[BaseModel], root: str) -> list[str]:
    parts = ov.path.split(".")
    if any(not p for p in parts):
        raise ExperimentError(f"not a dotted path: {ov.path!r}", where=ov.source)
    tp: Any = model
    at = root
    for part in parts:
        if tp is Any:
            break
        tp = _step(tp, part, at, ov.source)
        at = f"{at}.{part}"
    return parts


def _set(block: dict[str, Any], parts: list[str], value: Any, ov: Override, root: str) -> None:
    cur: Any = block
    at = root
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(cur, list):
            idx = int(part)
            if idx >= len(cur):
                raise ExperimentError(f"{at} has {len(cur)} item(s): there is no item {idx}", where=ov.source)
            if last:
                cur[idx] = value
            else:
                if cur[idx] is None:
                    cur[idx] = {}
                cur = cur[idx]
        elif isinstance(cur, dict):
            if last:
                cur[part] = value
            else:
                if cur.get(part) is None:
                    nxt_is_index = parts[i + 1].isdigit()
                    if nxt_is_index:
                        raise ExperimentError(f"{at}.{part} is not set in the experiment: there is no item "
                                              f"{parts[i + 1]} to change", where=ov.source,
                                              hint=f"set the whole list, e.g. {'.'.join(parts[:i + 1])}=[...]")
                    cur[part] = {}
                cur = cur[part]
        else:
            raise ExperimentError(f"{at} is {cur!r} in the experiment, not a block", where=ov.source)
        at = f"{at}.{part}"


def apply_overrides(block: Mapping[str, Any] | None, overrides: Iterable[Override], model: type[BaseModel],
                    root: str = "configuration.specchaos") -> dict[str, Any]:
    """A deep copy of the raw ``block`` with ``overrides`` applied by rank, then in the
    order given, each path checked against ``model`` first (values are validated
    afterwards, with the block).

    Args:
        block: the ``specchaos`` block as written (``None``: empty).
        overrides: lowest precedence first.
        model: the pydantic model the block validates with.
        root: the block's location, for messages.

    Raises:
        ExperimentError: an unknown field, an index into a list that has no such item, a
            path through a value that is not a block; named by the override's source.
    """
    out = copy.deepcopy(dict(block or {}))
    for ov in sorted(overrides, key=lambda o: o.rank):
        parts = _check_path(ov, model, root)
        _set(out, parts, ov.value, ov, root)
    return out


def override_at(loc: str, overrides: Iterable[Override]) -> Override | None:
    """The override that set ``loc`` (a dotted location inside the block), or one of its
    parents: the last applied; None when no override covers it."""
    found = None
    for ov in sorted(overrides, key=lambda o: o.rank):
        if loc == ov.path or loc.startswith(ov.path + "."):
            found = ov
    return found
