"""Tiny fake distributions for running ``ci/bootstrap.sh`` offline in seconds.

:func:`write_wheel` writes a pure-Python wheel (``name-version-py3-none-any.whl``) from a dict
of files; a directory of them serves as pip's ``--find-links`` with ``--no-index``.

The module is also a PEP 517/660 build backend (``build-backend = "fake_dists"``, copied into
a fake project's ``backend-path``): ``build_editable`` links the project's directory through a
``.pth`` file and ``build_wheel`` packs the project's top-level packages, the metadata coming
from ``fake_project.json`` in the project root (``{"name", "version", "requires": [...]}``,
requirement strings with ``extra == '...'`` markers). Standard library only: the backend runs
in the virtualenv being set up, which holds nothing else yet."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path


def write_wheel(directory: Path | str, name: str, version: str, files: dict[str, str],
                requires: list[str] = (), extras: list[str] = ()) -> str:
    """Write ``name-version-py3-none-any.whl`` into ``directory``; return its file name.

    ``files`` maps paths inside the wheel (``pkg/__init__.py``) to their text; ``requires``
    are ``Requires-Dist`` strings; ``extras`` the ``Provides-Extra`` names."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Provides-Extra: {e}\n" for e in extras), *(f"Requires-Dist: {r}\n" for r in requires)])
    content = dict(files)
    content[f"{info}/METADATA"] = meta
    content[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: fake_dists\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in content.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}\n")
    content[f"{info}/RECORD"] = "".join(record) + f"{info}/RECORD,,\n"
    wheel = f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(Path(directory) / wheel, "w") as zf:
        for path, text in content.items():
            zf.writestr(path, text)
    return wheel


def _project() -> dict:
    return json.loads(Path("fake_project.json").read_text())


def _extras(requires: list[str]) -> list[str]:
    return sorted({r.split("extra == '")[1].split("'")[0] for r in requires if "extra == '" in r})


def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    return []


get_requires_for_build_editable = get_requires_for_build_wheel


def build_editable(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    p = _project()
    return write_wheel(wheel_directory, p["name"], p["version"], {f"_{p['name']}_editable.pth": str(Path.cwd()) + "\n"},
                       p["requires"], _extras(p["requires"]))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    p = _project()
    files = {str(f): f.read_text() for f in Path(".").glob("*/*.py") if f.parent.name not in ("ci", "_build")}
    return write_wheel(wheel_directory, p["name"], p["version"], files, p["requires"], _extras(p["requires"]))
