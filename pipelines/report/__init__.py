"""`labse-report`: one self-contained HTML page with the books and curves of every stage of a run.

It reads only the files the stages write (their contracts: `_SUCCESS`, `stats.json`, Parquet columns,
`vocab.report.json`, `metrics.jsonl`, ...), never a stage's internals, so it can report a run made
on Dataflow from its bucket as well as the demo's folder.
"""
