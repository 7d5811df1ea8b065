"""labse-mine's two sides and the names its counts go by (README contract 11), shared by the cells,
the text-keyed global path and the packed global path, so that each writes the same `_stats.json`."""

SRC, TGT = "s", "t"  # how an item names its side
SIDE_UNIT = {SRC: "src_sentences", TGT: "tgt_sentences"}
CANDIDATES = "candidate_pairs"
FILES = "input_files"

# why a sentence is dropped
EMPTY_TEXT = "empty_text"
DUPLICATE = "duplicate"
NON_FINITE_VECTOR = "non_finite_vector"
SPARED = "spared_by_cascade"
