"""The locust side of the load: one streaming user class; everything else is configuration.

Run by :class:`harness.load.locust_process.LocustProcess` as
``python -m locust -f <this file> --headless --host http://127.0.0.1:PORT ...`` (never
import it into another process: importing locust monkey-patches the interpreter with gevent).

Each :class:`StreamingCompletionUser` is a closed loop: send one streaming completion
(:func:`harness.load.client.stream_completion`), append its record to the records file,
wait, repeat. It walks the prompt set in its own seeded order (a fresh shuffle per pass,
``random.Random(SPECCHAOS_SEED + user index)``), so every prompt is sent many times, and
draws each request's sampling class by weight from its own seeded generator
(``random.Random(f"sampling:{SPECCHAOS_SEED}:{user index}")``, so adding classes does
not change the prompt walk), and its request class likewise
(``random.Random(f"class:{SPECCHAOS_SEED}:{user index}")``): the class's endpoint and body
fields (:func:`harness.load.client.request_body`); a multi-turn chat class (``turns``) sends
its turns one after the other, each carrying the earlier ones (:func:`send_conversation`).
A traffic source's prompt set (``load.source``: prompts with a ``body`` and an ``origin``)
is walked in its own order instead, user ``u`` starting at
:func:`harness.load.profiles.source_start`, wrapping; each request is the source's body
(:func:`harness.load.client.completion_body`), recorded with its ``origin``.

Mirror mode (``SPECCHAOS_MIRROR_HOST`` set): every step sends the same request (prompt
and sampling class) to the speculative server (``--host``, records ``server="spec"``)
and to the reference server (records ``server="ref"``), one after the other; which goes
first alternates from step to step, and users start on alternate sides, so neither
server always runs second.
Locust's own statistics are kept right by firing ``environment.events.request`` for every
request (``response_time`` in ms, an ``exception`` on failure).

Retries (``SPECCHAOS_RETRY``, :mod:`harness.load.retry`): a failed try that the policy
retries is sent again (same prompt and sampling) after the backoff, jittered from the
user's own generator (``random.Random(f"retry:{SPECCHAOS_SEED}:{user index}")``, so the
prompt walk does not depend on failures); every try is its own record, all sharing the
logical request's ``logical_id``, ``attempt`` counting from 1. After the last failed try
the user waits ``SPECCHAOS_ERROR_BACKOFF_S`` and goes on with its next request.

Profiles (``SPECCHAOS_PROFILE``, :mod:`harness.load.profiles`):

* closed loop without ramp or steps: exactly the loop above, ``-u`` users;
* closed loop with a ramp or steps: :class:`ProfileShape`, a locust ``LoadTestShape``
  whose ``tick`` (polled by locust once a second) returns the schedule's users, so a step
  takes effect within about a second plus the spawn time (``-r``); it ends the run at
  ``--run-time``;
* open loop: one :class:`OpenLoopUser` (``-u 1``; one per worker, below) is the arrival scheduler: it sleeps until
  each arrival instant of :func:`harness.load.profiles.iter_arrivals` and spawns one
  greenlet for that request (with its retries), so arrivals never wait for responses (a
  true open loop, unlike locust's ``constant_throughput``, which paces each user after its
  own response). The ``i``-th arrival sends the ``i``-th request of one seeded walk
  (user 0). At most ``max_in_flight`` requests run at once; an arrival beyond it is
  dropped and counted. With a timed traffic source (``load.source.format: mooncake``) the
  arrival instants are the trace's own (:func:`harness.load.profiles.trace_arrivals`,
  repeated while the load runs) and arrival ``i`` sends the source's request
  ``i % n``. Records carry ``user_id`` 0. ``load_stats.json`` beside the records
  says how many arrivals came, were dropped, and how late the scheduler sent (``lag``).
  Distributed (``SPECCHAOS_WORKER_COUNT`` N > 0, ``-u N``: one scheduler per worker):
  worker ``k`` walks the same arrival sequence and walk and sends the arrivals ``i`` with
  ``i % N == k`` (a thinned share of the one process: together exactly its requests), on
  its own clock from its scheduler's start (the workers' starts differ by locust's spawn
  messages, milliseconds on loopback: ``-r`` is at least ``N``, so one batch starts them
  all), with its share of ``max_in_flight``
  (:func:`harness.load.profiles.share`); each writes ``load_stats.worker<k>.json``, which
  :func:`harness.load.profiles.read_load_stats` merges.

Configuration (environment variables, all set by ``LocustProcess``):

* ``SPECCHAOS_PROMPTS``: prompts.json (:func:`harness.load.prompts.save_prompt_set`).
* ``SPECCHAOS_RECORDS``: records.jsonl to append to (one line per request, flushed each).
* ``SPECCHAOS_MODEL``: served model name.
* ``SPECCHAOS_REQUEST_TIMEOUT_S``: bound on each whole request (default 30).
* ``SPECCHAOS_MAX_REQUESTS``: requests this process may send in all; when reached, the
  runner quits (default 20000).
* ``SPECCHAOS_THINK_TIME_S``: wait after a successful request (default 0).
* ``SPECCHAOS_ERROR_BACKOFF_S``: wait after a failed logical request (all its tries), so
  a dead server is not hammered in a tight loop (default 0.25; the larger of it and the
  think time is used; closed loop only).
* ``SPECCHAOS_SEED``: seed of the per-user prompt orders (default 1234).
* ``SPECCHAOS_IGNORE_EOS``: ``1``/``true`` to ask for ``ignore_eos`` (default off).
* ``SPECCHAOS_READ_STAMPS``: ``1``/``true`` to record user-space read instants too
  (``load.read_stamps``; default off).
* ``SPECCHAOS_SAMPLING``: the sampling classes as a JSON list of
  :class:`harness.load.config.SamplingClass` (default: greedy only).
* ``SPECCHAOS_REQUEST_CLASSES``: the request classes as a JSON list of
  :class:`harness.load.config.RequestClass` (default, or ``[]``: plain completions only,
  sent exactly as without classes).
* ``SPECCHAOS_MIRROR_HOST``: the reference server's root URL for mirror mode (default:
  none, no mirror); ``SPECCHAOS_MIRROR_MODEL`` its served model name (default
  ``SPECCHAOS_MODEL``).
* ``SPECCHAOS_PROFILE``: the profile as JSON (:class:`harness.load.config.ProfileConfig`;
  default: closed loop, ``-u`` users).
* ``SPECCHAOS_RETRY``: the retry policy as JSON (:class:`harness.load.config.RetryConfig`;
  default: no retries).
* ``SPECCHAOS_WORKER_INDEX``, ``SPECCHAOS_WORKER_COUNT``: set on the workers of a
  distributed load (``load.workers``; see the end of this file); the records path and
  ``SPECCHAOS_MAX_REQUESTS`` are then this worker's own file and share.

Shutdown: once locust starts stopping (``test_stopping``) no new request is sent; its
``--stop-timeout`` lets a user finish the request in flight; a request still running when
it expires is ended by locust (``GreenletExit``) and written as an error
(``"other:GreenletExit"``), never as a success.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import gevent
import gevent.pool
from locust import LoadTestShape, User, events, task
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner

from pydantic import TypeAdapter, ValidationError

from harness.errors import LoadError, first_error
from harness.load.client import check_loopback_url, make_client, stream_completion, user_message
from harness.load.config import GREEDY, PLAIN, ProfileConfig, RequestClass, RetryConfig, SamplingClass
from harness.load.endpoints import ENDPOINTS
from harness.load.profiles import Walk, arrivals, lag_fields, share, timed, trace_period_s, users_at
from harness.load.prompts import Prompt, load_prompt_set
from harness.load.records import RequestRecord, append_record, worker_records_path
from harness.load.retry import backoff_s, retryable
from harness.load.lag import LagHistogram

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    """The user's configuration, read once from the environment (see module doc)."""

    prompts: tuple[Prompt, ...]
    records_path: Path
    model: str
    request_timeout_s: float
    max_requests: int
    think_time_s: float
    error_backoff_s: float
    seed: int
    ignore_eos: bool
    read_stamps: bool
    sampling: tuple[SamplingClass, ...] = (GREEDY,)
    #: The configured request classes; empty: the implicit plain completions class.
    request_classes: tuple[RequestClass, ...] = ()
    mirror_host: str | None = None
    mirror_model: str | None = None
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    retry: RetryConfig = field(default_factory=lambda: RetryConfig(max_retries=0))
    #: Distributed load (``load.workers``): this worker's index and the worker count
    #: (``worker_count == 0``: a single locust process, no master).
    worker_index: int = 0
    worker_count: int = 0


def _model(raw: str | None, name: str, cls, default):
    """A pydantic model from the JSON in variable ``name`` (``default`` when unset)."""
    if not raw:
        return default
    try:
        return cls.model_validate_json(raw)
    except ValidationError as exc:
        loc, msg, _ = first_error(exc)
        raise LoadError(f"{name} is not a valid {cls.__name__}: {loc + ': ' if loc else ''}{msg}",
                        where="harness/load/locustfile.py") from None


def _classes(raw: str | None, name: str, cls: type) -> tuple:
    """A tuple of ``cls`` models from the JSON list in variable ``name`` (empty when unset)."""
    if not raw:
        return ()
    try:
        return tuple(TypeAdapter(list[cls]).validate_python(json.loads(raw)))
    except ValueError as exc:   # json.JSONDecodeError and pydantic's ValidationError
        msg = first_error(exc)[1] if isinstance(exc, ValidationError) else str(exc)
        raise LoadError(f"{name} is not a list of {cls.__name__}: {msg}",
                        where="harness/load/locustfile.py") from None


def _sampling(raw: str | None) -> tuple[SamplingClass, ...]:
    if not raw:
        return (GREEDY,)
    classes = _classes(raw, "SPECCHAOS_SAMPLING", SamplingClass)
    if not classes:
        raise LoadError("SPECCHAOS_SAMPLING is empty", where="harness/load/locustfile.py")
    return classes


def settings_from_env(env: dict[str, str] | os._Environ) -> Settings:
    """Parse the ``SPECCHAOS_*`` variables.

    Raises:
        LoadError: a required variable is missing, a number does not parse, or the prompt
            set is empty or unreadable.
    """

    def need(name: str) -> str:
        value = env.get(name)
        if not value:
            raise LoadError(f"{name} is not set", where="harness/load/locustfile.py",
                            hint="start locust through harness.load.locust_process.LocustProcess")
        return value

    def num(name: str, default: float, kind=float):
        raw = env.get(name)
        if raw in (None, ""):
            return kind(default)
        try:
            value = kind(raw)
        except ValueError:
            raise LoadError(f"{name}={raw!r} is not a {kind.__name__}", where="harness/load/locustfile.py") from None
        if value < 0:
            raise LoadError(f"{name}={raw!r} must be >= 0", where="harness/load/locustfile.py")
        return value

    def flag(name: str) -> bool:
        return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")

    prompts = tuple(load_prompt_set(need("SPECCHAOS_PROMPTS")))
    if not prompts:
        raise LoadError("the prompt set is empty", where=need("SPECCHAOS_PROMPTS"))
    return Settings(
        prompts=prompts,
        records_path=Path(need("SPECCHAOS_RECORDS")),
        model=need("SPECCHAOS_MODEL"),
        request_timeout_s=num("SPECCHAOS_REQUEST_TIMEOUT_S", 30.0),
        max_requests=num("SPECCHAOS_MAX_REQUESTS", 20000, int),
        think_time_s=num("SPECCHAOS_THINK_TIME_S", 0.0),
        error_backoff_s=num("SPECCHAOS_ERROR_BACKOFF_S", 0.25),
        seed=num("SPECCHAOS_SEED", 1234, int),
        ignore_eos=flag("SPECCHAOS_IGNORE_EOS"),
        read_stamps=flag("SPECCHAOS_READ_STAMPS"),
        sampling=_sampling(env.get("SPECCHAOS_SAMPLING")),
        request_classes=_classes(env.get("SPECCHAOS_REQUEST_CLASSES"), "SPECCHAOS_REQUEST_CLASSES", RequestClass),
        mirror_host=env.get("SPECCHAOS_MIRROR_HOST") or None,
        mirror_model=env.get("SPECCHAOS_MIRROR_MODEL") or None,
        profile=_model(env.get("SPECCHAOS_PROFILE"), "SPECCHAOS_PROFILE", ProfileConfig, ProfileConfig()),
        retry=_model(env.get("SPECCHAOS_RETRY"), "SPECCHAOS_RETRY", RetryConfig, RetryConfig(max_retries=0)),
        worker_index=num("SPECCHAOS_WORKER_INDEX", 0, int),
        worker_count=num("SPECCHAOS_WORKER_COUNT", 0, int),
    )


SETTINGS = settings_from_env(os.environ)  # fail at locust start, not at the first request

_user_index = itertools.count()
_sent = 0
_quitting = False
_stopping = False


@events.test_stopping.add_listener
def _on_test_stopping(**_kwargs) -> None:
    """From now on no user starts a new request. Locust kills a user it found waiting,
    but the kill lands late: without this, a user whose wait just ended would send one
    more request and have it cut at once (a spurious error after the run's end)."""
    global _stopping
    _stopping = True


class RequestFailed(Exception):
    """What locust's statistics see for a failed request: ``"<error class>: <detail>"``."""


class _Halt(Exception):
    """No more requests: the run is stopping, or ``SPECCHAOS_MAX_REQUESTS`` was reached."""


def record(environment, rec: RequestRecord) -> None:
    """Append ``rec`` to the records file and report it to locust's statistics."""
    append_record(SETTINGS.records_path, rec)
    exc = None if rec.ok else RequestFailed(f"{rec.error}: {rec.error_detail}")
    host = environment.host if rec.server == "spec" else SETTINGS.mirror_host
    path = ENDPOINTS.get(rec.endpoint, ENDPOINTS["completions"])
    environment.events.request.fire(
        request_type="POST",
        name=f"{path} [{rec.prompt_class}]" + ("" if rec.server == "spec" else f" [{rec.server}]"),
        response_time=(rec.e2e_s or 0.0) * 1000.0,
        response_length=len(rec.text),
        response=None,
        context={"user_id": rec.user_id, "prompt_id": rec.prompt_id, "request_id": rec.request_id,
                 "attempt": rec.attempt},
        exception=exc,
        start_time=rec.send_time,
        url=f"{host}{path}",
    )


def send_logical(environment, client, target: tuple[str, str, str], prompt: Prompt, sampling: SamplingClass, *,
                 user_id: int, rng: random.Random, request_class: RequestClass | None = None,
                 history: tuple[dict, ...] = ()) -> RequestRecord | None:
    """Every try of one logical request of ``request_class`` (None: plain completions; a
    chat conversation's turn after ``history``) to
    one server (``target`` = ``(server, base URL, model)``) under ``SETTINGS.retry``: the first, then a retry after each retryable
    failure (:func:`harness.load.retry.retryable`), sleeping :func:`harness.load.retry.backoff_s`
    with ``rng``'s jitter, at most ``max_retries`` times. Each try is recorded.

    Returns:
        The record of the try that succeeded, None when none did.

    Raises:
        _Halt: the run is stopping or the request bound was reached (no try is sent then).
    """
    global _sent
    server, url, model = target
    logical_id = uuid.uuid4().hex
    policy = SETTINGS.retry
    for attempt in range(1, policy.max_retries + 2):
        if _stopping:
            raise _Halt()
        if _sent >= SETTINGS.max_requests:
            _quit(environment)
            raise _Halt()
        _sent += 1
        rec = stream_completion(
            client, url, model, prompt,
            timeout_s=SETTINGS.request_timeout_s, source="load", user_id=user_id,
            ignore_eos=SETTINGS.ignore_eos, on_interrupt=lambda r: record(environment, r), server=server,
            sampling=sampling, attempt=attempt, logical_id=logical_id, read_stamps=SETTINGS.read_stamps,
            request_class=request_class, history=history,
        )
        record(environment, rec)
        if rec.ok:
            return rec
        if attempt > policy.max_retries or not retryable(rec):
            return None
        gevent.sleep(backoff_s(policy, attempt, rng))
    return None


def send_conversation(environment, client, target: tuple[str, str, str], prompt: Prompt, sampling: SamplingClass,
                      *, user_id: int, rng: random.Random, request_class: RequestClass | None = None) -> bool:
    """One logical request (:func:`send_logical`), or for a multi-turn chat class
    (``turns`` > 1) each turn in order, turn ``n`` carrying the earlier turns' user
    messages and answers; a failed turn ends the conversation.

    Returns:
        Whether every turn succeeded.

    Raises:
        _Halt: as :func:`send_logical`.
    """
    history: tuple[dict, ...] = ()
    for _ in range(request_class.turns if request_class is not None else 1):
        rec = send_logical(environment, client, target, prompt, sampling, user_id=user_id, rng=rng,
                           request_class=request_class, history=history)
        if rec is None:
            return False
        history += (user_message(prompt, history), {"role": "assistant", "content": rec.text})
    return True


def targets(host: str, step: int, user_id: int) -> list[tuple[str, str, str]]:
    """``(server, base URL, model)`` to send a step's request to, in order: the
    speculative server alone, or in mirror mode both, the first alternating per step
    (user ``i`` starts with the reference server when ``i`` is odd)."""
    spec = ("spec", host, SETTINGS.model)
    if not SETTINGS.mirror_host:
        return [spec]
    ref = ("ref", SETTINGS.mirror_host, SETTINGS.mirror_model or SETTINGS.model)
    return [spec, ref] if (step + user_id) % 2 == 0 else [ref, spec]


def _check_hosts(host: str | None) -> None:
    check_loopback_url(host or "", where="locust --host")
    if SETTINGS.mirror_host:
        check_loopback_url(SETTINGS.mirror_host, where="SPECCHAOS_MIRROR_HOST")


def _walk_classes() -> tuple[RequestClass, ...]:
    """The walks' request classes: the configured ones, else the implicit plain class."""
    return SETTINGS.request_classes or (PLAIN,)


def _sent_class(walk: Walk) -> RequestClass | None:
    """The next request's class from ``walk``, None without configured classes (a plain
    completion, sent as :func:`harness.load.client.completion_body` makes it)."""
    request_class = walk.next_class()
    return request_class if SETTINGS.request_classes else None


class StreamingCompletionUser(User):
    """One closed-loop client of the speculative server, and in mirror mode of the
    reference server too (see module doc)."""

    abstract = SETTINGS.profile.kind != "closed"

    def __init__(self, environment) -> None:
        super().__init__(environment)
        self.user_id = global_user_id(next(_user_index))
        self.walk = Walk(SETTINGS.prompts, SETTINGS.sampling, SETTINGS.seed, self.user_id, _walk_classes())
        self.retry_rng = random.Random(f"retry:{SETTINGS.seed}:{self.user_id}")
        self._steps = 0
        self._next_wait = SETTINGS.think_time_s
        self._client = None

    def wait_time(self) -> float:
        """Think time after a success, ``max(think, error backoff)`` after a failed
        logical request."""
        return self._next_wait

    def on_start(self) -> None:
        _check_hosts(self.host)
        self._client = make_client(max_connections=2)

    def on_stop(self) -> None:
        if self._client is not None:
            self._client.close()

    def next_prompt(self) -> Prompt:
        """The next prompt of this user's seeded walk (a new shuffle per pass)."""
        return self.walk.next_prompt()

    def next_sampling(self) -> SamplingClass:
        """The next request's sampling class, drawn by weight from this user's seeded
        generator (no draw when there is only one class)."""
        return self.walk.next_sampling()

    def targets(self) -> list[tuple[str, str, str]]:
        """This step's servers (see :func:`targets`)."""
        return targets(self.host, self._steps, self.user_id)

    @task
    def complete(self) -> None:
        """Send one logical request with its retries (in mirror mode: one to each server),
        record every try, and choose the next wait."""
        prompt, sampling = self.next_prompt(), self.next_sampling()
        request_class = _sent_class(self.walk)
        steps = self.targets()
        self._steps += 1
        all_ok = True
        for target in steps:
            try:
                ok = send_conversation(self.environment, self._client, target, prompt, sampling,
                                       user_id=self.user_id, rng=self.retry_rng, request_class=request_class)
            except _Halt:
                raise StopUser() from None
            all_ok = all_ok and ok
        self._next_wait = SETTINGS.think_time_s if all_ok else max(SETTINGS.think_time_s, SETTINGS.error_backoff_s)


# ---------------------------------------------------------------- profiles (harness.load.profiles)

class ProfileShape(LoadTestShape):
    """Closed loop with a ramp or steps: the schedule's users each second
    (:func:`harness.load.profiles.users_at`), spawning at ``-r``; None (stop) at
    ``--run-time``. Only active when the profile has a ramp or steps."""

    abstract = not (SETTINGS.profile.kind == "closed" and (SETTINGS.profile.ramp or SETTINGS.profile.steps))
    use_common_options = True   # --run-time and --spawn-rate still apply

    def tick(self):
        t = self.get_run_time()
        opts = self.runner.environment.parsed_options
        if opts is not None and opts.run_time and t >= opts.run_time:
            return None
        spawn_rate = (opts.spawn_rate if opts is not None and opts.spawn_rate else 1.0)
        return users_at(SETTINGS.profile, t, 1), spawn_rate


@events.init.add_listener
def _graceful_sigterm_with_a_shape(environment, **_kwargs) -> None:
    """Headless locust (2.47) blocks on a shape before it installs its SIGTERM handler, so
    SIGTERM would kill it outright (requests in flight unrecorded). With the shape active,
    SIGTERM quits the runner gracefully here (users get ``--stop-timeout``), as it does
    without a shape."""
    if ProfileShape.abstract or environment.runner is None or isinstance(environment.runner, WorkerRunner):
        return   # (a worker has no shape: the master runs it and tells the workers to stop)

    def on_sigterm() -> None:
        log.info("SIGTERM: stopping the shaped load")
        gevent.spawn(environment.runner.quit)

    gevent.signal_handler(signal.SIGTERM, on_sigterm)


@dataclass
class OpenLoopStats:
    """The open loop's own account, written to ``load_stats.json`` beside the records:
    arrivals due so far, those dropped (``max_in_flight`` requests were in flight), and the
    scheduler's lateness (lag: seconds between an arrival's planned instant and its start)
    as a bounded histogram (:class:`harness.metrics.lag.LagHistogram`) with its summary
    (``lag_p50_s`` … ``lag_max_s``, ``share_late_1ms``, ``share_late_10ms``) beside it."""

    kind: str = "open"
    rate: float = 0.0
    burstiness: float = 1.0
    max_in_flight: int = 0
    arrivals: int = 0
    dropped: int = 0
    lag: LagHistogram = field(default_factory=LagHistogram)

    def write(self, path: Path) -> None:
        data = {k: v for k, v in self.__dict__.items() if k != "lag"}
        data.update(lag_fields(self.lag))
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)


#: ``load_stats.json`` beside the records file (a worker's: ``load_stats.worker<i>.json``).
STATS_PATH = (worker_records_path(SETTINGS.records_path.with_name("load_stats.json"), SETTINGS.worker_index)
              if SETTINGS.worker_count > 0 else SETTINGS.records_path.with_name("load_stats.json"))


class OpenLoopUser(User):
    """The open loop's arrival scheduler (see module doc): one such user runs per locust
    process (per worker of a distributed load); each
    arrival's request (with its retries) runs in its own greenlet."""

    abstract = SETTINGS.profile.kind != "open"

    def __init__(self, environment) -> None:
        super().__init__(environment)
        self.user_id = next(_user_index)
        p = SETTINGS.profile
        #: this process's part of the arrivals: ``i % stride == part`` (all of them without workers)
        self.stride, self.part = max(1, SETTINGS.worker_count), SETTINGS.worker_index
        rate = p.rate
        if rate is None and timed(SETTINGS.prompts):   # a timed source: its mean rate per period
            rate = len(SETTINGS.prompts) / trace_period_s([q.arrival_s for q in SETTINGS.prompts])
        self.stats = OpenLoopStats(rate=rate or 0.0, burstiness=p.burstiness,
                                   max_in_flight=share(p.max_in_flight, self.stride, self.part))
        self.pool = gevent.pool.Group()
        self._client = None

    def wait_time(self) -> float:
        return 0.0

    def on_start(self) -> None:
        _check_hosts(self.host)
        self._client = make_client(max_connections=self.stats.max_in_flight * (2 if SETTINGS.mirror_host else 1))

    def on_stop(self) -> None:
        self.pool.kill(block=True, timeout=5)   # requests cut now are recorded as other:GreenletExit
        self.stats.write(STATS_PATH)
        if self._client is not None:
            self._client.close()

    @task
    def schedule(self) -> None:
        """Run the arrivals until the run stops (one task call for the whole run)."""
        if self.user_id > 0:   # one scheduler per process: a second would send its arrivals twice
            log.warning("open loop: locust started a second scheduler in this process; it sends nothing")
            raise StopUser()
        p = SETTINGS.profile
        walk = Walk(SETTINGS.prompts, SETTINGS.sampling, SETTINGS.seed, 0, _walk_classes())
        t0 = time.monotonic()
        for i, at in enumerate(arrivals(p, SETTINGS.prompts, SETTINGS.seed)):
            prompt, sampling = walk.next()   # the i-th arrival takes the walk's i-th request, sent or not
            request_class = _sent_class(walk)
            if i % self.stride != self.part:
                continue                     # another worker's arrival
            wait = at - (time.monotonic() - t0)
            if wait > 0:
                gevent.sleep(wait)
            if _stopping or _quitting:
                break
            st = self.stats
            st.arrivals += 1
            st.lag.add(time.monotonic() - t0 - at)
            if len(self.pool) >= st.max_in_flight:
                st.dropped += 1
                continue
            self.pool.spawn(self._arrival, i, prompt, sampling, request_class)
            if st.arrivals % 64 == 1:   # this process's own count: every worker writes its account
                st.write(STATS_PATH)
        self.pool.join(timeout=SETTINGS.request_timeout_s)
        raise StopUser()

    def _arrival(self, i: int, prompt: Prompt, sampling: SamplingClass, request_class: RequestClass | None) -> None:
        rng = random.Random(f"retry:{SETTINGS.seed}:open:{i}")
        for target in targets(self.host, i, 0):
            try:
                send_conversation(self.environment, self._client, target, prompt, sampling, user_id=0, rng=rng,
                                  request_class=request_class)
            except _Halt:
                return


def _quit(environment) -> None:
    """Quit the whole runner once ``SPECCHAOS_MAX_REQUESTS`` were sent (from a new greenlet,
    so users in flight are stopped by locust's own graceful path)."""
    global _quitting
    if _quitting or environment.runner is None:
        return
    _quitting = True
    if isinstance(environment.runner, WorkerRunner):   # distributed: the master quits everyone
        log.info("worker %d: its share SPECCHAOS_MAX_REQUESTS=%d reached, telling the master",
                 SETTINGS.worker_index, SETTINGS.max_requests)
        environment.runner.send_message(MAX_REACHED_MSG, {"worker": SETTINGS.worker_index})
        return
    log.info("SPECCHAOS_MAX_REQUESTS=%d reached, quitting", SETTINGS.max_requests)
    gevent.spawn(environment.runner.quit)


# ---------------------------------------------------------------- distributed load
# (``load.workers``: locust's own master/worker mode, all on loopback.)
# Each worker gets ``SPECCHAOS_WORKER_INDEX`` / ``SPECCHAOS_WORKER_COUNT``, its own records
# file and its share of ``SPECCHAOS_MAX_REQUESTS`` (the shares sum to the run's bound), so
# the bound holds across workers without any coordination per request. A worker that
# used up its share tells the master, which quits the whole run, as the single process does.

#: Custom locust message from a worker to the master: "my share of the requests is used up".
MAX_REACHED_MSG = "specchaos_max_requests"


def global_user_id(k: int) -> int:
    """The run-wide index of this process's ``k``-th user (0-based): ``k`` itself with one
    locust process, ``worker_index + k * worker_count`` on a worker, so indices (and with
    them the seeded walks and sampling draws) never repeat across workers."""
    if SETTINGS.worker_count <= 0:
        return k
    return SETTINGS.worker_index + k * SETTINGS.worker_count


@events.init.add_listener
def _on_init(environment, **_kwargs) -> None:
    # httpx logs one INFO line per request ("HTTP Request: POST ... 200 OK"): under locust's
    # INFO logging that is a log record formatted and written for every request, all of it
    # already in the records file. Warnings and errors still get through.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(MAX_REACHED_MSG, _on_max_reached)


def _on_max_reached(environment, msg, **_kwargs) -> None:
    """On the master: a worker used up its share of the request bound; quit the run."""
    global _quitting
    if _quitting:
        return
    _quitting = True
    log.info("SPECCHAOS_MAX_REQUESTS=%d reached (worker %s used up its share), quitting",
             SETTINGS.max_requests, (msg.data or {}).get("worker"))
    gevent.spawn(environment.runner.quit)
