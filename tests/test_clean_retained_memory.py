"""The cleaning DoFn keeps nothing per document from one bundle to the next (issue 23 item 2).

The scale table's DirectRunner workers grew with the input (0.29 GB + ~40 KB a document); the
cause is the runner, which hands a worker its whole share of a grouped PCollection at once
(BENCHMARKS.md, "Why the DirectRunner's workers grow with the input"), not state kept by our
DoFn. This pins our half: after a warm-up bundle, more bundles of the same documents leave
Python's traced heap where it was (measured in-process with tracemalloc, no timing). A DoFn that
kept anything per document or per output row across bundles (a seen-set, a list of rows, pending
documents never cleared) grows by a share of the documents' text per bundle and fails.
"""
from __future__ import annotations

import tracemalloc

from conftest import require_file
from pipelines.clean.config import CleanConfig
from pipelines.clean.transforms import _CleanDocumentsFn
from pipelines.io.documents import Document
from pipelines.read.readers import read_records

MORE_BUNDLES = 3


def _run_bundle(fn: _CleanDocumentsFn, documents: list) -> int:
    fn.start_bundle()
    outputs = sum(1 for document in documents for _ in fn.process(document))
    return outputs + sum(1 for _ in fn.finish_bundle())


def test_clean_fn_retains_nothing_across_bundles(labse_data):
    warc = require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz")
    documents = list(read_records(str(warc), "warc"))
    text_bytes = sum(len(d.body) for d in documents if isinstance(d, Document))
    fn = _CleanDocumentsFn(CleanConfig())
    fn.setup()
    outputs = _run_bundle(fn, documents)  # warm-up: first-use caches (regexes, lid) are not growth
    assert outputs > 100, "the sample must give sentences, or the test proves nothing"

    tracemalloc.start()
    try:
        _run_bundle(fn, documents)
        after_one, _ = tracemalloc.get_traced_memory()
        for _ in range(MORE_BUNDLES):
            _run_bundle(fn, documents)
        grown = tracemalloc.get_traced_memory()[0] - after_one
    finally:
        tracemalloc.stop()
    # Measured: ~5 KB (counters, tracemalloc's own records) for 3 bundles of this sample's 16
    # pages (471,175 characters); keeping each bundle's output rows adds ~417 KB. Allowed: 5% of
    # the pages' text for the three bundles together.
    assert grown < 0.05 * text_bytes, (
        f"{grown:,} bytes retained over {MORE_BUNDLES} bundles of {len(documents)} records "
        f"({text_bytes:,} characters of HTML)")
