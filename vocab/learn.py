"""WordPiece vocabulary learner: TF Text's top-down algorithm, vectorised with numpy.

TF Text's `learn()` (the BERT/LaBSE tool) works like this for a count threshold t:
  iteration 0: every suffix of every word, starting at any position, is a candidate token
      (`##`-prefixed unless it starts the word); its count is the summed count of the words
      that end with it there. Candidates with count >= t, plus every character alone and as
      `##c`, form the vocabulary.
  iterations 1..3: segment every word greedily (longest match first, as the tokenizer does) with
      the current vocabulary; the candidates are the suffixes that start at a piece boundary.
  Binary search on t until the size is within 5% below the target.
(Its prefix-decrement step is unconditional, so the count of a candidate is exactly the count of
the suffix at a start position; tests/test_vocab_learn.py checks our result against `learn()`.)

Here the same steps run on arrays: words are one flat array of code points; every substring is a
64-bit polynomial hash computed from prefix hashes (position-independent, so `##ing` in different
words is the same key); candidate counts are one `np.bincount`; greedy segmentation advances all
words at once, trying match lengths from long to short with `np.searchsorted` in the sorted
vocabulary keys. Instead of a blind binary search, the threshold is found with a few secant steps
on log(t), and the vocabulary is then cut to exactly the requested size by count.

Differences from `learn()`, on purpose:
  - characters: every character whose (weighted) count reaches `char_min_count` is in the
    vocabulary alone and as `##c`, instead of only the 1,000 most frequent characters (which
    would turn most CJK text into [UNK]); words with rarer characters are not learned from.
  - exact size: the result has exactly `vocab_size` entries (TF: up to 5% fewer).
  - counts may be real numbers (language-weighted counts).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from pipelines.text.wordpiece import SPECIAL_TOKENS, SUFFIX

logger = logging.getLogger(__name__)

_BASE = np.uint64(0x100000001B3)  # odd, so invertible modulo 2**64
_SUFFIX_FLAG = np.uint64(0x9E3779B97F4A7C15)


# The longest substring the learner hashes (its table of powers): longer words are never learned from.
MAX_TOKEN_LENGTH = 256


@dataclass
class LearnerConfig:
    vocab_size: int = 500_000
    num_unused: int = 0
    # A character enters the vocabulary (alone and as ##c) when its weighted count reaches this.
    char_min_count: float = 5.0
    # Words longer than this are not learned from (TF Text's default); they are still tokenised.
    max_token_length: int = 50
    num_iterations: int = 4
    # The threshold search stops when the learned tokens exceed the need by at most this share,
    # then the lowest-count tokens are cut, so the size is exact.
    search_slack: float = 0.05
    max_search_steps: int = 16
    progress: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.max_token_length <= MAX_TOKEN_LENGTH:
            raise ValueError(f"max_token_length must be in [1, {MAX_TOKEN_LENGTH}] (the learner's limit), "
                             f"got {self.max_token_length}")


@dataclass
class LearnResult:
    vocab: list[str]
    threshold: float
    num_chars: int
    num_words_in: int
    num_words_used: int
    search: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        return {
            "vocab_size": len(self.vocab),
            "threshold": self.threshold,
            "num_chars": self.num_chars,
            "num_words_in": self.num_words_in,
            "num_words_used": self.num_words_used,
            "search": self.search,
            "seconds": round(self.seconds, 2),
        }


class VocabSizeError(ValueError):
    """The data cannot support the requested vocabulary size."""


def _mix(keys: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads the polynomial hash's structure over all bits."""
    keys = keys ^ (keys >> np.uint64(30))
    keys = keys * np.uint64(0xBF58476D1CE4E5B9)
    keys = keys ^ (keys >> np.uint64(27))
    keys = keys * np.uint64(0x94D049BB133111EB)
    return keys ^ (keys >> np.uint64(31))


def _encode(words: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    codes = np.frombuffer("".join(words).encode("utf-32-le"), dtype=np.uint32)
    return codes, lengths


class _Corpus:
    """Words as flat code points with prefix hashes, and every word suffix as a candidate id."""

    def __init__(self, words: Sequence[str], counts: np.ndarray, codes: np.ndarray, lengths: np.ndarray):
        self.words = words
        self.counts = counts.astype(np.float64)
        self.codes = codes
        self.lengths = lengths
        n_pos = int(lengths.sum())
        self.word_start = np.zeros(len(words), dtype=np.int64)
        np.cumsum(lengths[:-1], out=self.word_start[1:])
        self.word_end = self.word_start + lengths
        self.pos_word = np.repeat(np.arange(len(words), dtype=np.int32), lengths)

        with np.errstate(over="ignore"):
            # G[k] = sum_{i<k} c_i B^(k-1-i) mod 2^64, via B^(k-1) * cumsum(c_i B^-i).
            inv = np.uint64(pow(int(_BASE), -1, 2**64))
            inv_pow = np.full(n_pos, inv, dtype=np.uint64)
            inv_pow[0] = np.uint64(1)
            np.cumprod(inv_pow, out=inv_pow)  # B^-i
            partial = np.cumsum(codes.astype(np.uint64) * inv_pow, dtype=np.uint64)
            del inv_pow
            base_pow = np.full(n_pos + 1, _BASE, dtype=np.uint64)
            base_pow[0] = np.uint64(1)
            np.cumprod(base_pow, out=base_pow)  # B^k
            self.prefix = np.zeros(n_pos + 1, dtype=np.uint64)
            self.prefix[1:] = base_pow[:-1] * partial
            del partial
            self.base_pow = base_pow[: MAX_TOKEN_LENGTH + 1].copy()  # substring lengths are short
            del base_pow

        # Every suffix (word[p:] for every position p) is a candidate token.
        positions = np.arange(n_pos, dtype=np.int64)
        suffix_keys = self.keys(positions, self.word_end[self.pos_word])
        unique_keys, first, self.suffix_id = np.unique(suffix_keys, return_index=True, return_inverse=True)
        del suffix_keys
        self.candidate_keys = unique_keys
        self.candidate_pos = first  # one position where the candidate occurs
        self.suffix_id = self.suffix_id.astype(np.int32)
        self.num_candidates = len(unique_keys)

    def keys(self, start: np.ndarray, end: np.ndarray, continuation: np.ndarray | None = None) -> np.ndarray:
        """Key of the substring [start, end) of the flat buffer, `##` if it does not start a word."""
        with np.errstate(over="ignore"):
            length = end - start
            raw = self.prefix[end] - self.prefix[start] * self.base_pow[length]
            raw = raw + length.astype(np.uint64) * np.uint64(0x2545F4914F6CDD1D)
            mixed = _mix(raw)
            if continuation is None:
                continuation = start != self.word_start[self.pos_word[start]]
            return np.where(continuation, mixed ^ _SUFFIX_FLAG, mixed)

    def candidate_length(self, candidates: np.ndarray) -> np.ndarray:
        pos = self.candidate_pos[candidates]
        return self.word_end[self.pos_word[pos]] - pos

    def candidate_token(self, candidate: int) -> str:
        pos = int(self.candidate_pos[candidate])
        word = int(self.pos_word[pos])
        offset = pos - int(self.word_start[word])
        text = self.words[word][offset:]
        return SUFFIX + text if offset else text

    def count_suffixes(self, piece_starts: np.ndarray) -> np.ndarray:
        return np.bincount(
            self.suffix_id[piece_starts],
            weights=self.counts[self.pos_word[piece_starts]],
            minlength=self.num_candidates,
        )

    def segment(self, vocab: "_KeySet", max_len: int) -> np.ndarray:
        """Flat start positions of the greedy longest-match pieces of every word."""
        starts = [self.word_start]
        pos = self.word_start.copy()
        end = self.word_end.copy()
        word_start = self.word_start.copy()
        while pos.size:
            continuation = pos != word_start
            length = np.minimum(end - pos, max_len)
            match = np.zeros(pos.size, dtype=np.int64)
            todo = np.arange(pos.size)
            while todo.size:  # every word tries its longest possible piece, then shorter ones
                at = pos[todo]
                hit = vocab.contains(self.keys(at, at + length[todo], continuation[todo]))
                match[todo[hit]] = length[todo[hit]]
                todo = todo[~hit]
                length[todo] -= 1
                if todo.size and not length[todo].all():
                    raise AssertionError("a word could not be segmented although all its characters are in the vocabulary")
            pos = pos + match
            going = pos < end
            pos, end, word_start = pos[going], end[going], word_start[going]
            starts.append(pos)
        return np.concatenate(starts)


class _KeySet:
    """Set of 64-bit keys: open addressing with linear probing, built and queried with numpy."""

    def __init__(self, keys: np.ndarray):
        keys = np.unique(keys)
        if keys.size and keys[0] == 0:
            raise AssertionError("key 0 is the empty-slot marker")
        size = 1 << max(4, int(2 * len(keys)).bit_length())
        self.mask = np.uint64(size - 1)
        self.table = np.zeros(size, dtype=np.uint64)
        pending = keys
        slot = (pending & self.mask).astype(np.int64)
        while pending.size:
            free = np.flatnonzero(self.table[slot] == 0)
            _, first = np.unique(slot[free], return_index=True)
            winners = free[first]  # one key per free slot per round
            self.table[slot[winners]] = pending[winners]
            rest = np.ones(pending.size, dtype=bool)
            rest[winners] = False
            pending = pending[rest]
            slot = (slot[rest] + 1) & int(self.mask)

    def contains(self, queries: np.ndarray) -> np.ndarray:
        found = np.zeros(queries.size, dtype=bool)
        index = np.arange(queries.size)
        slot = (queries & self.mask).astype(np.int64)
        while index.size:
            stored = self.table[slot]
            wanted = queries[index]
            hit = stored == wanted
            found[index[hit]] = True
            probe_on = ~hit & (stored != 0)
            index = index[probe_on]
            slot = (slot[probe_on] + 1) & int(self.mask)
        return found


def learn(
    words: Sequence[str],
    counts: Sequence[float] | np.ndarray,
    config: LearnerConfig | None = None,
) -> LearnResult:
    """Learn a WordPiece vocabulary of exactly `config.vocab_size` tokens from word counts."""
    from tqdm.auto import tqdm

    config = config or LearnerConfig()
    started = time.perf_counter()
    counts = np.asarray(counts, dtype=np.float64)
    if len(words) != len(counts):
        raise ValueError("words and counts differ in length")
    positive = counts > 0
    if not positive.all():
        words = [w for w, keep in zip(words, positive) if keep]
        counts = counts[positive]
    if not words:
        raise VocabSizeError("no words to learn from")

    logger.info("encoding %d words", len(words))
    codes, lengths = _encode(words)
    if (lengths == 0).any():
        raise ValueError("empty word in the counts")
    pos_word = np.repeat(np.arange(len(words)), lengths)
    alphabet, code_id = np.unique(codes, return_inverse=True)
    char_counts = np.bincount(code_id, weights=counts[pos_word], minlength=len(alphabet))
    allowed = char_counts >= config.char_min_count
    # characters, most frequent first (ties by code point), as TF Text orders tokens
    char_order = np.lexsort((alphabet, -char_counts))
    chars = [chr(int(alphabet[i])) for i in char_order if allowed[i]]

    ok_char = allowed[code_id]
    word_ok = np.logical_and.reduceat(ok_char, np.concatenate([[0], np.cumsum(lengths)[:-1]])) & (
        lengths <= config.max_token_length
    )
    del code_id, ok_char, pos_word
    fixed = len(SPECIAL_TOKENS) + config.num_unused + 2 * len(chars)
    needed = config.vocab_size - fixed
    if needed <= 0:
        raise VocabSizeError(
            f"vocab size {config.vocab_size} leaves no room for learned tokens after the {len(SPECIAL_TOKENS)} "
            f"reserved tokens, {config.num_unused} unused slots and {2 * len(chars)} character tokens; raise "
            f"--vocab-size or --char-min-count"
        )
    keep_idx = np.flatnonzero(word_ok)
    kept_words = [words[i] for i in keep_idx] if len(keep_idx) < len(words) else words
    kept_counts = counts[keep_idx]
    kept_codes, kept_lengths = _encode(kept_words)
    logger.info("hashing %d words (%d characters) for learning", len(kept_words), len(kept_codes))
    corpus = _Corpus(kept_words, kept_counts, kept_codes, kept_lengths)
    del kept_codes

    char_codes = np.array([ord(c) for c in chars], dtype=np.uint64)
    char_keys = _single_char_keys(corpus, char_codes)
    # candidates equal to a character token are always in; they don't count towards `needed`
    is_char = np.isin(corpus.candidate_keys, char_keys)

    base_counts = corpus.count_suffixes(np.arange(len(corpus.codes)))
    max_len = config.max_token_length

    def run(threshold: float) -> np.ndarray:
        token_counts = base_counts
        for _ in range(1, config.num_iterations):
            selected = np.flatnonzero((token_counts >= threshold) & ~is_char)
            vocab = _KeySet(np.concatenate([corpus.candidate_keys[selected], char_keys]))
            longest = int(corpus.candidate_length(selected).max()) if selected.size else 1
            token_counts = corpus.count_suffixes(corpus.segment(vocab, min(longest, max_len)))
        return token_counts

    learnable = np.where(is_char, 0.0, base_counts)
    if np.count_nonzero(learnable) < needed:
        raise VocabSizeError(
            f"the data has only {np.count_nonzero(learnable)} candidate tokens besides "
            f"{len(chars)} characters, fewer than the {needed} a vocabulary of {config.vocab_size} "
            f"needs; lower --vocab-size to at most ~{fixed + np.count_nonzero(learnable) // 2}"
        )
    ordered = np.sort(learnable[learnable > 0])[::-1]
    threshold = float(ordered[needed - 1])  # iteration 0 alone would give exactly `needed`
    low, high = None, None  # thresholds known to give >= needed (low) and < needed (high)
    search: list[dict] = []
    best = None
    progress = tqdm(total=config.max_search_steps, desc="vocab threshold search", disable=not config.progress)
    for step in range(config.max_search_steps):
        step_started = time.perf_counter()
        final_counts = run(threshold)
        got = int(np.count_nonzero((final_counts >= threshold) & ~is_char))
        search.append({"threshold": threshold, "tokens": got, "seconds": round(time.perf_counter() - step_started, 2)})
        progress.update(1)
        progress.set_postfix(threshold=f"{threshold:.4g}", tokens=got, needed=needed)
        logger.info("threshold %.6g -> %d learned tokens (need %d)", threshold, got, needed)
        if got >= needed:
            if best is None or threshold > best[0]:
                best = (threshold, final_counts)
            low = (threshold, got)
            if got <= needed * (1 + config.search_slack):
                break
        else:
            high = (threshold, got)
        if low is not None and high is not None:
            between = np.unique(best[1][(best[1] >= low[0]) & (best[1] < high[0]) & ~is_char])
            if between.size <= 1:  # no threshold in between selects anything different
                break
        threshold = _next_threshold(low, high, needed)
        if threshold is None:
            break
    progress.close()
    if best is None:
        raise VocabSizeError(
            f"could not reach {config.vocab_size} tokens: the lowest threshold tried gave fewer; "
            "lower --vocab-size"
        )
    threshold, final_counts = best
    selected = np.flatnonzero((final_counts >= threshold) & ~is_char)
    # most frequent first, ties by key for determinism; cut to the exact size
    order = np.lexsort((corpus.candidate_keys[selected], -final_counts[selected]))[:needed]
    learned = [corpus.candidate_token(int(c)) for c in selected[order]]

    vocab = list(SPECIAL_TOKENS) + [f"[unused{i}]" for i in range(config.num_unused)]
    vocab += chars + [SUFFIX + c for c in chars] + learned
    if len(set(vocab)) != len(vocab):
        raise AssertionError("duplicate tokens in the learned vocabulary (hash collision?)")
    return LearnResult(
        vocab=vocab,
        threshold=threshold,
        num_chars=len(chars),
        num_words_in=len(words),
        num_words_used=len(kept_words),
        search=search,
        seconds=time.perf_counter() - started,
    )


def _single_char_keys(corpus: _Corpus, char_codes: np.ndarray) -> np.ndarray:
    """Keys of every character alone and as ##c (same hash as `_Corpus.keys` on a 1-length range)."""
    with np.errstate(over="ignore"):
        raw = char_codes + np.uint64(0x2545F4914F6CDD1D)  # prefix difference of length 1 is the code
        mixed = _mix(raw)
    return np.concatenate([mixed, mixed ^ _SUFFIX_FLAG])


def _next_threshold(low, high, needed: int) -> float | None:
    """Secant step on (log t, log tokens) inside the bracket; geometric bisection as fallback."""
    if low is not None and high is not None:
        (t_low, n_low), (t_high, n_high) = low, high
        if t_high / t_low < 1.02:  # a cluster of equal counts sits here: cut by count instead
            return None
        guess = math.exp(
            math.log(t_low)
            + (math.log(needed) - math.log(n_low))
            * (math.log(t_high) - math.log(t_low))
            / (math.log(max(n_high, 1)) - math.log(n_low))
        )
        lo_b, hi_b = t_low * (t_high / t_low) ** 0.2, t_low * (t_high / t_low) ** 0.8
        return min(max(guess, lo_b), hi_b)
    if low is not None:  # too many tokens: raise the threshold
        t, n = low
        return t * max(1.05, (n / needed) ** 1.4)
    t, n = high  # too few tokens: lower the threshold (tokens grow roughly like t^-0.7)
    return t / max(1.05, (needed / max(n, 1)) ** 1.4)


def learn_from_counts(counts: Mapping[str, float], config: LearnerConfig | None = None) -> LearnResult:
    words = list(counts)
    return learn(words, np.fromiter((counts[w] for w in words), dtype=np.float64, count=len(words)), config)


def write_vocab(vocab: Iterable[str], path: str) -> None:
    """vocab.txt, one token per line, written atomically."""
    from pipelines.io.atomic import write_text_atomic

    write_text_atomic(path, "".join(token + "\n" for token in vocab))
