"""Which counted words reach the learner: a budget of `max_words` split over languages.

The learner holds every word it is given (about 1 KB a word at 500,000 tokens, BENCHMARKS.md), so
the counting step passes it at most `max_words` distinct words whatever the corpus size. The budget
is shared by the languages' smoothed shares p_l (`vocab.smoothing`, the weights the learner uses):
under Zipf's law a word of rank r in language l has a weighted count near p_l / r, so the global top
`max_words` by weighted count is close to each language's top p_l x `max_words` by raw count -- and
this needs no global ranking on one worker, only a top-K per language. A language with fewer
distinct words than its share keeps them all and the rest of its share goes to the others
(water-filling), so a small corpus is never pruned.

Within a language words are ranked by count, ties by the word (code point order), so the kept set
does not depend on the order a runner delivers them in: the vocabulary stays deterministic.

The learner makes a character a token when its count over all words reaches `--char-min-count`; a
character seen only in pruned words (rare scripts, names) would otherwise turn into [UNK]. So the
characters of the pruned words are folded back as one-character entries carrying their counts
(`fold_pruned_characters`): the learner's character counts are exactly the unpruned ones, for at
most one extra entry per distinct character. Pure Python: `vocab.count.PruneWords` wires it into Beam.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping

from vocab.smoothing import smoothed_shares

# TF Text's generate_vocab keeps 5 million words (`max_input_tokens`), 10x LaBSE's 501,153 tokens.
DEFAULT_MAX_WORDS = 5_000_000
PRUNE_REASON = "over_language_budget"


def language_budgets(sizes: Mapping[str, tuple[int, int]], alpha: float, max_words: int) -> dict[str, int]:
    """{lang: (word occurrences, distinct words)} -> {lang: distinct words it may keep}.

    The budgets sum to at most `max_words`: each language gets floor(rest x its share of the
    languages still open); one whose distinct words fit in that keeps them all and leaves the
    difference to the others. `max_words` 0 means no limit.
    """
    distinct = {lang: int(size[1]) for lang, size in sizes.items()}
    if max_words <= 0:
        return dict(distinct)
    shares = smoothed_shares({lang: size[0] for lang, size in sizes.items()}, alpha) if sizes else {}
    budgets = {lang: 0 for lang in distinct}
    open_langs = sorted(lang for lang in distinct if lang in shares)
    rest = max_words
    while open_langs:
        norm = sum(shares[lang] for lang in open_langs)
        allotment = {lang: int(rest * shares[lang] / norm) for lang in open_langs}
        small = [lang for lang in open_langs if distinct[lang] <= allotment[lang]]
        if not small:
            budgets.update(allotment)
            break
        for lang in small:
            budgets[lang] = distinct[lang]
            rest -= distinct[lang]
        open_langs = [lang for lang in open_langs if lang not in small]
    return budgets


def rank_key(entry: tuple[int, str]) -> tuple[int, str]:
    """(count, word) -> a key whose smallest values are the words to keep: most frequent first,
    then by the word, so a tie at the cut is decided the same way in every run."""
    count, word = entry
    return -count, word


def keep_top(entries: Iterable[tuple[int, str]], budget: int) -> list[tuple[int, str]]:
    """The `budget` best (count, word) entries of one language by `rank_key`, best first."""
    return sorted(entries, key=rank_key)[: max(0, budget)]


def word_characters(entry: tuple[int, str]) -> Counter:
    """(count, word) -> each character's count in it: count x its occurrences in the word."""
    count, word = entry
    return Counter({char: count * times for char, times in Counter(word).items()})


def fold_pruned_characters(kept: list[tuple[int, str]], all_characters: Mapping[str, int]) -> list[tuple[int, str]]:
    """`kept` plus, for every character whose count over all words (`all_characters`) exceeds its
    count in the kept words, that difference as a one-character entry (added to the one-character
    word if it is kept). The result has each word once; in `rank_key` order."""
    in_kept: Counter = Counter()
    for entry in kept:
        in_kept.update(word_characters(entry))
    merged = {word: count for count, word in kept}
    for char, total in all_characters.items():
        missing = total - in_kept.get(char, 0)
        if missing > 0:
            merged[char] = merged.get(char, 0) + missing
    return sorted(((count, word) for word, count in merged.items()), key=rank_key)


def prune_tally(lang: str, kept: list[tuple[int, str]], size: tuple[int, int]) -> dict[str, int]:
    """The accounting of one language's pruning: unit `word_types` (distinct (language, word)
    pairs) read/kept/dropped, and per language the distinct words and occurrences dropped."""
    occurrences, distinct = size
    kept_occurrences = sum(count for count, _ in kept)
    tally = {
        "word_types.read": distinct,
        "word_types.kept": len(kept),
        f"word_types.dropped.{PRUNE_REASON}": distinct - len(kept),
        f"pruned_types.{lang}": distinct - len(kept),
        f"pruned_words.{lang}": occurrences - kept_occurrences,
    }
    return {key: value for key, value in tally.items() if value}
