"""A stand-in for a vLLM server's process tree, for fault tests (no vLLM needed).

    python proctree.py api [flags...]

starts ``api`` → child titled ``VLLM::EngineCore`` → child titled ``VLLM::Worker``
(titles set with setproctitle, as vLLM does). A parent exits when its child dies, so
killing the worker ends the whole tree, as with a real vLLM server.

Flags: ``ignore-term`` (the worker ignores SIGTERM), ``ignore-term-all`` (every
process does), ``orphanable`` (children do not die with their parent; by default
each child gets PR_SET_PDEATHSIG=SIGKILL so nothing outlives a test).
"""

import ctypes
import signal
import subprocess
import sys
import time

from setproctitle import setproctitle

TITLES = {"api": "specchaos-test-api-server", "engine": "VLLM::EngineCore", "worker": "VLLM::Worker"}
CHILD = {"api": "engine", "engine": "worker"}


def main() -> None:
    role, flags = sys.argv[1], set(sys.argv[2:])
    if "orphanable" not in flags:  # the api dies with the thread that started it
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if "ignore-term-all" in flags or (role == "worker" and "ignore-term" in flags):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    setproctitle(TITLES[role])
    if role in CHILD:
        child = subprocess.Popen([sys.executable, __file__, CHILD[role], *flags])
        child.wait()
        sys.exit(1)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
