"""The learner's memory is bounded by --max-words, not by the corpus (docs/guides/vocabulary-at-scale.md).

A synthetic corpus of 300,000 distinct words goes through labse-vocab's Beam counting step with
--max-words 3,000; the learner (load the counts + learn, what labse-vocab runs after Beam) runs in
a child process that reports its own peak RSS (VmHWM) after its imports and at the end.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from vocab.builder import run_counting
from vocab.config import VocabConfig

NUM_WORDS = 300_000
MAX_WORDS = 3_000
# The bound of the guide: fixed + bytes per kept word x kept words, with the measured ~1.2 KB a
# word (BENCHMARKS.md, "Vocabulary at any corpus size") rounded up to 2 KB, and 32 MB for what the
# learner allocates whatever its input (arrays sized by the vocabulary and the characters). Above
# the process after its imports (interpreter, numpy, Beam's file layer: ~195 MB).
# Measured here: +8.5 MB with --max-words 3,000; +338 MB with --max-words 0 (all 300,000 words).
BOUND_FIXED_MB = 32
BOUND_BYTES_PER_WORD = 2_000

LEARNER = r"""
import json, sys
def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
import apache_beam.io.filesystems, numpy, tqdm  # the fixed part: Beam's file layer reads the counts
from vocab.builder import weighted_counts
from vocab.learn import LearnerConfig, learn
before = peak_mb()
words, counts = weighted_counts(sys.argv[1], {"aa": 0.5, "bb": 1.5})
result = learn(words, counts, LearnerConfig(vocab_size=1000, char_min_count=1, progress=False))
print(json.dumps({"before_mb": before, "peak_mb": peak_mb(), "words": len(words), "vocab": len(result.vocab)}))
"""


def synthetic_corpus(folder, num_words: int, seed: int = 0) -> dict[str, str]:
    """Two languages (Latin and Cyrillic letters), `num_words` distinct words of 5-12 letters, the
    first thousand Zipf-frequent and every other one seen once or twice, 20 words a line."""
    rng = np.random.default_rng(seed)
    files = {}
    for lang, first in (("aa", 0x61), ("bb", 0x430)):
        letters = np.array([chr(first + i) for i in range(26)])
        words = {"".join(letters[rng.integers(0, 26, size=n)]) for n in rng.integers(5, 13, size=num_words // 2 + 2000)}
        words = sorted(words)[: num_words // 2]
        repeats = np.maximum(1, 2000 // np.arange(1, len(words) + 1)) + rng.integers(0, 2, size=len(words))
        stream = np.repeat(np.array(words, dtype=object), repeats)
        rng.shuffle(stream)
        path = folder / f"{lang}.txt"
        path.write_text("\n".join(" ".join(stream[i:i + 20]) for i in range(0, len(stream), 20)) + "\n", encoding="utf-8")
        files[lang] = str(path)
    return files


@pytest.mark.slow
def test_learner_peak_memory_is_bounded_by_max_words_not_by_the_corpus(tmp_path):
    files = synthetic_corpus(tmp_path, NUM_WORDS)
    work = tmp_path / "work"
    config = VocabConfig(vocab_size=1000, holdout_rate=0.0, max_words=MAX_WORDS)
    run_counting(str(work), sentences_dir=None, text_files=files, config=config)

    tally = json.loads((work / "tally.json").read_text())
    assert tally["word_types.read"] >= NUM_WORDS * 0.99  # the corpus really has that many words
    assert tally["word_types.kept"] <= MAX_WORDS
    assert tally["word_types.dropped.over_language_budget"] == tally["word_types.read"] - tally["word_types.kept"]
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in (work / "counts").glob("counts*.tsv"))
    assert lines == tally["word_types.kept"] + tally.get("folded_character_entries", 0)

    child = subprocess.run([sys.executable, "-c", LEARNER, str(work)], capture_output=True, text=True, check=True)
    measured = json.loads(child.stdout.strip().splitlines()[-1])
    assert measured["words"] == lines and measured["vocab"] == 1000
    grown_mb = measured["peak_mb"] - measured["before_mb"]
    bound_mb = BOUND_FIXED_MB + BOUND_BYTES_PER_WORD * MAX_WORDS / 2**20
    assert grown_mb <= bound_mb, f"the learner grew by {grown_mb:.0f} MB, over the bound {bound_mb:.0f} MB"
    assert bound_mb < NUM_WORDS * 1_000 / 2**20  # the corpus unpruned would not fit the bound
