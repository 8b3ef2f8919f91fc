# candle-web: `make demo` and `make test` each do their own set-up, idempotently.
# Set-up steps leave stamp files, so a second run skips straight to the work.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP_DEV := $(VENV)/.stamp-dev
STAMP_SYS := $(VENV)/.stamp-system
STAMP_BENCH := $(VENV)/.stamp-bench
# Debian packages: headless Chromium for the UI tests and Firefox ESR for their Firefox smoke
# suite (tests/ui_firefox), espeak-ng + sox to synthesise speech,
# ffmpeg to decode mp3/ogg natively when soundfile cannot, and the JDK and Mono that build and
# run the Java and C# API clients of examples/api/ in tests/api/test_api_clients.py.
APT_PACKAGES := chromium firefox-esr espeak-ng sox ffmpeg default-jdk-headless mono-mcs \
	mono-runtime libmono-system-net-http4.0-cil

export CANDLE_WEB_OFFLINE ?= 1

.PHONY: demo test setup system-deps node-deps models web bench fuzz clean-venv

# -- set-up -------------------------------------------------------------------------------
# torch must be the CPU build: install it first, pinned, so no other package pulls a CUDA one.
$(STAMP_DEV): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,native]'
	# openai-whisper is a test reference only; its declared deps pull triton, so skip them.
	$(PY) -m pip install -q --no-deps openai-whisper==20250625
	# silero-vad: the VAD test reference (its get_speech_timestamps on torch); its declared
	# deps add torchaudio, which the reference does not use.
	$(PY) -m pip install -q --no-deps silero-vad==6.2.3
	touch $@

$(STAMP_SYS): Makefile
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

$(STAMP_BENCH): $(STAMP_DEV) pyproject.toml
	$(PY) -m pip install -q -e '.[dev,native,bench]'
	touch $@

setup: $(STAMP_DEV)

system-deps: $(STAMP_SYS)

# npm's packages of package.json's dependencies: puppeteer-core, which drives firefox-esr over
# WebDriver BiDi in tests/ui_firefox (it never downloads a browser; PUPPETEER_SKIP_DOWNLOAD makes
# sure), Pyodide (vendored by `web`), @mlc-ai/web-xgrammar (the page's grammar engine, vendored by
# `web`), @vladmandic/face-api with @tensorflow/tfjs-backend-wasm (the Faces view's peer, and its
# weights and photos), and axe-core (the accessibility tests). `npm ci` only when
# package-lock.json changed since the last install (its sha256 is kept in node_modules), so the
# bench's dev packages, once installed, stay while the lock stays. Node and npm come from Debian
# (nodejs, npm) where neither is on the PATH.
node-deps: $(STAMP_SYS)
	@command -v node >/dev/null && command -v npm >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@want=$$(sha256sum package-lock.json | cut -d' ' -f1); \
	have=$$(cat node_modules/.candle-web-lock.sha256 2>/dev/null); \
	if [ "$$want" != "$$have" ]; then \
	  echo "installing npm packages (package-lock.json $${want:0:12})"; \
	  PUPPETEER_SKIP_DOWNLOAD=1 npm ci --omit=dev --ignore-scripts --no-audit --no-fund && \
	  echo "$$want" > node_modules/.candle-web-lock.sha256; \
	fi

# Model files and test data: fetched, sha256-checked, cached (never committed).
models: $(STAMP_DEV)
	@if [ -f models/fetch.py ]; then $(PY) models/fetch.py --default; fi
	@if [ -x scripts/fetch_test_audio.sh ]; then scripts/fetch_test_audio.sh; fi

# The browser runtime: Pyodide 0.27.7 (npm + verified wheels), the WebAssembly SIMD kernels
# (vendor_pyodide.py runs scripts/build_kernels.py first: web/kernels/ -> web/vendor/kernels*.wasm,
# cached by a hash of the sources, checked for stack use, imports, exports and data segments),
# the candle_web wheel with a manifest naming the kernels' sha256, and the start-up snapshot.
web: $(STAMP_DEV)
	$(PY) scripts/vendor_pyodide.py

# -- the two commands -----------------------------------------------------------------------
# One BLAS thread: results do not depend on it, but with pytest, Chromium and native twin
# subprocesses sharing 2 cores, OpenBLAS's spinning threads made small matmuls 10-30x slower.
test: export OPENBLAS_NUM_THREADS = 1
test: $(STAMP_DEV) $(STAMP_SYS) node-deps models web
	$(PY) -m pytest -q

# The demo: the browser page first (its URL under a second after the set-up checks), then in
# the background, with "[demo <step>]" lines in this terminal, the optional first-run work: the
# numba kernel warm-up, a native transcription of a bundled LibriVox clip (printed: the proof
# that the native twin works), a short native generation (both also compile the numba decode
# steps into the kernel cache: a first `candle-web generate` measured 32 s with a cold cache,
# 5.6 s warm), and, when it is not in the cache yet, the Text-to-text view's offline default (a
# small T5 trained here by candle-web's own autograd, as no real T5 can be fetched offline: 35 s
# once on idle cores, minutes on busy ones; the view shows its progress and offers it when
# done). Ctrl-C stops it all (scripts/demo.py).
DEMO_PORT ?= 8000
demo: $(STAMP_DEV) models web
	$(PY) scripts/demo.py --port $(DEMO_PORT)

# Side-by-side benchmarks, one process per workload; the GPU one only where CUDA is present.
# llama.cpp's llama-bench is built once from sources on PyPI (20-40 min the first time); when
# that fails, bench/llama.py leaves the llama.cpp column empty and says why.
# The transformers.js peer of bench/browser.py: the bench extra (onnx, onnxruntime) and the ONNX
# export of the registry's weights (cached in the model cache; ~1 min once, instant after);
# bench/browser.py npm-installs transformers.js (package.json's devDependencies) when missing.
bench: $(STAMP_DEV) $(STAMP_BENCH) models web
	-PYTHON=$(PY) scripts/build_llama_cpp.sh
	-$(PY) scripts/export_onnx.py --q8
	$(PY) bench/run_all.py

# Every file parser fuzzed with mutated real files for FUZZ_SECONDS each (tests/fuzz/harness.py;
# `make test` runs a short fixed-seed pass). Exits non-zero on any untyped exception, hang,
# allocation beyond the 2 GiB cap or crash; inputs are saved in tests/fuzz/findings/ (git-ignored)
# with the command that replays each.
FUZZ_SECONDS ?= 60
fuzz: export OPENBLAS_NUM_THREADS = 1
fuzz: $(STAMP_DEV) models
	$(PY) tests/fuzz/harness.py --seconds $(FUZZ_SECONDS)

clean-venv:
	rm -rf $(VENV)
