"""The distribution a maintainer would sign: built from this tree, then read.

The wheel and the sdist are built by the build backend pyproject.toml names (in a fresh
virtual environment, from a copy of the tree, so the checkout gets no build/ or egg-info).
Installing that backend needs the package index, as any build does.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from email.parser import Parser
from pathlib import Path, PurePosixPath

import pytest

import streamrecover

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "artifacts",
    "__pycache__",
    "*.egg-info",
    "build",
    "dist",
    "db",
    "staticfiles",
    ".*_cache",
    "*.sqlite3",
)
# [text](target): a link that is not a URL or an anchor.
RELATIVE_LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s#]+)(?:#[^)]*)?\)")


def test_the_version_is_written_once() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project
    assert "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "streamrecover.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", streamrecover.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{streamrecover.__version__}]" in changelog


def test_license_file_matches_the_declared_license() -> None:
    assert PYPROJECT["project"]["license"] == "MIT"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("dist")
    src, out, env = base / "src", base / "out", base / "venv"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    requires = PYPROJECT["build-system"]["requires"]
    subprocess.run([python, "-m", "pip", "install", "-q", *requires], check=True, timeout=300)
    # build_meta rewrites sys.argv: read the output folder before the first build.
    build = "import sys; from setuptools import build_meta as b; o = sys.argv[1]; b.build_sdist(o); b.build_wheel(o)"
    subprocess.run([python, "-c", build, str(out)], cwd=src, check=True, capture_output=True, timeout=300)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def test_the_wheel(dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = set(wheel.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
    for needed in (
        "streamrecover/py.typed",
        "streamrecover/migrations/0001_initial.py",
        "streamrecover/templates/streamrecover/analytics.html",
        "streamrecover/static/streamrecover/client.js",
        f"{info}/licenses/LICENSE",
    ):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "project/", "bench/", "docs/"))]
    assert sorted(n for n in names if n.startswith("streamrecover/migrations/") and n.endswith(".py")) == [
        "streamrecover/migrations/0001_initial.py",
        "streamrecover/migrations/__init__.py",
    ]
    assert metadata["Name"] == "django-streamrecover"
    assert metadata["Version"] == streamrecover.__version__
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("Classifier") == PYPROJECT["project"]["classifiers"]
    assert "Typing :: Typed" in metadata.get_all("Classifier")


def test_the_package_page_carries_every_document(dist: dict[str, Path]) -> None:
    """The index shows the long description only: the README's links into docs/ do not
    resolve there, so every document follows the README on the page."""
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        info = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(info).decode())
    page = metadata.get_payload()
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert page.startswith((ROOT / "README.md").read_text().splitlines()[0])
    documents = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "CHANGELOG.md"]
    assert len(documents) >= 10
    for document in documents:
        heading = next(line for line in document.read_text().splitlines() if line.startswith("# "))
        assert f"\n{heading}\n" in page, f"{document.name} is missing from the package page"
    # The project's addresses are that page: they hold the docs and the changelog.
    urls = dict(entry.split(", ", 1) for entry in metadata.get_all("Project-URL"))
    assert set(urls) == {"Documentation", "Changelog"}
    assert set(urls.values()) == {f"https://pypi.org/project/{metadata['Name']}/"}


def test_the_sdist_holds_everything_the_readme_links_to(dist: dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        files = {PurePosixPath(n).relative_to(top) for n in sdist.getnames() if n.count("/")}
    for needed in ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "streamrecover/py.typed"):
        assert PurePosixPath(needed) in files, needed
    linking = [PurePosixPath("README.md"), *(f for f in files if f.parts[0] == "docs" and f.suffix == ".md")]
    checked = 0
    for document in linking:
        for target in RELATIVE_LINK.findall((ROOT / document).read_text(encoding="utf-8")):
            resolved = PurePosixPath(*_normalise(document.parent / target))
            assert resolved in files, f"{document} links to {target}, which the sdist lacks"
            checked += 1
    assert checked >= 5  # the README links to docs/ and bench/


def _normalise(path: PurePosixPath) -> list[str]:
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            parts.pop()
        elif part != ".":
            parts.append(part)
    return parts


def test_the_running_python_is_the_one_the_classifiers_name() -> None:
    version = f"Programming Language :: Python :: {sys.version_info.major}.{sys.version_info.minor}"
    assert version in PYPROJECT["project"]["classifiers"]
