"""The report layer's block of an experiment's configuration: ``prometheus``.

Every judged run writes its headline results as a Prometheus text file
(:mod:`harness.report.prometheus`); with ``pushgateway_url`` set it also pushes them to a
Pushgateway. Like load and fault traffic, the push goes to loopback only (a Pushgateway
elsewhere is reached through a tunnel or a local relay).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.net import LOOPBACK_HINT, is_loopback_host

__all__ = ["PrometheusConfig"]


class PrometheusConfig(BaseModel):
    """``pushgateway_url``: ``http://127.0.0.1:9091`` style (loopback host only; none: no
    push); ``job``: the Pushgateway job (grouped further by the experiment's title);
    ``timeout_s``: bound on the push, seconds."""

    model_config = ConfigDict(extra="forbid")

    pushgateway_url: str | None = None
    job: str = Field("specchaos", min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")
    timeout_s: float = Field(5.0, gt=0, le=120)

    @field_validator("pushgateway_url")
    @classmethod
    def _loopback_only(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {v!r} (e.g. http://127.0.0.1:9091)")
        if not is_loopback_host(parts.hostname):
            raise ValueError(f"the Pushgateway must be on a loopback address (127.0.0.0/8, ::1 or localhost), not "
                             f"{parts.hostname}: {LOOPBACK_HINT}")
        try:
            parts.port   # noqa: B018  (a malformed port raises here)
        except ValueError as exc:
            raise ValueError(f"bad port in {v!r}: {exc}") from None
        return v.rstrip("/")
