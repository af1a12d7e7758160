"""The stack's pre-flight checks: the one function both ``specchaos validate`` and
``specchaos run`` (before anything starts) and every launcher's ``start`` call, so the
three can never disagree.

Checked: the target (and, per :func:`harness.stack.config.needs_draft`, the draft) model
directories exist and look like models; ``max_model_len`` fits the target model's context
(its ``config.json``'s ``max_position_embeddings``, which vLLM also refuses to exceed);
explicitly configured ports are free now (one
port probe: :func:`harness.ports.port_in_use`). Field rules (loopback host, two
distinct ports, a draft for methods that need one) are the configuration model's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ModelError, StackError
from harness.stack.config import StackConfig, needs_draft
from harness.stack.models import resolve_model
from harness.ports import port_in_use

__all__ = ["ResolvedModels", "check_stack", "resolve_models", "check_ports", "check_context", "model_context_tokens"]

DEFAULT_WHERE = "configuration.specchaos.stack"


@dataclass(frozen=True)
class ResolvedModels:
    """Absolute model directories of a stack: ``draft`` is None for a draftless method."""

    target: Path
    draft: Path | None


def resolve_models(cfg: StackConfig, where: str = DEFAULT_WHERE) -> ResolvedModels:
    """Resolve ``cfg.target`` and, where the method needs one, ``cfg.draft`` inside ``cfg.models_dir``.

    Raises:
        ModelError: a model is missing or incomplete; ``where`` names the field
            (e.g. ``"<where>.draft"``) and the hint says how to build the tiny models.
    """
    def one(field: str) -> Path:
        name = getattr(cfg, field)
        try:
            return resolve_model(Path(cfg.models_dir), name)
        except ModelError as exc:
            raise ModelError(f"{field} model {name!r} not found in models_dir {cfg.models_dir!r} "
                             f"(looked at {exc.where})", where=f"{where}.{field}", hint=exc.hint) from None

    target = one("target")
    draft = one("draft") if needs_draft(cfg.method) else None
    return ResolvedModels(target, draft)


def check_ports(cfg: StackConfig, where: str = DEFAULT_WHERE) -> None:
    """Every explicitly configured port (``spec_port``, ``ref_port`` when a reference is
    started; 0 means "pick a free one" and is not checked) is free on ``cfg.host``.

    Raises:
        StackError: a port is in use; ``where`` names the field.
    """
    fields = ["spec_port"] + (["ref_port"] if cfg.reference else [])
    for field in fields:
        port = getattr(cfg, field)
        if port and port_in_use(cfg.host, port):
            raise StackError(f"port {port} on {cfg.host} is in use", where=f"{where}.{field}",
                             hint="free it, or set 0 to pick a free port")


def model_context_tokens(model_dir: Path) -> int | None:
    """The model's context in tokens: ``max_position_embeddings`` of its ``config.json``;
    None when unknown (no such field, unreadable, or a rope scaling that stretches it)."""
    try:
        conf = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    rope = conf.get("rope_scaling") or conf.get("rope_parameters") or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        return None
    n = conf.get("max_position_embeddings")
    return n if isinstance(n, int) and n > 0 else None


def check_context(cfg: StackConfig, target: Path, where: str = DEFAULT_WHERE) -> None:
    """``cfg.max_model_len`` is at most the target model's context (:func:`model_context_tokens`).

    Raises:
        StackError: it is longer; ``where`` names ``max_model_len``.
    """
    context = model_context_tokens(target)
    if context is not None and cfg.max_model_len > context:
        raise StackError(f"max_model_len {cfg.max_model_len} exceeds the target model's context ({context} tokens, "
                         f"max_position_embeddings in {target / 'config.json'})", where=f"{where}.max_model_len",
                         hint=f"set max_model_len <= {context} (the load's buckets must fit in it too)")


def check_stack(cfg: StackConfig, where: str = DEFAULT_WHERE) -> ResolvedModels:
    """All pre-flight checks of a stack (models, context, then ports); starts nothing.

    Returns:
        The resolved model directories.

    Raises:
        ModelError: a model is missing (see :func:`resolve_models`).
        StackError: ``max_model_len`` exceeds the model's context (:func:`check_context`), or
            a configured port is in use (see :func:`check_ports`).
    """
    models = resolve_models(cfg, where)
    check_context(cfg, models.target, where)
    check_ports(cfg, where)
    return models
