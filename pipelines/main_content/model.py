"""The main-content classifier: a fastText model over lines, and the featurisation it needs.

This module is the single place that turns the lines of one document into fastText input strings,
so training (``train.py``) and inference (``labse-clean``) can never featurise differently.
Features (``featurise_document``): the line's lowercased tokens, its length, position and end
punctuation, the previous and next line's length and first tokens, where it sits relative to the
page's prose lines, and, when the page's HTML is known, whether resiliparse's DOM-based
main-content mode keeps it (``html_main_flags``). Everything but the last needs only the line
list, so the same model also scores WET text. Scores are then smoothed over the page
(``postprocess_scores``).

Every featurised line carries a feature-set tag (``__fs_ctx2hw``); a model trained with another
feature set is refused at load time instead of silently scoring garbage. ``MainContentModel.load``
validates the file's structure before fastText reads it (fastText trusts its input and can crash
or allocate wildly on a truncated or foreign file).
"""
from __future__ import annotations

import bisect
import functools
import itertools
import mmap
import os
import struct
from typing import Iterable, Sequence

import numpy as np

LABEL_MAIN = "__label__main"
LABEL_BOILERPLATE = "__label__boilerplate"
FEATURE_SET = "ctx2hw"
FEATURE_SET_TOKEN = f"__fs_{FEATURE_SET}"

# Lines are truncated for speed: the first tokens of a block are what tells navigation from prose.
MAX_LINE_TOKENS = 32
CONTEXT_TOKENS = 2
_CHAR_LENGTH_EDGES = (1, 10, 20, 40, 80, 160, 320, 640)
_TOKEN_COUNT_EDGES = (1, 2, 3, 5, 8, 13, 21, 34)
_POSITION_BUCKETS = 10
_SENTENCE_END = frozenset(".!?。！？…:;\"'»”)")
PROSE_MIN_CHARS = 80
SMOOTH_WINDOW = 2
REGION_MIN_SHARE = 0.3
OUTSIDE_REGION_FACTOR = 0.5


def _end_class(line: str) -> str:
    last = line[-1]
    if last in _SENTENCE_END:
        return "Ep"
    if last.isdigit():
        return "Ed"
    if last.isalpha():
        return "Ea"
    return "Eo"


_MAIN_ONLY = [LABEL_MAIN]
_DISTANCE_TOKENS = ("D0", "D1", "D2", "D2", "D3", "D3", "D3", "D3", "D3")  # index: distance 0..8, else D4


def html_main_flags(lines: Sequence[str], html) -> list[bool] | None:
    """Per line: does resiliparse's main-content extraction of the page keep it? (the HTML feature)

    resiliparse's ``main_content=True`` mode uses the DOM (tags, classes, link density), which the
    lines alone do not show; as one more feature it raises held-out F1 a lot (see BENCHMARKS.md).
    ``html``: the page's HTML string, or its already parsed resiliparse ``HTMLTree`` (labse-clean
    parses once for both the lines and this). Blocks are matched to lines exactly, after
    html_to_lines' whitespace normalisation. None (the feature is unknown, as for text input) when
    resiliparse cannot extract the page.
    """
    from resiliparse.extract.html2text import extract_plain_text

    try:
        # The same options as html_to_lines, so a block kept here is byte-identical to its line there.
        text = extract_plain_text(html, preserve_formatting=True, main_content=True, list_bullets=False,
                                  alt_texts=False, links=False, form_fields=False, noscript=False)
    except Exception:  # resiliparse is tolerant; a page it cannot parse simply has no HTML feature
        return None
    from pipelines.text.html import normalise_lines

    # The whitespace-normalised blocks (`" ".join(block.split())`), as html_to_lines normalises its
    # lines (with its fast path for the many blocks that need no change); the empty block only
    # matters for an empty line, which html_to_lines never gives.
    kept = set(normalise_lines(text))
    if "" in lines and any(not block.strip() for block in text.split("\n")):
        kept.add("")
    return list(map(kept.__contains__, lines))


def featurise_document(lines: Sequence[str], html_main: Sequence[bool] | None = None) -> list[str]:
    """fastText input strings (without labels) for the lines of ONE document, in order.

    Per line: its lowercased tokens (at most ``MAX_LINE_TOKENS``), length and token-count buckets,
    position in the page (decile by line), end-punctuation class, the length bucket and first
    tokens of the previous and next line, and where the line sits relative to the page's *prose
    lines* (>= ``PROSE_MIN_CHARS`` characters ending like a sentence): distance to the nearest one,
    before / inside / after the span from the first to the last one, how many are within 4 lines,
    and how much of the page's prose precedes it. Main text is usually one run of prose; menus,
    footers and teasers sit around it. All of this needs only the line list, so it works for WET.

    ``html_main`` (one flag per line, from ``html_main_flags``) adds the HTML feature ``RM1``/``RM0``
    where the page's HTML is known, and its page context: how many of the 5 lines around the line
    resiliparse keeps (``RW0``..``RW5``); without it every line gets ``RMx RWx``. Training drops the HTML
    feature on a share of pages, so one model serves both WARC (HTML) and WET (text only).
    (Written for speed: this runs on every line ``labse-clean`` reads.)
    """
    return _featurise(lines, "", html_main)


# Lookup tables for _featurise, so the per-line work is a few list lookups (it runs on every line
# labse-clean reads). They spell the same tokens as the docstring of featurise_document describes.
_LONG_LINE = _CHAR_LENGTH_EDGES[-1] + 1  # a line this long or longer is in the last length bucket
_LENGTH_BUCKET = [bisect.bisect_right(_CHAR_LENGTH_EDGES, length) for length in range(_LONG_LINE)]
_LAST_LENGTH_BUCKET = len(_CHAR_LENGTH_EDGES)
_TOKEN_COUNTS = MAX_LINE_TOKENS + 2  # split(None, MAX_LINE_TOKENS) gives up to that many tokens + the rest
_HEADS = [f"{FEATURE_SET_TOKEN} L{length} W{bisect.bisect_right(_TOKEN_COUNT_EDGES, min(count, MAX_LINE_TOKENS))}"
          for length in range(_LAST_LENGTH_BUCKET + 1) for count in range(_TOKEN_COUNTS)]
_AS_PREV = [f"pL{length} p:" for length in range(_LAST_LENGTH_BUCKET + 1)]
_AS_PREV_EMPTY = [f"pL{length} " for length in range(_LAST_LENGTH_BUCKET + 1)]
_AS_NEXT = [f"nL{length} n:" for length in range(_LAST_LENGTH_BUCKET + 1)]
_AS_NEXT_EMPTY = [f"nL{length} " for length in range(_LAST_LENGTH_BUCKET + 1)]
_POSITION_TOKENS = [f"P{bucket}" for bucket in range(_POSITION_BUCKETS)]
_NEARBY_TOKENS = [f"PD{min(count, 5)}" for count in range(10)]  # at most 9 lines are within 4 lines
_PROSE_SHARE_TOKENS = [f"PM{fifth}" for fifth in range(6)]
_NO_PROSE = ("D4", "Sbefore", "PD0", "PM0")
_END_TOKENS = {"": "E0"}  # last character -> end class, filled as characters are met


def _end_token(last: str) -> str:
    token = _END_TOKENS.get(last)
    if token is None:
        token = _END_TOKENS[last] = _end_class(last)
    return token


def _distance_token(distance: int) -> str:
    return _DISTANCE_TOKENS[distance] if distance < len(_DISTANCE_TOKENS) else "D4"


def _distances_down(count: int) -> list[str]:
    """Distance tokens of ``count`` lines just before a prose line: count, count - 1, ..., 1."""
    return [_distance_token(distance) for distance in range(count, 0, -1)]


@functools.lru_cache(maxsize=256)
def _distances_between(gap: int) -> tuple[str, ...]:
    """Distance tokens of ``gap`` lines between two prose lines (to the nearer one)."""
    return tuple(_distance_token(min(k, gap + 1 - k)) for k in range(1, gap + 1))


def _featurise(lines: Sequence[str], end: str, html_main: Sequence[bool] | None = None) -> list[str]:
    n = len(lines)
    if html_main is not None and len(html_main) != n:
        raise ValueError(f"{n} lines but {len(html_main)} HTML flags")
    if n == 0:
        return []
    # maxsplit: the first MAX_LINE_TOKENS tokens are all that is used (long prose lines have hundreds).
    tokens = [line.lower().split(None, MAX_LINE_TOKENS) for line in lines]
    length_buckets = [_LENGTH_BUCKET[length] if (length := len(line)) < _LONG_LINE else _LAST_LENGTH_BUCKET
                      for line in lines]
    heads = [_HEADS[bucket * _TOKEN_COUNTS + len(toks)] for bucket, toks in zip(length_buckets, tokens)]
    own = [" ".join(toks) if len(toks) <= MAX_LINE_TOKENS else " ".join(toks[:MAX_LINE_TOKENS]) for toks in tokens]
    known_end = _END_TOKENS.get
    ends = [known_end(last) or _end_token(last) for last in [line[-1:] for line in lines]]
    # CONTEXT_TOKENS == 2: the first two tokens of a line, prefixed, describe it to its neighbours.
    as_prev = [f"{_AS_PREV[bucket]}{toks[0]} p:{toks[1]}" if len(toks) > 1
               else (_AS_PREV[bucket] + toks[0] if toks else _AS_PREV_EMPTY[bucket])
               for bucket, toks in zip(length_buckets, tokens)]
    as_next = [f"{_AS_NEXT[bucket]}{toks[0]} n:{toks[1]}" if len(toks) > 1
               else (_AS_NEXT[bucket] + toks[0] if toks else _AS_NEXT_EMPTY[bucket])
               for bucket, toks in zip(length_buckets, tokens)]
    as_prev.insert(0, "pL_start")  # as_prev[i] is now the context line i gets from line i - 1
    as_next.append("nL_end")
    del as_next[0]  # and as_next[i] the context it gets from line i + 1
    positions: list[str] = []  # decile i * 10 // n, built bucket by bucket
    done = 0
    for bucket in range(_POSITION_BUCKETS):
        upto = ((bucket + 1) * n + _POSITION_BUCKETS - 1) // _POSITION_BUCKETS
        positions += [_POSITION_TOKENS[bucket]] * (upto - done)
        done = upto
    prose_at = [i for i, line in enumerate(lines) if len(line) >= PROSE_MIN_CHARS and line[-1] in _SENTENCE_END]
    if prose_at:
        distance, span, nearby, prose_share = _prose_context(lines, prose_at)
    else:
        distance, span, nearby, prose_share = ([token] * n for token in _NO_PROSE)
    if html_main is None:
        html_tokens, window_tokens = ["RMx"] * n, ["RWx"] * n
    else:
        html_tokens = ["RM1" if flag else "RM0" for flag in html_main]
        window_tokens = _html_window_tokens(html_main)
    return [f"{head} {position} {end_class} {d} {s} {pd} {pm} {rm} {rw} {words} {prev} {next_}{end}"
            for head, position, end_class, d, s, pd, pm, rm, rw, words, prev, next_
            in zip(heads, positions, ends, distance, span, nearby, prose_share, html_tokens, window_tokens, own,
                   as_prev, as_next)]


_WINDOW_TOKENS = [f"RW{count}" for count in range(6)]


def _html_window_tokens(html_main: Sequence[bool]) -> list[str]:
    """Per line, how many of the 5 lines around it (itself and 2 on each side) resiliparse keeps
    (``RW0``..``RW5``): the page context of the HTML feature. A line in a run of kept blocks is
    main text more surely than an isolated kept one (a teaser, a caption), and a line the DOM pass
    missed inside the article is still surrounded by kept ones. Measured on the 181 article pages:
    +0.011 token F1 with the HTML feature, text only unchanged (BENCHMARKS.md, section "Main content at the
    teacher's quality", "Block features")."""
    prefix = [0]
    for flag in html_main:
        prefix.append(prefix[-1] + (1 if flag else 0))
    n = len(html_main)
    return [_WINDOW_TOKENS[prefix[min(n, i + 3)] - prefix[max(0, i - 2)]] for i in range(n)]


def _prose_context(lines: Sequence[str], prose_at: list[int]) -> tuple[list[str], list[str], list[str], list[str]]:
    """Per line, the tokens placing it among the page's prose lines (at indices ``prose_at``, not empty).

    Distance to the nearest prose line (``D``), before / inside / after the prose span (``S``), prose
    lines within 4 lines (``PD``) and the fifth of the page's prose characters before it (``PM``).
    All but ``PD`` are constant or ramps between consecutive prose lines, so they are built run by run.
    """
    n = len(lines)
    first, last = prose_at[0], prose_at[-1]
    distance = _distances_down(first)
    distance.append("D0")
    for before, after in zip(prose_at, prose_at[1:]):
        distance += _distances_between(after - before - 1)
        distance.append("D0")
    distance += reversed(_distances_down(n - 1 - last))
    span = ["Sbefore"] * first + ["Sin"] * (last - first + 1) + ["Safter"] * (n - 1 - last)
    within = [0] * n
    for at in prose_at:
        for i in range(at - 4 if at > 4 else 0, at + 5 if at + 5 < n else n):
            within[i] += 1
    nearby = [_NEARBY_TOKENS[count] for count in within]
    chars = [len(lines[at]) for at in prose_at]
    total = sum(chars)
    prose_share = [_PROSE_SHARE_TOKENS[0]] * (first + 1)  # a prose line's own characters count after it
    chars_before = 0
    for chars_at, before, after in zip(chars, prose_at, prose_at[1:]):
        chars_before += chars_at
        prose_share += [_PROSE_SHARE_TOKENS[chars_before * 5 // total]] * (after - before)
    prose_share += [_PROSE_SHARE_TOKENS[5]] * (n - 1 - last)
    return distance, span, nearby, prose_share


def postprocess_scores(raw: np.ndarray | Sequence[float], lines: Sequence[str], *, window: int = SMOOTH_WINDOW,
                       region_pivot: float = 0.5, region_min_share: float = REGION_MIN_SHARE,
                       outside_factor: float = OUTSIDE_REGION_FACTOR) -> np.ndarray:
    """Page-level smoothing of per-line probabilities (context is allowed by contract 3).

    1. Each score becomes the mean of itself and the mean over +-``window`` neighbours: an isolated
       "main" line inside a menu, or a short heading inside the article, follows its neighbours.
    2. Main text comes in runs. With weights ``tokens * (score - pivot)``, the best-scoring runs of
       lines (maximum-sum segments; every segment scoring at least ``region_min_share`` of the best)
       are the page's main regions; lines outside them are multiplied by ``outside_factor``. This
       removes prose-like boilerplate far from the article (cookie notices, teasers, disclaimers).
    """
    scores = raw.tolist() if isinstance(raw, np.ndarray) else [float(score) for score in raw]
    if len(scores) != len(lines):
        raise ValueError(f"{len(scores)} scores but {len(lines)} lines")
    return _postprocess(scores, lines, window, region_pivot, region_min_share, outside_factor)


# Pages shorter than this are smoothed in plain Python: numpy's per-call overhead (some 20 calls a
# page) costs more than it saves on them (BENCHMARKS.md, section Main-content classifier, "Page
# smoothing"; benchmarks/code_choices.py --part smoothing).
_NUMPY_FROM_LINES = 100


def _postprocess(scores: list[float] | np.ndarray, lines: Sequence[str], window: int = SMOOTH_WINDOW,
                 region_pivot: float = 0.5, region_min_share: float = REGION_MIN_SHARE,
                 outside_factor: float = OUTSIDE_REGION_FACTOR) -> np.ndarray:
    """``postprocess_scores`` of float64 scores (a list of floats or a float64 array). Two
    implementations of the same float64 operations in the same order, so with the same results:
    plain Python for short pages, numpy for long ones."""
    if not len(scores):
        return np.zeros(0, dtype=np.float32)
    if len(scores) < _NUMPY_FROM_LINES and window == 2:
        if isinstance(scores, np.ndarray):
            scores = scores.tolist()
        return np.array(_postprocess_short(scores, lines, region_pivot, region_min_share, outside_factor),
                        dtype=np.float32)
    return _postprocess_long(np.asarray(scores, dtype=np.float64), lines, window, region_pivot, region_min_share,
                             outside_factor)


def _postprocess_short(scores: list[float], lines: Sequence[str], region_pivot: float, region_min_share: float,
                       outside_factor: float) -> list[float]:
    """``postprocess_scores`` with window 2, in plain Python (the same operations as _postprocess_long)."""
    n = len(scores)
    if n > 1:
        share = 1.0 / 5  # np.ones(5) / 5, and summed left to right, as np.convolve does
        first, last = scores[0], scores[-1]
        padded = [first, first, *scores, last, last]
        scores = [0.5 * s + 0.5 * (a * share + b * share + s * share + d * share + e * share)
                  for a, b, s, d, e in zip(padded, padded[1:], padded[2:], padded[3:], padded[4:])]
    # Kadane: the best run ending at line i starts right after the last lowest prefix sum before it.
    ending: list[float] = []
    starts: list[int] = []
    prefix = low = 0.0
    low_at = 0
    for i, (spaces, score) in enumerate(zip(map(str.count, lines, itertools.repeat(" ")), scores), 1):
        prefix += (spaces + 1) * (score - region_pivot)
        ending.append(prefix - low)
        starts.append(low_at)
        if prefix <= low:
            low, low_at = prefix, i
    best = max(ending)
    if best > 0:
        inside = [False] * n
        floor = region_min_share * best
        for start, end in _main_regions((end, starts[end], score) for end, score in enumerate(ending) if score >= floor):
            inside[start:end + 1] = [True] * (end + 1 - start)
        scores = [score if keep else score * outside_factor for score, keep in zip(scores, inside)]
    return [0.0 if score < 0.0 else (1.0 if score > 1.0 else score) for score in scores]


def _postprocess_long(scores: np.ndarray, lines: Sequence[str], window: int, region_pivot: float,
                      region_min_share: float, outside_factor: float) -> np.ndarray:
    """``postprocess_scores`` in numpy (any window)."""
    n = len(scores)
    if window > 0 and n > 1:
        padded = np.concatenate((scores[:1].repeat(window), scores, scores[-1:].repeat(window)))  # edge padding
        local = np.convolve(padded, np.ones(2 * window + 1) / (2 * window + 1), mode="valid")
        scores = 0.5 * scores + 0.5 * local
    weights = np.array(list(map(str.count, lines, itertools.repeat(" "))), dtype=np.float64)
    weights += 1.0
    weights *= scores - region_pivot
    # Kadane, vectorised: the best segment ending at i starts right after the lowest prefix sum.
    prefix = np.concatenate(([0.0], np.cumsum(weights)))
    running_low = np.minimum.accumulate(prefix)
    is_new_low = prefix <= running_low
    low_at = np.maximum.accumulate(np.where(is_new_low, np.arange(n + 1), 0))
    ending = prefix[1:] - running_low[:-1]
    best = float(ending.max())
    if best > 0:
        inside = np.zeros(n, dtype=bool)
        candidates = np.flatnonzero(ending >= region_min_share * best)
        for start, end in _main_regions(zip(candidates.tolist(), low_at[candidates].tolist(),
                                            ending[candidates].tolist())):
            inside[start:end + 1] = True
        scores = np.where(inside, scores, scores * outside_factor)
    return np.clip(scores, 0.0, 1.0).astype(np.float32)


def _main_regions(candidates: Iterable[tuple[int, int, float]]) -> list[tuple[int, int]]:
    """The main regions: the best run per start among the candidate runs, as (start, end) lines.

    ``candidates``: (end, start, score) of the runs scoring at least the floor, by ascending end.
    Runs that share a start are nested and the others disjoint, because the start (the last lowest
    prefix sum) only moves forward, past the previous end. So taking runs best first and skipping
    any that overlaps a taken one keeps exactly the best run of each start (the first on ties),
    found here in one pass.
    """
    regions: list[tuple[int, int]] = []
    group, group_best, group_end = -1, 0.0, -1
    for end, start, score in candidates:
        if start != group:
            if group_end >= 0:
                regions.append((group, group_end))
            group, group_best, group_end = start, score, end
        elif score > group_best:
            group_best, group_end = score, end
    if group_end >= 0:
        regions.append((group, group_end))
    return regions


def training_lines(lines: Sequence[str], labels: Sequence[bool],
                   html_main: Sequence[bool] | None = None) -> list[str]:
    """fastText training lines (``__label__X features``) for one document's lines and labels."""
    if len(lines) != len(labels):
        raise ValueError(f"{len(lines)} lines but {len(labels)} labels")
    return [f"{LABEL_MAIN if is_main else LABEL_BOILERPLATE} {feats}"
            for feats, is_main in zip(featurise_document(lines, html_main), labels)]


class MainContentModelError(Exception):
    """The main-content model file is missing, unreadable, truncated or not a compatible model."""


# fastText binary format (version 12), see fastText's src/fasttext.cc, args.cc, dictionary.cc,
# densematrix.cc, quantmatrix.cc, productquantizer.cc.
_FASTTEXT_MAGIC = 793712314
_FASTTEXT_VERSION = 12
_ARGS_FORMAT = "<12id"  # dim ws epoch minCount neg wordNgrams loss model bucket minn maxn lrUpdateRate t
_MODEL_SUPERVISED = 3
_PQ_KSUB = 256


class _Cursor:
    """Reads a fastText file front to back, failing with MainContentModelError on truncation."""

    def __init__(self, data: bytes, path: str):
        self.data, self.pos, self.path = data, 0, path

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise MainContentModelError(
                f"main-content model {self.path!r} is truncated: needs at least {self.pos + size} bytes, "
                f"file has {len(self.data)} (re-copy or retrain it)")
        chunk = self.data[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def skip_cstring(self) -> None:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            self.take(len(self.data) - self.pos + 1)  # raises "truncated"
        self.pos = end + 1


def _skip_product_quantizer(cur: _Cursor) -> None:
    dim, _nsubq, _dsub, _lastdsub = cur.unpack("<4i")
    cur.take(4 * dim * _PQ_KSUB)


def _skip_matrix(cur: _Cursor, quantized: bool) -> None:
    if quantized:
        (qnorm,) = cur.unpack("<?")
        m, _n, codesize = cur.unpack("<qqi")
        cur.take(codesize)
        _skip_product_quantizer(cur)
        if qnorm:
            cur.take(m)
            _skip_product_quantizer(cur)
    else:
        m, n = cur.unpack("<qq")
        if m < 0 or n < 0:
            raise MainContentModelError(f"main-content model {cur.path!r} is corrupt (matrix {m}x{n})")
        cur.take(4 * m * n)


def check_fasttext_file(path: str) -> None:
    """Validate a fastText supervised model file structurally, without handing it to fastText.

    fastText's loader trusts its input: on garbage or a truncated copy it can allocate absurd
    amounts of memory or crash the process. Walking the format first turns every such case into a
    clear MainContentModelError.
    """
    if not os.path.exists(path):
        raise MainContentModelError(f"main-content model not found: {path!r}")
    if not os.path.isfile(path):
        raise MainContentModelError(f"main-content model {path!r} is not a file")
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size == 0:
                raise MainContentModelError(f"main-content model {path!r} is empty")
            # mmap: the matrices are skipped, not read, so large models validate cheaply.
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                _walk_fasttext_file(data, path)
    except OSError as exc:
        raise MainContentModelError(f"cannot read main-content model {path!r}: {exc}") from exc


def _walk_fasttext_file(data, path: str) -> None:
    cur = _Cursor(data, path)
    if len(data) < 8 or struct.unpack("<ii", data[:8]) != (_FASTTEXT_MAGIC, _FASTTEXT_VERSION):
        raise MainContentModelError(
            f"{path!r} is not a fastText model (bad magic number/version); expected a file written by "
            "`labse-main-content train`")
    cur.take(8)
    args = cur.unpack(_ARGS_FORMAT)
    if args[7] != _MODEL_SUPERVISED:
        raise MainContentModelError(
            f"{path!r} is a fastText model but not a supervised classifier (model type {args[7]})")
    size, _nwords, nlabels, _ntokens, pruneidx_size = cur.unpack("<iiiqq")
    if size < 0 or nlabels < 0 or pruneidx_size < -1:
        raise MainContentModelError(f"main-content model {path!r} has a corrupt dictionary header")
    for _ in range(size):
        cur.skip_cstring()
        cur.take(9)  # count int64 + type int8
    if pruneidx_size > 0:
        cur.take(8 * pruneidx_size)
    (quant_input,) = cur.unpack("<?")
    _skip_matrix(cur, quant_input)
    (quant_output,) = cur.unpack("<?")
    _skip_matrix(cur, quant_output)
    if cur.pos != len(data):
        raise MainContentModelError(
            f"main-content model {path!r} has {len(data) - cur.pos} unexpected trailing bytes (corrupt)")


class MainContentModel:
    """P(main content) for the lines of a document, from a fastText model trained by ``train.py``."""

    def __init__(self, fasttext_model, path: str = "<memory>"):
        labels = set(fasttext_model.get_labels())
        if labels != {LABEL_MAIN, LABEL_BOILERPLATE}:
            raise MainContentModelError(
                f"{path!r} is a fastText classifier but not a main-content model "
                f"(labels {sorted(labels)[:5]}, expected {LABEL_MAIN} and {LABEL_BOILERPLATE})")
        if fasttext_model.get_word_id(FEATURE_SET_TOKEN) < 0:
            trained_with = [w for w in fasttext_model.get_words() if w.startswith("__fs_")]
            raise MainContentModelError(
                f"main-content model {path!r} was trained with feature set {trained_with or 'unknown'}, "
                f"this code featurises with {FEATURE_SET_TOKEN}; retrain it with `labse-main-content train`")
        self._model = fasttext_model
        self.path = path

    @classmethod
    def load(cls, path: str) -> "MainContentModel":
        path = os.fspath(path)
        check_fasttext_file(path)
        import fasttext  # imported late: the rest of the pipeline package must not need it

        try:
            model = fasttext.load_model(path)
        except Exception as exc:  # fastText raises ValueError/RuntimeError with terse messages
            raise MainContentModelError(f"fastText could not load main-content model {path!r}: {exc}") from exc
        return cls(model, path)

    def score_lines(self, lines: Sequence[str], html: str | None = None) -> np.ndarray:
        """P(main content) for each line of ONE document (lines in reading order), float32.

        ``html``: the page's HTML when there is one (WARC), for the HTML feature; leave it out for
        text-only input (WET, Wikipedia). Scores are smoothed at page level (``postprocess_scores``).
        """
        if not lines:
            return np.zeros(0, dtype=np.float32)
        return self.score_lines_with_flags(lines, html_main_flags(lines, html) if html else None)

    def score_lines_with_flags(self, lines: Sequence[str], html_main: Sequence[bool] | None) -> np.ndarray:
        """``score_lines`` with the HTML feature already computed (``html_main_flags``) or None."""
        if not lines:
            return np.zeros(0, dtype=np.float32)
        # fastText treats "\n" as end of input; lines from html_to_lines never contain one.
        if "\n" in "".join(lines):
            lines = [line.replace("\n", " ") for line in lines]
        return _postprocess(self._main_probabilities(lines, html_main), lines)

    def raw_scores(self, lines: Sequence[str], html_main: Sequence[bool] | None = None) -> np.ndarray:
        """fastText's P(main) per line before page-level smoothing (one batched predict call)."""
        return self._main_probabilities(lines, html_main)

    def _main_probabilities(self, lines: Sequence[str], html_main: Sequence[bool] | None) -> np.ndarray:
        """fastText's P(main) per line, float64 (one batched predict call)."""
        if not lines:
            return np.zeros(0, dtype=np.float64)
        # fastText's own predict() re-checks every string in Python; ours never hold a newline, and
        # the trailing "\n" is what adds the end-of-sentence token the model was trained with.
        labels, probs = self._model.f.multilinePredict(_featurise(lines, "\n", html_main), 1, 0.0, "replace")
        # k=1 with threshold 0 gives exactly one (label, float32 probability) per line; fastText's
        # probabilities can exceed 1 by its 1e-5 smoothing, hence the clipping. As arrays: the same
        # float64 operations as per line in Python, without a Python float per line.
        top = np.concatenate(probs).astype(np.float64)
        is_main = np.fromiter(map(_MAIN_ONLY.__eq__, labels), dtype=bool, count=len(labels))
        main = np.where(is_main, top, 1.0 - top)
        return np.clip(main, 0.0, 1.0, out=main)
