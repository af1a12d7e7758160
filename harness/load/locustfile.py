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
not change the prompt walk).

Mirror mode (``SPECCHAOS_MIRROR_HOST`` set): every step sends the same request (prompt
and sampling class) to the speculative server (``--host``, records ``server="spec"``)
and to the reference server (records ``server="ref"``), one after the other; which goes
first alternates from step to step, and users start on alternate sides, so neither
server always runs second.
Locust's own statistics are kept right by firing ``environment.events.request`` for every
request (``response_time`` in ms, an ``exception`` on failure).

Configuration (environment variables, all set by ``LocustProcess``):

* ``SPECCHAOS_PROMPTS``: prompts.json (:func:`harness.load.prompts.save_prompt_set`).
* ``SPECCHAOS_RECORDS``: records.jsonl to append to (one line per request, flushed each).
* ``SPECCHAOS_MODEL``: served model name.
* ``SPECCHAOS_REQUEST_TIMEOUT_S``: bound on each whole request (default 30).
* ``SPECCHAOS_MAX_REQUESTS``: requests this process may send in all; when reached, the
  runner quits (default 20000).
* ``SPECCHAOS_THINK_TIME_S``: wait after a successful request (default 0).
* ``SPECCHAOS_ERROR_BACKOFF_S``: wait after a failed one, so a dead server is not
  hammered in a tight loop (default 0.25; the larger of it and the think time is used).
* ``SPECCHAOS_SEED``: seed of the per-user prompt orders (default 1234).
* ``SPECCHAOS_IGNORE_EOS``: ``1``/``true`` to ask for ``ignore_eos`` (default off).
* ``SPECCHAOS_SAMPLING``: the sampling classes as a JSON list of
  :class:`harness.load.config.SamplingClass` (default: greedy only).
* ``SPECCHAOS_MIRROR_HOST``: the reference server's root URL for mirror mode (default:
  none, no mirror); ``SPECCHAOS_MIRROR_MODEL`` its served model name (default
  ``SPECCHAOS_MODEL``).
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
from dataclasses import dataclass
from pathlib import Path

import gevent
from locust import User, events, task
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner

from pydantic import TypeAdapter, ValidationError

from harness.errors import LoadError, first_error
from harness.load.client import check_loopback_url, make_client, stream_completion
from harness.load.config import GREEDY, SamplingClass
from harness.load.prompts import Prompt, load_prompt_set
from harness.load.records import RequestRecord, append_record

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
    sampling: tuple[SamplingClass, ...] = (GREEDY,)
    mirror_host: str | None = None
    mirror_model: str | None = None
    #: Distributed load (``load.workers``): this worker's index and the worker count
    #: (``worker_count == 0``: a single locust process, no master).
    worker_index: int = 0
    worker_count: int = 0


def _sampling(raw: str | None) -> tuple[SamplingClass, ...]:
    if not raw:
        return (GREEDY,)
    try:
        classes = TypeAdapter(list[SamplingClass]).validate_python(json.loads(raw))
    except ValueError as exc:   # json.JSONDecodeError and pydantic's ValidationError
        msg = first_error(exc)[1] if isinstance(exc, ValidationError) else str(exc)
        raise LoadError(f"SPECCHAOS_SAMPLING is not a list of sampling classes: {msg}",
                        where="harness/load/locustfile.py") from None
    if not classes:
        raise LoadError("SPECCHAOS_SAMPLING is empty", where="harness/load/locustfile.py")
    return tuple(classes)


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
        ignore_eos=env.get("SPECCHAOS_IGNORE_EOS", "").strip().lower() in ("1", "true", "yes", "on"),
        sampling=_sampling(env.get("SPECCHAOS_SAMPLING")),
        mirror_host=env.get("SPECCHAOS_MIRROR_HOST") or None,
        mirror_model=env.get("SPECCHAOS_MIRROR_MODEL") or None,
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


class StreamingCompletionUser(User):
    """One closed-loop client of the speculative server, and in mirror mode of the
    reference server too (see module doc)."""

    def __init__(self, environment) -> None:
        super().__init__(environment)
        self.user_id = global_user_id(next(_user_index))
        self.rng = random.Random(SETTINGS.seed + self.user_id)
        self.sampling_rng = random.Random(f"sampling:{SETTINGS.seed}:{self.user_id}")
        self._steps = 0
        self._order: list[Prompt] = []
        self._next_wait = SETTINGS.think_time_s
        self._client = None

    def wait_time(self) -> float:
        """Think time after a success, ``max(think, error backoff)`` after a failure."""
        return self._next_wait

    def on_start(self) -> None:
        check_loopback_url(self.host or "", where="locust --host")
        if SETTINGS.mirror_host:
            check_loopback_url(SETTINGS.mirror_host, where="SPECCHAOS_MIRROR_HOST")
        self._client = make_client(max_connections=2)

    def on_stop(self) -> None:
        if self._client is not None:
            self._client.close()

    def next_prompt(self) -> Prompt:
        """The next prompt of this user's seeded walk (a new shuffle per pass)."""
        if not self._order:
            self._order = list(SETTINGS.prompts)
            self.rng.shuffle(self._order)
            self._order.reverse()  # pop() from the end walks the shuffle in order
        return self._order.pop()

    def next_sampling(self) -> SamplingClass:
        """The next request's sampling class, drawn by weight from this user's seeded
        generator (no draw when there is only one class)."""
        classes = SETTINGS.sampling
        if len(classes) == 1:
            return classes[0]
        return self.sampling_rng.choices(classes, weights=[c.weight for c in classes])[0]

    def targets(self) -> list[tuple[str, str, str]]:
        """``(server, base URL, model)`` to send this step's request to, in order: the
        speculative server alone, or in mirror mode both, the first alternating per step
        (user ``i`` starts with the reference server when ``i`` is odd)."""
        spec = ("spec", self.host, SETTINGS.model)
        if not SETTINGS.mirror_host:
            return [spec]
        ref = ("ref", SETTINGS.mirror_host, SETTINGS.mirror_model or SETTINGS.model)
        return [spec, ref] if (self._steps + self.user_id) % 2 == 0 else [ref, spec]

    @task
    def complete(self) -> None:
        """Send one request (in mirror mode: the same one to both servers), record it,
        and choose the next wait."""
        global _sent
        prompt, sampling = self.next_prompt(), self.next_sampling()
        targets = self.targets()
        self._steps += 1
        all_ok = True
        for server, url, model in targets:
            if _stopping:
                raise StopUser()
            if _sent >= SETTINGS.max_requests:
                _quit(self.environment)
                raise StopUser()
            _sent += 1
            rec = stream_completion(
                self._client, url, model, prompt,
                timeout_s=SETTINGS.request_timeout_s, source="load", user_id=self.user_id,
                ignore_eos=SETTINGS.ignore_eos, on_interrupt=self._record, server=server, sampling=sampling,
            )
            self._record(rec)
            all_ok = all_ok and rec.ok
        self._next_wait = SETTINGS.think_time_s if all_ok else max(SETTINGS.think_time_s, SETTINGS.error_backoff_s)

    def _record(self, rec: RequestRecord) -> None:
        append_record(SETTINGS.records_path, rec)
        exc = None if rec.ok else RequestFailed(f"{rec.error}: {rec.error_detail}")
        self.environment.events.request.fire(
            request_type="POST",
            name=f"/v1/completions [{rec.prompt_class}]" + ("" if rec.server == "spec" else f" [{rec.server}]"),
            response_time=(rec.e2e_s or 0.0) * 1000.0,
            response_length=len(rec.text),
            response=None,
            context={"user_id": rec.user_id, "prompt_id": rec.prompt_id, "request_id": rec.request_id},
            exception=exc,
            start_time=rec.send_time,
            url=f"{self.host if rec.server == 'spec' else SETTINGS.mirror_host}/v1/completions",
        )


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
# (``load.workers``, issue 10: locust's own master/worker mode, all on loopback.)
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
