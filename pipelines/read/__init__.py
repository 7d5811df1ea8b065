"""Readers: WARC/WET (FastWARC and gzip members), Wikipedia XML dumps, payload decoding, the Beam read step.
Above `pipelines.text` (they may use it; it never uses them)."""
