"""Parse and validate an experiment file: the one validation path.

``specchaos validate`` and ``specchaos run`` (before anything starts) call
:func:`load_experiment`, and the ``specchaos`` control under plain ``chaos run`` calls
:func:`check_experiment` on the document Chaos Toolkit loaded, so bad input never
half-applies a fault and the three can never disagree. In order: the file parses
(YAML/JSON, with line numbers); every fault action names a known family with valid
arguments and an existing server; Chaos Toolkit's own validation passes (activities
resolve, arguments bind to their functions' signatures); the ``specchaos`` control is
declared; ``configuration.specchaos``, with the overrides applied
(:mod:`harness.experiment.overrides`: ``--set``, ``--var-file``, ``SPECCHAOS_SET_*``,
``configuration.specchaos_set``), validates (each layer's block, plus the cross-block
rules); an experiment with ``gpu.require`` runs on a host with an NVIDIA GPU; the host can
do what each fault asks
(:meth:`faults.base.Fault.check_host`: e.g. a writable cgroup, an NVIDIA GPU), after the
launcher's servers were found to offer what each fault needs (:func:`check_capabilities`);
the method injects a fault; and the launcher's pre-flight (``preflight`` of its stack class:
for local processes :func:`harness.stack.preflight.check_stack`, models and configured
ports) passes.
"""

from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import yaml
from chaoslib.configuration import load_configuration
from chaoslib.exceptions import ChaosException
from chaoslib.experiment import ensure_experiment_is_valid
from pydantic import ValidationError

from faults.base import Fault
from faults.registry import by_activity, fault_class, make_fault
from harness import gpu
from harness.errors import ExperimentError, SourceError, SpecchaosError, first_error
from harness.experiment import actions
from harness.experiment.actions import FaultTiming
from harness.experiment.config import SpecchaosConfig, parse_config
from harness.experiment.overrides import (CONFIG_VAR, Override, apply_overrides, config_var_overrides,
                                         unknown_field_hint)
from harness.metrics.phases import PHASES
from harness.load.client import SOURCE_CLASS
from harness.load.source_prep import prepare_source
from harness.load.sources import RequestSpec
from harness.checks.required import Requirement, required_checks, unknown_requirements
from harness.report.judge import fault_requirements
from harness.stack.capabilities import capabilities_of, missing, refusal
from harness.stack.launchers import launcher_class, launcher_names
from harness.stack.preflight import resolve_models

__all__ = ["CONTROL_MODULE", "ACTIONS_MODULE", "Experiment", "parse_file", "fault_activities", "load_experiment",
           "check_experiment", "run_meta"]

CONTROL_MODULE = "harness.experiment.control"
ACTIONS_MODULE = "harness.experiment.actions"
PROBES_MODULE = "harness.experiment.probes"
#: The generic fault action (an alias of the typed ones, which the registry names).
GENERIC_FAULT_ACTION = "inject_fault"


def _check_timing(args: dict[str, Any], at: str) -> None:
    try:
        FaultTiming.model_validate(args)
    except ValidationError as exc:
        loc, msg, _ = first_error(exc)
        raise ExperimentError(msg, where=f"{at}.{loc}") from None


@dataclass
class Experiment:
    """A validated experiment: the Chaos Toolkit document and its specchaos config."""

    path: Path
    doc: dict[str, Any]
    cfg: SpecchaosConfig
    #: The faults the experiment declares (validated), in document order.
    faults: list[Fault] = field(default_factory=list)
    #: Seconds the method's fault actions hold their faults and its pauses wait, at most
    #: (``duration_s`` + ``pauses`` summed): the load must outlast them.
    method_hold_s: float = 0.0
    #: The overrides applied to ``configuration.specchaos`` (lowest precedence first).
    overrides: list[Override] = field(default_factory=list)
    #: ``load.source``'s requests, read, measured and bucketed
    #: (:func:`harness.load.source_prep.prepare_source`); None without a source.
    requests: list[RequestSpec] | None = None

    @property
    def title(self) -> str:
        return str(self.doc.get("title", self.path.stem))

    @property
    def required(self) -> list[Requirement]:
        """What a run of the experiment will require to be judged (:mod:`harness.checks.required`):
        ``judge.required``, else the defaults of the faults it declares."""
        return required_checks([f.kind for f in self.faults], self.cfg.judge, soak=self.cfg.soak.enabled,
                               reference=self.cfg.stack.reference, overrides=fault_requirements())


def parse_file(path: Path) -> dict[str, Any]:
    """Parse an experiment file (YAML or JSON).

    Raises:
        ExperimentError: missing file, syntax error (with line and column), not a mapping.
    """
    if path.is_dir():
        raise ExperimentError("is a directory, not an experiment file", where=str(path),
                              hint="give the path of a Chaos Toolkit experiment, e.g. experiments/kill-draft-worker.yaml")
    if not path.is_file():
        raise ExperimentError("no such experiment file", where=str(path),
                              hint="give the path of a Chaos Toolkit experiment, e.g. experiments/kill-draft-worker.yaml")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ExperimentError(f"cannot read the experiment file: {exc}", where=str(path)) from None
    try:
        if path.suffix == ".json":
            doc = json.loads(text)
        else:
            doc = yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ExperimentError(f"invalid JSON: {exc.msg}", where=f"{path}:{exc.lineno}:{exc.colno}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ExperimentError(f"invalid YAML: {problem}", where=where) from None
    if not isinstance(doc, dict):
        raise ExperimentError("an experiment must be a mapping (title, description, method...)", where=str(path))
    return doc


def _activities(doc: dict[str, Any]) -> Iterator[tuple[str, dict]]:
    """Yield (location, activity) for every activity of the experiment."""
    ssh = doc.get("steady-state-hypothesis") or {}
    for i, a in enumerate(ssh.get("probes") or []):
        yield f"steady-state-hypothesis.probes[{i}]", a
    for i, a in enumerate(doc.get("method") or []):
        yield f"method[{i}]", a
    for i, a in enumerate(doc.get("rollbacks") or []):
        yield f"rollbacks[{i}]", a


#: The keys Chaos Toolkit reads at each level of an experiment (its experiment format: the
#: document, the steady-state hypothesis, an activity, a provider by type, a control). Chaos
#: Toolkit ignores any other key, so a misspelt one (``argument:``, ``rollback:``) silently
#: drops what it held: :func:`check_keys` refuses it instead.
EXPERIMENT_KEYS = frozenset({"version", "title", "description", "tags", "contributions", "configuration", "secrets",
                             "extensions", "controls", "steady-state-hypothesis", "method", "rollbacks", "runtime",
                             "dry"})   # dry: chaos run --dry adds it to the document it hands the control
HYPOTHESIS_KEYS = frozenset({"title", "probes", "controls", "extensions"})
ACTIVITY_KEYS = frozenset({"type", "name", "provider", "tolerance", "ref", "background", "pauses", "controls",
                           "configuration", "secrets", "extensions"})
PROVIDER_KEYS = {"python": frozenset({"type", "module", "func", "arguments", "secrets"}),
                 "process": frozenset({"type", "path", "arguments", "timeout", "secrets"}),
                 "http": frozenset({"type", "url", "method", "headers", "arguments", "timeout", "expected_status",
                                    "verify_tls", "max_retries", "secrets"})}
CONTROL_KEYS = frozenset({"name", "provider", "scope", "automatic"})


def _refuse_unknown(node: Any, known: frozenset[str], where: str) -> None:
    if not isinstance(node, dict):
        return
    for key in node:
        if str(key) not in known:
            raise ExperimentError(f"unknown key '{key}': Chaos Toolkit would ignore it and what it holds",
                                  where=f"{where} {key}" if where.endswith(":") else f"{where}.{key}",
                                  hint=unknown_field_hint(str(key), sorted(known)))


def check_keys(doc: dict[str, Any], where: str) -> None:
    """Refuse a key Chaos Toolkit does not read (:data:`EXPERIMENT_KEYS` and the other sets):
    at the top level, in the steady-state hypothesis, in every activity and its provider, in
    every control. ``configuration`` and ``arguments`` are not walked: the specchaos block and
    each activity's arguments are validated by their own models.

    Raises:
        ExperimentError: one line naming the key's path, the nearest known key and the known keys.
    """
    if "matrix" in doc and "method" not in doc:   # a sweep file (harness.experiment.sweep), not an experiment
        raise ExperimentError("this is a sweep file (a top-level matrix), not an experiment",
                              where=f"{where}: matrix", hint=f"run it with `specchaos sweep {where}`")
    _refuse_unknown(doc, EXPERIMENT_KEYS, f"{where}:")
    _refuse_unknown(doc.get("steady-state-hypothesis"), HYPOTHESIS_KEYS, f"{where}: steady-state-hypothesis")
    for loc, activity in _activities(doc):
        _refuse_unknown(activity, ACTIVITY_KEYS, f"{where}: {loc}")
        provider = activity.get("provider") if isinstance(activity, dict) else None
        if isinstance(provider, dict) and provider.get("type") in PROVIDER_KEYS:
            _refuse_unknown(provider, PROVIDER_KEYS[provider["type"]], f"{where}: {loc}.provider")
    for i, control in enumerate(doc.get("controls") or []):
        _refuse_unknown(control, CONTROL_KEYS, f"{where}: controls[{i}]")


def fault_activities(doc: dict[str, Any], where: str = "") -> Iterator[tuple[str, str, Fault]]:
    """Every fault action of the experiment, validated: ``(location, kind, fault)``.

    A fault action is an activity whose provider is :data:`ACTIONS_MODULE` and whose
    ``func`` is a family's typed action (e.g. ``kill_process``) or the generic
    ``inject_fault(kind, arguments)``.

    Raises:
        ExperimentError: unknown family, or an invalid or unknown argument (a family's, or
            the common ``duration_s``/``evidence_timeout_s`` of
            :class:`harness.experiment.actions.FaultTiming`),
            located as ``<where>: <location>.provider.arguments[.arguments].<field>``.
    """
    for loc, act in _activities(doc):
        prov = (act or {}).get("provider") or {} if isinstance(act, dict) else {}
        if prov.get("module") != ACTIONS_MODULE:
            continue
        func, args = prov.get("func"), prov.get("arguments") or {}
        at = f"{where}: {loc}.provider.arguments" if where else f"{loc}.provider.arguments"
        if func == GENERIC_FAULT_ACTION or by_activity(str(func)) is not None:
            _check_timing(args, at)
        if func == GENERIC_FAULT_ACTION:
            if "kind" not in args:
                raise ExperimentError("inject_fault needs a 'kind'", where=at)
            kind = args["kind"]
            fault_class(kind, where=f"{at}.kind")
            fault = make_fault(kind, args.get("arguments") or {}, where=at)
        else:
            cls = by_activity(str(func))
            if cls is None:
                if func not in actions.__all__:
                    raise ExperimentError(f"{ACTIONS_MODULE} has no action {func!r}",
                                          where=f"{where}: {loc}.provider.func" if where else f"{loc}.provider.func",
                                          hint=f"actions: {', '.join(actions.__all__)} (specchaos faults lists the "
                                               f"fault actions)")
                continue
            kind = cls.kind
            params = {k: v for k, v in args.items() if k not in FaultTiming.model_fields}
            fault = make_fault(kind, params, where=at.removesuffix(".arguments"), also=list(FaultTiming.model_fields))
        yield loc, kind, fault


def _check_host(doc: dict[str, Any], loc: str, fault: Fault, where: str, cfg: SpecchaosConfig | None = None) -> None:
    """:meth:`Fault.check_host` and :meth:`Fault.check_stack`, the error located at the
    argument it names.

    Raises:
        ExperimentError: the host cannot do what the fault's arguments ask, or they do not
            fit the stack (e.g. a model that does not exist).
    """
    try:
        fault.check_host()
        if cfg is not None:
            fault.check_stack(cfg.stack)
    except SpecchaosError as exc:
        kind, _, index = loc.partition("[")
        act = (doc.get(kind) if kind != "steady-state-hypothesis.probes" else
               (doc.get("steady-state-hypothesis") or {}).get("probes")) or []
        prov = (act[int(index.rstrip("]"))] or {}).get("provider") or {}
        at = f"{where}: {loc}.provider.arguments" + (".arguments" if prov.get("func") == GENERIC_FAULT_ACTION else "")
        raise ExperimentError(exc.message, where=f"{at}.{exc.where}" if exc.where else at, hint=exc.hint) from None


def _offering(needs: list[str]) -> list[str]:
    """The registered launchers whose servers offer every capability of ``needs`` (those
    that cannot be loaded here are left out)."""
    out = []
    for name in launcher_names():
        try:
            cls = launcher_class(name)
        except SpecchaosError:
            continue
        if not missing(needs, cls.server_class):
            out.append(name)
    return out


def check_capabilities(cfg: SpecchaosConfig, faults: Sequence[tuple[str, str, Fault]], path: str) -> None:
    """Refuse, before anything starts, a fault whose family needs a server capability
    (:attr:`faults.base.Fault.needs`) that the chosen launcher's servers lack
    (:mod:`harness.stack.capabilities`), and the speculation circuit breaker on a launcher
    without respeculation.

    Raises:
        ExperimentError: one line naming the fault (location and family), the launcher and
            what is missing, e.g. ``x.yaml: method[0].provider: process-kill needs process ids (capability
            `processes`); launcher `external` attaches to URLs only: use launcher docker or local``.
    """
    name = cfg.stack.launcher
    launcher = launcher_class(name)
    asked = [(kind, list(fault.required()), f"{path}: {loc}.provider") for loc, kind, fault in faults]
    offered = capabilities_of(launcher.server_class)
    for loc, kind, fault in faults:
        for capability, why in fault.excluded().items():
            if capability in offered:
                raise ExperimentError(f"{kind}: {why}; launcher `{name}` {launcher.summary}",
                                      where=f"{path}: {loc}.provider")
    if cfg.stack.breaker.enabled:
        asked.append(("the speculation circuit breaker", ["respeculation"],
                      f"{path}: configuration.specchaos.stack.breaker.enabled"))
    for subject, needs, where in asked:
        lacking = missing(needs, launcher.server_class)
        if lacking:
            raise ExperimentError(refusal(subject, lacking, name, launcher.summary, _offering(lacking)), where=where)


#: Told what :func:`check_experiment` is doing before each step that can take seconds
#: (asking a launcher's engine, measuring a source's prompts): one line, e.g.
#: ``"measuring the prompts of load.source (experiments/sources/requests.jsonl) with the target's tokenizer"``.
Progress = Callable[[str], None]


def load_experiment(path: str | Path, overrides: Sequence[Override] = (), progress: Progress | None = None) -> Experiment:
    """Parse and validate an experiment without starting anything (see module doc), with
    ``overrides`` (:mod:`harness.experiment.overrides`) applied to its
    ``configuration.specchaos`` before it is validated; ``progress`` is told each slow step
    (:data:`Progress`).

    Raises:
        ExperimentError: malformed file, unknown fault/role/argument, missing control,
            a method without a fault, an override of an unknown field or with an invalid value.
        ModelError: a model directory named by the configuration is missing.
        StackError: an explicitly configured port is already in use.
    """
    path = Path(path)
    return check_experiment(parse_file(path), path, overrides=overrides, progress=progress)


def check_experiment(doc: dict[str, Any], path: str | Path, overrides: Sequence[Override] = (),
                     configuration: dict[str, Any] | None = None, progress: Progress | None = None) -> Experiment:
    """Validate a parsed experiment document (every step of :func:`load_experiment` after
    parsing). ``path`` names the document in error messages: the file, or under plain
    ``chaos run`` (which hands the control the document, not its path) a label.

    Args:
        overrides: applied to ``configuration.specchaos`` before it is validated, with those
            of ``configuration.specchaos_set`` (ranked between the environment and ``--set``).
        configuration: the configuration as Chaos Toolkit resolved it (``chaos run --var``
            included); default: resolved here from the document.
        progress: told each slow step before it starts (:data:`Progress`).

    Returns:
        The experiment; its ``doc`` carries the block with the overrides applied, and
        ``overrides`` lists them.

    Raises:
        ExperimentError, ModelError, StackError: as :func:`load_experiment`.
        SourceError: a bad ``load.source`` (:func:`harness.load.source_prep.prepare_source`),
            naming the experiment, the field and ``FILE:LINE`` (``exp.yaml:
            configuration.specchaos.load.source.path: FILE: no such file``).
    """
    tell = progress or (lambda _line: None)
    check_keys(doc, str(path))   # a misspelt key would be ignored by Chaos Toolkit: refused here
    faults = list(fault_activities(doc, where=str(path)))   # before Chaos Toolkit: errors name the field
    try:
        ensure_experiment_is_valid(doc)
    except ChaosException as exc:
        raise ExperimentError(f"not a valid Chaos Toolkit experiment: {exc}", where=str(path)) from None

    controls = doc.get("controls") or []
    if not any(((c or {}).get("provider") or {}).get("module") == CONTROL_MODULE for c in controls):
        raise ExperimentError(f"the experiment does not declare the specchaos control ({CONTROL_MODULE})",
                              where=f"{path}: controls",
                              hint="add {name: specchaos, provider: {type: python, module: harness.experiment.control}}")
    if configuration is None:
        try:
            conf = load_configuration(doc.get("configuration") or {})
        except ChaosException as exc:
            raise ExperimentError(str(exc), where=f"{path}: configuration") from None
    else:
        conf = configuration
    if "specchaos" not in conf:   # the defaults would apply silently: refuse
        near = difflib.get_close_matches("specchaos", [str(k) for k in conf], n=1, cutoff=0.6)
        raise ExperimentError("missing: the specchaos control needs this block (stack, load, phases and the "
                              "limits); without it every limit would be a built-in default",
                              where=f"{path}: configuration.specchaos",
                              hint=f"is configuration.{near[0]} a misspelling of it?" if near else
                              "add configuration: {specchaos: {...}}; experiments/kill-draft-worker.yaml has one")
    ovs = [*overrides, *config_var_overrides(conf.get(CONFIG_VAR), where=f"{path}: configuration.{CONFIG_VAR}")]
    block = conf.get("specchaos")
    if ovs:
        block = apply_overrides(block, ovs, SpecchaosConfig)
        doc = copy.deepcopy(doc)
        doc.setdefault("configuration", {})["specchaos"] = block
    cfg = parse_config(block, where=f"{path}: configuration.specchaos", overrides=ovs)
    if cfg.gpu.require and (why := gpu.unavailable()) is not None:
        raise ExperimentError(why, where=f"{path}: configuration.specchaos.gpu.require",
                              hint="run it on a host with an NVIDIA GPU and its driver (nvidia-smi lists it), or set "
                                   "gpu.require: false to have the GPU checks reported not judged")

    servers = {"spec"} | ({"ref"} if cfg.stack.reference else set())
    for loc, _kind, fault in faults:
        server = getattr(fault.params, "server", None)
        if server is not None and server not in servers:
            raise ExperimentError(f"unknown server '{server}'", where=f"{path}: {loc}.provider.arguments.server",
                                  hint=f"known: {', '.join(sorted(servers))}")
    for loc, act in _activities(doc):   # the harness's probes and actions that name a server
        prov = (act.get("provider") or {}) if isinstance(act, dict) else {}
        args = prov.get("arguments") or {}
        if prov.get("module") in (ACTIONS_MODULE, PROBES_MODULE) and isinstance(args, dict) and "server" in args \
                and args["server"] not in servers:
            raise ExperimentError(f"unknown server {args['server']!r}", where=f"{path}: {loc}.provider.arguments.server",
                                  hint=f"known: {', '.join(sorted(servers))}")
        if prov.get("module") == ACTIONS_MODULE and prov.get("func") == "hold_phase" and isinstance(args, dict) \
                and args.get("phase") is not None and args["phase"] not in PHASES:
            raise ExperimentError(f"unknown phase {args['phase']!r}", where=f"{path}: {loc}.provider.arguments.phase",
                                  hint=f"known: {', '.join(PHASES)}")
    check_capabilities(cfg, faults, str(path))   # what the launcher's servers must offer (process ids...)
    for loc, _kind, fault in faults:   # what the host must provide (a writable cgroup, a GPU...)
        _check_host(doc, loc, fault, where=str(path), cfg=cfg)
    if not any(loc.startswith("method[") for loc, _, _ in faults) and not cfg.soak.enabled:
        raise ExperimentError("the method injects no fault, so the run would test nothing",
                              where=f"{path}: method",
                              hint=f"add a fault action of {ACTIONS_MODULE} (e.g. kill_process), or judge a "
                                   "sustained load with soak.enabled: true")
    unknown = unknown_requirements([*(cfg.judge.required or []), *cfg.judge.optional])
    if unknown:
        raise ExperimentError(f"{unknown[0]!r} is neither a check family nor a check category",
                              where=f"{path}: configuration.specchaos.judge",
                              hint="name a check family or category, e.g. integrity or degradation, or a check "
                                   "name as report.json writes it, e.g. integrity.compared")
    launcher = launcher_class(cfg.stack.launcher)
    tell(f"checking the stack before anything starts (the {cfg.stack.launcher} launcher, which "
         f"{launcher.summary}: models, ports and what it needs of the host or its engine)")
    launcher.preflight(cfg.stack, where=f"{path}: configuration.specchaos.stack")
    requests = None
    if cfg.load.source is not None:   # read, measured and bucketed now: a bad source starts nothing
        tokenizer = resolve_models(cfg.stack, where=f"{path}: configuration.specchaos.stack").target
        tell(f"measuring the prompts of load.source ({cfg.load.source.path}) with the target's tokenizer")
        try:
            requests = prepare_source(cfg.load, Path.cwd(), max_model_len=cfg.stack.max_model_len,
                                      tokenizer_dir=tokenizer)
        except SourceError as exc:   # the file's own FILE:LINE, after the experiment and the field
            raise SourceError(exc.message, where=f"{path}: configuration.specchaos.load.source.path: {exc.where}",
                              hint=exc.hint, details=exc.details) from None
        _check_source_classes(cfg, requests, where=f"{path}: configuration.specchaos.acceptance_floor")
    return Experiment(path=Path(path), doc=doc, cfg=cfg, faults=[f for _, _, f in faults],
                      method_hold_s=method_hold_s(doc), overrides=sorted(ovs, key=lambda o: o.rank),
                      requests=requests)


def _check_source_classes(cfg: SpecchaosConfig, requests: list[RequestSpec], *, where: str) -> None:
    """A floor or exclusion naming a class must name a category the source carries (or
    ``source``, the class of its uncategorised requests).

    Raises:
        ExperimentError: the first class no request of the source has, with those it has.
    """
    known = {r.category or SOURCE_CLASS for r in requests}
    field_name = cfg.load.source.category_field if cfg.load.source is not None else "category"
    for field in ("exclude_request_classes", "request_classes"):
        unknown = [n for n in getattr(cfg.acceptance_floor, field) if n not in known]
        if unknown:
            raise ExperimentError(f"{unknown[0]!r} is not a category of load.source "
                                  f"(its categories: {', '.join(sorted(known))})", where=f"{where}.{field}",
                                  hint=f"categories come from each record's {field_name!r} field")


def run_meta(exp: Experiment) -> dict[str, Any]:
    """What a run records about its experiment beyond the document: ``overrides``, the
    overrides applied (``[{"path", "value", "source"}]``, lowest precedence first), when any.
    It goes into ``run.json`` and ``report.json``."""
    return {"overrides": [o.to_dict() for o in exp.overrides]} if exp.overrides else {}


def method_hold_s(doc: dict[str, Any]) -> float:
    """Seconds the method's activities hold and pause, at most: every fault action's
    ``duration_s`` and every ``pauses`` ``before``/``after`` of the method, summed (an
    upper bound: background actions overlap). The load's run time adds it."""
    total = 0.0
    for act in doc.get("method") or []:
        if not isinstance(act, dict):
            continue
        args = ((act.get("provider") or {}).get("arguments") or {})
        if isinstance(args.get("duration_s"), (int, float)) and not isinstance(args.get("duration_s"), bool):
            total += float(args["duration_s"])
        for v in (act.get("pauses") or {}).values():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                total += float(v)
    return total
