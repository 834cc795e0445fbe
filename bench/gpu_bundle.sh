#!/usr/bin/env bash
# TVM's runtime only, for a GPU host that has Python but no TVM and no network (bench/gpu_check.sh):
# downloads the apache-tvm and apache-tvm-ffi wheels for that host's Python, unpacks them into
# .tvmrt/site and drops what a measuring worker never loads (the 248 MB compiler library, headers,
# vendored sources): about 22 MB. Then on the GPU host:
#   PYTHON=python3 PYTHONPATH=$PWD/.tvmrt/site bash bench/gpu_check.sh
#
#   bench/gpu_bundle.sh [PYTHON_VERSION]      # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
PYV="${1:-3.12}"
TVM_VERSION=0.27.0.post1        # as pyproject.toml pins them
FFI_VERSION=0.1.14.post1
DEST=.tvmrt
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" \
  "apache-tvm==$TVM_VERSION" "apache-tvm-ffi==$FFI_VERSION"
rm -rf "$DEST/site"
mkdir -p "$DEST/site"
for w in "$WHEELS"/*.whl; do (cd "$DEST/site" && python3 -m zipfile -e "$w" .); done
rm -rf "$DEST/site/tvm/lib/libtvm_compiler.so" "$DEST/site/tvm/3rdparty" "$DEST/site/tvm/src" \
       "$DEST/site/tvm/include" "$DEST/site/tvm_ffi/3rdparty" "$DEST/site/tvm_ffi/src" "$DEST/site/tvm_ffi/include"
grep -qx '/.tvmrt/' .git/info/exclude 2>/dev/null || echo '/.tvmrt/' >> .git/info/exclude
echo "gpu_bundle: TVM $TVM_VERSION runtime for Python $PYV in $DEST/site ($(du -sh "$DEST/site" | cut -f1))"
