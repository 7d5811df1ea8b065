"""Multilingual cased WordPiece vocabulary: pre-tokenisation, Beam counting, smoothing, learning,
tokenizers and a coverage report. `vocab.build(output, sentences_dir=..., text_files=..., config=...)`
runs it all (the same as `labse-vocab`); `pipelines.text.wordpiece` imports TensorFlow or transformers
only when its TF Text or HF tokenizer is built, and never Beam.
"""
from __future__ import annotations


def build(output, **kwargs):
    """Count words with Beam, smooth, learn and report; see `vocab.builder.build` (Args, example)."""
    from vocab.builder import build as _build

    return _build(output, **kwargs)


__all__ = ["build"]
