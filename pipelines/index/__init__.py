"""labse-index: one compressed FAISS index per language, sharded, built from saved vectors."""
