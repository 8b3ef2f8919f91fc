"""candle-web's tests, one package laid out like the source tree.

- tests/<area>/ follows pkg/candle_web/<area> (core, backend, nn, io, quantized, tokenizers,
  models, generation, pipelines, api, serve, batch, worker, hub, cli); tests/native/ follows
  native/candle_native, tests/kernels/ web/kernels, tests/ui/ the page in Chromium. The rest
  test what is not a package module: docs/ (the README's commands), examples/, fuzz/ (make fuzz),
  bench/ (bench-side scripts), reference/ (the recorded reference outputs).
- A helper module shared by tests is named `*_testlib.py` and imported by its full name,
  `from tests.<area>.<name>_testlib import ...`; pytest puts the repository root on sys.path
  (rootdir conftest, `__init__.py` in every folder). Tests never import another test module.
- Programs run as files are named for what they do: reference/record_*.py (record the
  references), ui/native_*.py (the native twin of a page job), fuzz/harness.py and its child
  fuzz/fuzz_worker.py. Each puts the repository root on sys.path itself.
"""
