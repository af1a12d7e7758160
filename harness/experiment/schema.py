"""The published JSON Schemas: an experiment file, its ``configuration.specchaos`` block,
and ``report.json``, generated from the pydantic models that validate them.

``specchaos schema`` writes them into ``schemas/`` (committed; a test keeps them equal to
what this module generates):

* ``experiment.v<N>.schema.json``: a whole experiment file (a Chaos Toolkit document): its
  ``configuration.specchaos`` is :class:`~harness.experiment.config.SpecchaosConfig`; each
  activity of :mod:`harness.experiment.actions` and :mod:`harness.experiment.probes` has its
  arguments checked (a fault action's: its family's ``Params`` plus ``duration_s`` and
  ``evidence_timeout_s``); the ``specchaos`` control must be declared. Editors validate and
  complete an experiment with it (``# yaml-language-server: $schema=...``).
* ``config.v<N>.schema.json``: the ``configuration.specchaos`` block alone.
* ``report.v<M>.schema.json``: ``report.json`` (:mod:`harness.report.schema`).
* ``sweep.v<N>.schema.json``: a sweep file of ``specchaos sweep``
  (:class:`~harness.experiment.sweep_config.SweepConfig`).

``N`` is :data:`CONFIG_SCHEMA_VERSION`, ``M`` the report's ``schema_version``. A schema
accepts less than ``specchaos validate`` checks (models on disk, free ports, the host's
capabilities, rules across fields): it is the shape, validate is the truth.
"""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, create_model
from pydantic.json_schema import models_json_schema

from faults.registry import REGISTRY
from harness.experiment import actions, probes
from harness.experiment.actions import FaultTiming
from harness.experiment.config import SpecchaosConfig
from harness.experiment.overrides import CONFIG_VAR
from harness.experiment.sweep_config import SweepConfig
from harness.experiment.validate import (ACTIVITY_KEYS, ACTIONS_MODULE, CONTROL_MODULE, EXPERIMENT_KEYS, HYPOTHESIS_KEYS,
                                        PROBES_MODULE, PROVIDER_KEYS)
from harness.report.schema import SCHEMA_VERSION as REPORT_SCHEMA_VERSION
from harness.report.schema import report_schema

__all__ = ["CONFIG_SCHEMA_VERSION", "SCHEMA_NAMES", "schema", "schema_file", "write_schemas"]

#: Version of the experiment and configuration schemas: raised when a field changes
#: meaning or goes away (a new optional field keeps it).
CONFIG_SCHEMA_VERSION = 1
DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_NAMES = ("experiment", "config", "report", "sweep")


def schema_file(name: str) -> str:
    """The published file name of schema ``name`` (``experiment.v1.schema.json``)."""
    version = REPORT_SCHEMA_VERSION if name == "report" else CONFIG_SCHEMA_VERSION
    return f"{name}.v{version}.schema.json"


def _id(name: str) -> str:
    return f"urn:specchaos:schema:{name}:v{REPORT_SCHEMA_VERSION if name == 'report' else CONFIG_SCHEMA_VERSION}"


def _fault_arguments(cls: Any) -> type[BaseModel]:
    """A fault action's arguments: its family's ``Params`` and the common timing."""
    return create_model(f"{cls.activity}_arguments", __base__=cls.Params,
                        __doc__=inspect.getdoc(cls.Params) or f"Arguments of {cls.activity}.",
                        **{n: (f.annotation, f) for n, f in FaultTiming.model_fields.items()})


def _signature_arguments(func: Callable[..., Any]) -> type[BaseModel]:
    """An activity's arguments from its signature (names, types, defaults)."""
    hints = typing.get_type_hints(func)
    fields = {p.name: (hints.get(p.name, Any), ... if p.default is inspect.Parameter.empty else p.default)
              for p in inspect.signature(func).parameters.values()}
    doc = (inspect.getdoc(func) or "").split("\n\n")[0]
    return create_model(f"{func.__name__}_arguments", __config__=ConfigDict(extra="forbid"), __doc__=doc or None,
                        **fields)


def _activity_models() -> dict[tuple[str, str], type[BaseModel]]:
    """``(module, func)`` → arguments model of every activity the harness provides."""
    out: dict[tuple[str, str], type[BaseModel]] = {}
    by_activity = {cls.activity: cls for cls in REGISTRY.values()}
    for name in actions.__all__:
        cls = by_activity.get(name)
        out[(ACTIONS_MODULE, name)] = _fault_arguments(cls) if cls else _signature_arguments(getattr(actions, name))
    for name in probes.__all__:
        out[(PROBES_MODULE, name)] = _signature_arguments(getattr(probes, name))
    return out


def _provider_is(module: str, func: str | None = None) -> dict[str, Any]:
    props: dict[str, Any] = {"module": {"const": module}}
    if func is not None:
        props["func"] = {"const": func}
    return {"properties": {"provider": {"properties": props, "required": list(props)}}, "required": ["provider"]}


def _activity(refs: dict[tuple[str, str], str]) -> dict[str, Any]:
    """A Chaos Toolkit activity; the harness's activities have their ``func`` and
    ``arguments`` checked."""
    funcs: dict[str, list[str]] = {}
    for module, func in refs:
        funcs.setdefault(module, []).append(func)
    rules: list[dict[str, Any]] = [
        {"if": _provider_is(module), "then": {"properties": {"provider": {"properties": {"func": {"enum": names}}}}}}
        for module, names in funcs.items()]
    rules += [{"if": _provider_is(module, func),
               "then": {"properties": {"provider": {"properties": {"arguments": {"$ref": ref}}}}}}
              for (module, func), ref in refs.items()]
    return {
        "type": "object",
        "description": "A Chaos Toolkit activity (action or probe).",
        "required": ["type", "name", "provider"],
        "propertyNames": {"enum": sorted(ACTIVITY_KEYS)},   # a misspelt key is ignored by Chaos Toolkit
        "properties": {
            "type": {"enum": ["action", "probe"]},
            "name": {"type": "string", "minLength": 1},
            "provider": {"type": "object", "required": ["type"],
                         "propertyNames": {"enum": sorted(set().union(*PROVIDER_KEYS.values()))}, "properties": {
                "type": {"enum": ["python", "process", "http"]},
                "module": {"type": "string"}, "func": {"type": "string"},
                "arguments": {"type": "object"}}},
            "tolerance": {},
            "background": {"type": "boolean"},
            "pauses": {"type": "object", "additionalProperties": False, "properties": {
                "before": {"type": "number", "minimum": 0}, "after": {"type": "number", "minimum": 0}}},
        },
        "allOf": rules,
    }


def _experiment_schema() -> dict[str, Any]:
    activity_models = _activity_models()
    keys = [(SpecchaosConfig, "validation"), *((m, "validation") for m in activity_models.values())]
    refs, defs = models_json_schema(keys, ref_template="#/$defs/{model}")
    arg_refs = {k: refs[(m, "validation")]["$ref"] for k, m in activity_models.items()}
    defs = dict(defs["$defs"])
    defs["activity"] = _activity(arg_refs)
    defs["activity_or_ref"] = {"if": {"type": "object", "required": ["ref"]},
                               "then": {"properties": {"ref": {"type": "string"}}},
                               "else": {"$ref": "#/$defs/activity"}}
    control = {"type": "object", "required": ["provider"],
               "properties": {"provider": {"type": "object", "required": ["module"],
                                           "properties": {"module": {"const": CONTROL_MODULE}}}}}
    return {
        "$schema": DRAFT, "$id": _id("experiment"),
        "title": "specchaos experiment",
        "description": "A Chaos Toolkit experiment run by specchaos: the specchaos control, a method that injects "
                       "a fault, and configuration.specchaos (stack, load, phases, limits). Generated from the models "
                       "that `specchaos validate` uses; validate also checks models, ports and the host.",
        "type": "object",
        "required": ["title", "description", "method", "controls", "configuration"],
        "propertyNames": {"enum": sorted(EXPERIMENT_KEYS)},
        "properties": {
            "version": {"type": "string"},
            "title": {"type": "string", "minLength": 1},
            "description": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "contributions": {"type": "object"},
            "configuration": {
                "type": "object", "required": ["specchaos"],
                "properties": {
                    "specchaos": refs[(SpecchaosConfig, "validation")],
                    CONFIG_VAR: {"description": "Overrides of configuration.specchaos under plain `chaos run --var "
                                                "specchaos_set=PATH=VALUE;...`: a string of PATH=VALUE items, a list "
                                                "of them, or a mapping of dotted paths to values.",
                                 "type": ["string", "array", "object", "null"]}}},
            "controls": {"type": "array", "contains": control,
                         "description": f"Must declare the specchaos control (module {CONTROL_MODULE})."},
            "steady-state-hypothesis": {"type": "object", "required": ["title"],
                                        "propertyNames": {"enum": sorted(HYPOTHESIS_KEYS)}, "properties": {
                "title": {"type": "string"},
                "probes": {"type": "array", "items": {"$ref": "#/$defs/activity_or_ref"}}}},
            "method": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/activity_or_ref"}},
            "rollbacks": {"type": "array", "items": {"$ref": "#/$defs/activity_or_ref"}},
        },
        "$defs": defs,
    }


def _config_schema() -> dict[str, Any]:
    s = SpecchaosConfig.model_json_schema()
    return {"$schema": DRAFT, "$id": _id("config"), **s,
            "title": "specchaos configuration (configuration.specchaos of an experiment)"}


def _sweep_schema() -> dict[str, Any]:
    return {"$schema": DRAFT, "$id": _id("sweep"), **SweepConfig.model_json_schema(),
            "title": "specchaos sweep file (specchaos sweep FILE)"}


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) ``name``: ``experiment``, ``config``, ``report`` or ``sweep``.

    Raises:
        KeyError: another name.
    """
    builders = {"experiment": _experiment_schema, "config": _config_schema,
                "report": lambda: {**report_schema(), "$id": _id("report")}, "sweep": _sweep_schema}
    return builders[name]()


def write_schemas(out_dir: str | Path) -> list[Path]:
    """Write every schema into ``out_dir`` as indented JSON (:func:`schema_file` names).

    Returns:
        The files written.
    """
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SCHEMA_NAMES:
        p = d / schema_file(name)
        p.write_text(json.dumps(schema(name), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(p)
    return written
