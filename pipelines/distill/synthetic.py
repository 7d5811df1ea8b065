"""Synthetic sentences from a language's own text, for the alignment step (labse-distill
`--synthetic-per-language`).

Where a language has little text (UDHR gives ~90 sentences), the table sees each of its tokens in
few contexts. Short recombinations of the same text, each embedded by the teacher, give the
alignment many more targets: windows of consecutive words (clauses, the length of a short
sentence) and chains drawn from the text's word bigrams. Scripts written without spaces (Thai,
Chinese, Japanese) get windows of characters. Pure Python and deterministic: the same texts and
seed give the same sentences on every runner.
"""
from __future__ import annotations

import random
from typing import Sequence

MIN_WORDS, MAX_WORDS = 3, 14
MIN_CHARS, MAX_CHARS = 5, 40
TRIES_PER_SENTENCE = 20  # a text too small to give `n` distinct sentences stops after this many draws each


def written_with_spaces(texts: Sequence[str]) -> bool:
    """True when the texts read as words between spaces (most lines hold several words of a usual
    length), False for scripts written without them, whose 'words' are whole clauses."""
    words = [len(word) for text in texts for word in text.split()]
    return bool(words) and len(words) >= 3 * len(texts) and sum(words) / len(words) < 12


def synthetic_sentences(texts: Sequence[str], n: int, seed: int = 0) -> list[str]:
    """Up to `n` distinct synthetic sentences drawn from `texts` (sorted; fewer when the texts are
    too small to give `n`): half windows of 3-14 consecutive words, half word-bigram chains of that
    length; character windows of 5-40 for scripts without spaces."""
    texts = sorted({" ".join(text.split()) for text in texts if text and text.strip()})
    if n <= 0 or not texts:
        return []
    rng = random.Random(f"{seed}:{len(texts)}:{texts[0]}")
    found: set[str] = set()
    if not written_with_spaces(texts):
        long_enough = [text for text in texts if len(text) >= MIN_CHARS]
        for _ in range(TRIES_PER_SENTENCE * n):
            if len(found) >= n or not long_enough:
                break
            text = rng.choice(long_enough)
            size = rng.randint(MIN_CHARS, min(MAX_CHARS, len(text)))
            start = rng.randint(0, len(text) - size)
            window = text[start:start + size].strip()
            if window:
                found.add(window)
        return sorted(found)
    lines = [text.split() for text in texts]
    every_word = [word for words in lines for word in words]
    following: dict[str, list[str]] = {}
    for words in lines:
        for left, right in zip(words, words[1:]):
            following.setdefault(left, []).append(right)
    for _ in range(TRIES_PER_SENTENCE * n):
        if len(found) >= n:
            break
        size = rng.randint(MIN_WORDS, MAX_WORDS)
        if rng.random() < 0.5:
            words = rng.choice(lines)
            if len(words) < MIN_WORDS:
                continue
            size = min(size, len(words))
            start = rng.randint(0, len(words) - size)
            found.add(" ".join(words[start:start + size]))
        else:
            chain = [rng.choice(every_word)]
            while len(chain) < size and chain[-1] in following:
                chain.append(rng.choice(following[chain[-1]]))
            if len(chain) >= MIN_WORDS:
                found.add(" ".join(chain))
    return sorted(found)
