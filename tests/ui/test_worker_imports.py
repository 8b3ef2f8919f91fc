"""The worker's import system after its start (web/worker/boot.js, PIN_RUNTIME_ARCHIVES): the
runtime's stdlib archive keeps its listing when importlib.invalidate_caches() runs (that
re-read cost 0.2-0.3 s of every start, issue 22), while what invalidate_caches() is for still
holds: a module written into site-packages after the start, and a zip archive put on sys.path
and then rewritten, are seen at the next import.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.ui


def run_in_worker(page, source: str):
    """The value of the last expression of `source`, run in the page's worker."""
    workers = [w for w in page.workers if w.url.endswith("/worker.js")]
    assert len(workers) == 1, [w.url for w in page.workers]
    return workers[0].evaluate("(source) => pyodide.runPython(source)", source)


def test_the_stdlib_archive_keeps_its_listing(ready_page):
    kept = run_in_worker(ready_page, """
import importlib, sys, zipimport
stdlib = [f for f in sys.path_importer_cache.values() if isinstance(f, zipimport.zipimporter)]
before = [id(f._files) for f in stdlib]
importlib.invalidate_caches()
# a re-read would give each importer a new listing dict
f"{len(stdlib)} {[id(f._files) for f in stdlib] == before}"
""")
    count, same = kept.split()
    assert int(count) >= 1, "no zip archive importer on sys.path (the stdlib is not zipped?)"
    assert same == "True"


def test_new_site_packages_module_and_rewritten_zip_are_seen(ready_page):
    seen = run_in_worker(ready_page, """
import importlib, os, site, sys, zipfile
packages = site.getsitepackages()[0]
with open(os.path.join(packages, "cw_late_module.py"), "w") as handle:
    handle.write("VALUE = 11\\n")
archive = "/tmp/cw_late_archive.zip"
with zipfile.ZipFile(archive, "w") as zipped:
    zipped.writestr("cw_zipped_one.py", "VALUE = 1\\n")
sys.path.append(archive)
import cw_zipped_one
with zipfile.ZipFile(archive, "w") as zipped:
    zipped.writestr("cw_zipped_one.py", "VALUE = 1\\n")
    zipped.writestr("cw_zipped_two.py", "VALUE = 2\\n")
importlib.invalidate_caches()
import cw_late_module, cw_zipped_two
sys.path.remove(archive)
f"{cw_late_module.VALUE} {cw_zipped_one.VALUE} {cw_zipped_two.VALUE}"
""")
    assert seen == "11 1 2"
