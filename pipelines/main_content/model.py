"""The main-content classifier: a fastText model over lines, and the featurisation it needs.

This module is the single place that turns the lines of one document into fastText input strings,
so training (``train.py``) and inference (``labse-clean``) can never featurise differently.
Features (``featurise_document``): the line's lowercased tokens, its length, position and end
punctuation, the previous and next line's length and first tokens, where it sits relative to the
page's prose lines, and, when the page's HTML is known, whether resiliparse's DOM-based
main-content mode keeps it (``html_main_flags``). Everything but the last needs only the line
list, so the same model also scores WET text. Scores are then smoothed over the page
(``postprocess_scores``).

Every featurised line carries a feature-set tag (``__fs_ctx2h``); a model trained with another
feature set is refused at load time instead of silently scoring garbage. ``MainContentModel.load``
validates the file's structure before fastText reads it (fastText trusts its input and can crash
or allocate wildly on a truncated or foreign file).
"""
from __future__ import annotations

import bisect
import itertools
import mmap
import os
import struct
from typing import Sequence

import numpy as np

LABEL_MAIN = "__label__main"
LABEL_BOILERPLATE = "__label__boilerplate"
FEATURE_SET = "ctx2h"
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
    kept = {" ".join(block.split()) for block in text.split("\n")}
    return [line in kept for line in lines]


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
    where the page's HTML is known; without it every line gets ``RMx``. Training drops the HTML
    feature on a share of pages, so one model serves both WARC (HTML) and WET (text only).
    (Written for speed: this runs on every line ``labse-clean`` reads.)
    """
    return _featurise(lines, "", html_main)


def _featurise(lines: Sequence[str], end: str, html_main: Sequence[bool] | None = None) -> list[str]:
    n = len(lines)
    if html_main is not None and len(html_main) != n:
        raise ValueError(f"{n} lines but {len(html_main)} HTML flags")
    if n == 0:
        return []
    tokens = [line.lower().split()[:MAX_LINE_TOKENS] for line in lines]
    length_buckets = [bisect.bisect_right(_CHAR_LENGTH_EDGES, len(line)) for line in lines]
    prose = [len(line) >= PROSE_MIN_CHARS and line[-1] in _SENTENCE_END for line in lines]
    own = [" ".join(t) for t in tokens]
    heads = [f"L{lb} W{bisect.bisect_right(_TOKEN_COUNT_EDGES, len(toks))}"
             for lb, toks in zip(length_buckets, tokens)]
    ends = [_end_class(line) if line else "E0" for line in lines]
    as_prev = [f"pL{lb} p:" + " p:".join(toks[:CONTEXT_TOKENS]) if toks else f"pL{lb} "
               for lb, toks in zip(length_buckets, tokens)]
    as_next = [f"nL{lb} n:" + " n:".join(toks[:CONTEXT_TOKENS]) if toks else f"nL{lb} "
               for lb, toks in zip(length_buckets, tokens)]
    as_prev.insert(0, "pL_start")  # as_prev[i] is now the context line i gets from line i - 1
    as_next.append("nL_end")
    # Distance to the nearest prose line: one pass from each side.
    far = 1 << 30
    distance = [far] * n
    last = -far
    for i in range(n):
        if prose[i]:
            last = i
        distance[i] = i - last
    last = far
    for i in range(n - 1, -1, -1):
        if prose[i]:
            last = i
        if last - i < distance[i]:
            distance[i] = last - i
    prose_at = [i for i in range(n) if prose[i]]
    first_prose, last_prose = (prose_at[0], prose_at[-1]) if prose_at else (n, -1)
    prose_before = [0] * (n + 1)
    prose_chars_before = [0] * (n + 1)
    for i in range(n):
        prose_before[i + 1] = prose_before[i] + prose[i]
        prose_chars_before[i + 1] = prose_chars_before[i] + (len(lines[i]) if prose[i] else 0)
    prose_chars = prose_chars_before[n] or 1
    html_tokens = ["RMx"] * n if html_main is None else ["RM1" if flag else "RM0" for flag in html_main]
    features: list[str] = []
    for i in range(n):
        d = distance[i]
        span = "Sin" if first_prose <= i <= last_prose else ("Sbefore" if i < first_prose else "Safter")
        nearby = prose_before[min(n, i + 5)] - prose_before[max(0, i - 4)]
        features.append(
            f"{FEATURE_SET_TOKEN} {heads[i]} P{i * _POSITION_BUCKETS // n} {ends[i]} "
            f"{_DISTANCE_TOKENS[d] if d < 9 else 'D4'} {span} PD{nearby if nearby < 5 else 5} "
            f"PM{prose_chars_before[i] * 5 // prose_chars} {html_tokens[i]} {own[i]} "
            f"{as_prev[i]} {as_next[i + 1]}{end}"
        )
    return features


def postprocess_scores(raw: np.ndarray, lines: Sequence[str], *, window: int = SMOOTH_WINDOW,
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
    scores = np.asarray(raw, dtype=np.float64)
    n = len(scores)
    if n == 0:
        return scores.astype(np.float32)
    if window > 0 and n > 1:
        padded = np.pad(scores, (window, window), mode="edge")
        local = np.convolve(padded, np.ones(2 * window + 1) / (2 * window + 1), mode="valid")
        scores = 0.5 * scores + 0.5 * local
    weights = np.fromiter(map(str.count, lines, itertools.repeat(" ")), dtype=np.float64, count=n)
    weights += 1.0
    weights *= scores - region_pivot
    # Kadane, vectorised: the best segment ending at i starts right after the lowest prefix sum.
    prefix = np.concatenate(([0.0], np.cumsum(weights)))
    running_low = np.minimum.accumulate(prefix)
    is_new_low = prefix <= running_low
    low_at = np.maximum.accumulate(np.where(is_new_low, np.arange(n + 1), 0))
    ending = prefix[1:] - running_low[:-1]
    starts = low_at[:-1]
    best = float(ending.max())
    if best > 0:
        inside = np.zeros(n, dtype=bool)
        floor = region_min_share * best
        candidates = np.flatnonzero(ending >= floor)
        chosen: list[tuple[int, int]] = []
        for end in candidates[np.argsort(-ending[candidates], kind="stable")].tolist():
            start = int(starts[end])
            if all(end < a or start > b for a, b in chosen):  # disjoint from every chosen run
                chosen.append((start, end))
                inside[start:end + 1] = True
        scores = np.where(inside, scores, scores * outside_factor)
    return np.clip(scores, 0.0, 1.0).astype(np.float32)


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
        return postprocess_scores(self.raw_scores(lines, html_main), lines)

    def raw_scores(self, lines: Sequence[str], html_main: Sequence[bool] | None = None) -> np.ndarray:
        """fastText's P(main) per line before page-level smoothing (one batched predict call)."""
        if not lines:
            return np.zeros(0, dtype=np.float64)
        # fastText's own predict() re-checks every string in Python; ours never hold a newline, and
        # the trailing "\n" is what adds the end-of-sentence token the model was trained with.
        labels, probs = self._model.f.multilinePredict(_featurise(lines, "\n", html_main), 1, 0.0, "replace")
        # k=1 with threshold 0 gives exactly one (label, probability) per line.
        top = np.concatenate(probs).astype(np.float64)
        is_main = np.fromiter(map(_MAIN_ONLY.__eq__, labels), dtype=bool, count=len(labels))
        return np.clip(np.where(is_main, top, 1.0 - top), 0.0, 1.0)
