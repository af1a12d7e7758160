"""One fake vLLM server for every test where a real vLLM is not the point.

:mod:`tests.fakes.fake_vllm` is the server (a standalone script: api → ``VLLM::EngineCore``
→ ``VLLM::Worker``, streaming completions, ``/metrics``, parser scenarios, test hooks);
:mod:`tests.fakes.launch` runs it (:class:`FakeProcess`, :func:`run_fake`, :class:`FakeServer`,
:func:`http_client`); :mod:`tests.fakes.stack` registers launchers of whole fake stacks.
"""

from tests.fakes.launch import FAKE_PATH, VLLM_HEAD, FakeProcess, FakeServer, http_client, run_fake

__all__ = ["FAKE_PATH", "VLLM_HEAD", "FakeProcess", "FakeServer", "http_client", "run_fake"]
