"""Pre-training batches: packed monolingual text (MLM) and translation pairs (TLM), masked, resumable.

    corpora = find_mono_corpora(["clean_out/sentences", "de:multi30k/train.de.gz"])
    batches = PretrainBatches(corpora, tlm=TLMSource.open("shards/*.tfrecord*", ...), ...)
    batch = next(batches)      # input_ids, attention_mask, mlm_rows, mlm_columns, mlm_labels

Monolingual text (MLM)
----------------------
Inputs are `labse-clean`'s `sentences/lang=XX/*.parquet` (one row a sentence, rows of a document
consecutive, in order) and line-aligned text files given as `LANG:GLOB` (one sentence a line, a
blank line between documents, as BERT's pre-training text). Consecutive sentences of one document
are packed into `[CLS] s1 s2 ... [SEP]` up to the sequence length; a sentence longer than that is
cut. Each row of a batch picks its language with probability proportional to n_l ** alpha (n_l the
language's sentence count, from Parquet metadata or one streaming pass over a text file; LaBSE:
alpha = 0.3, as for the vocabulary), then takes that language's next packed sequence.

Shuffling: the files of a language are read in a seeded order per epoch, and the packed sequences
of a file in windows of `shuffle_window` consecutive sequences, each window put in a seeded random
order (seed, language, epoch, file, window), so text of one site or one document's neighbourhood
does not fill consecutive batches. A window is held as int32 arrays (at most `shuffle_window` x
`max_seq_length` x 4 bytes per language).

Packing is deterministic per file (it depends only on where a document starts), so the position
of a language's stream is four numbers: the file (in that epoch's seeded file order), the row its
current window starts at, how many sequences of the file came before that row, and how many of the
window's sequences were taken. Each rank saves its positions with every checkpoint; a resumed run
re-packs the current window from its first row, draws the same order and skips what was taken, so
it continues exactly.

Ranks: a language with at least as many files as ranks splits its files over the ranks; a
language with fewer files is read by every rank, which keeps every world-size-th packed sequence.

Held out: a packed sequence whose (file, first row) hashes below `heldout_rate` is never trained on;
`heldout_sequences` collects the first of them per language, the set the trainer scores
masked-token loss and accuracy on.

Translation pairs (TLM)
-----------------------
Pair shards written by `labse-tfrecords` (`[CLS] a [SEP]` and `[CLS] b [SEP]`) are read through
the trainer's index-space loader (`labse_model.data`), so the pairs of step s are a function of s.
Each becomes `[CLS] a [SEP] b [SEP]` with the side order drawn at random; no language or segment
embedding tells the sides apart (as in LaBSE's TLM).

Masks are drawn by `labse_model.masking` from a generator seeded with (seed, step, rank).
"""
from __future__ import annotations

import logging
import os
import re
import itertools
import zlib
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from pipelines.io import storage
from labse_model.masking import MaskingSpec, mask_tokens
from pipelines.io.config_options import UsageError
from pipelines.io.text_lines import UnreadableTextError

logger = logging.getLogger(__name__)

PARQUET = "parquet"
TEXT = "text"
_LANG_SPEC = re.compile(r"^([A-Za-z]{2,3}(?:[_-][A-Za-z0-9]+)*):(.+)$")
_PARTITION = re.compile(r"^lang=(.+)$")
_ROWS_PER_READ = 512
# Characters one WordPiece token can span at most in practice (a word over 100 characters is one [UNK]).
CHARS_PER_TOKEN_BOUND = 128
# Seeds of the generators drawn per (step, rank): distinct streams for distinct purposes.
_LANGUAGE_STREAM, _MASK_STREAM, _SIDE_STREAM, _HELDOUT_STREAM = 1, 2, 3, 4


@dataclass(frozen=True)
class MonoCorpus:
    """One language's monolingual input files, each with its format (Parquet or text), and its sentence count."""

    lang: str
    files: tuple[tuple[str, str], ...]  # (path, PARQUET or TEXT)
    sentences: int


def _visible_files(pattern: str) -> list[str]:
    # Hidden and underscore names are a writer's temporary files and markers, not data.
    return [p for p in storage.glob_files(pattern) if not p.rsplit("/", 1)[-1].startswith((".", "_"))]


def _parquet_rows(path: str) -> int:
    try:
        return storage.parquet_file(path).metadata.num_rows
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise UsageError(f"{path}: not a readable Parquet file ({exc})") from exc


def _count_text_sentences(path: str) -> int:
    try:
        return sum(1 for line in storage.iter_lines(path) if line.strip())
    except UnreadableTextError as exc:  # not UTF-8, a cut-short .gz: one line naming the file and the line
        raise UsageError(f"--mono file {exc}") from None


def find_mono_corpora(specs: list[str]) -> list[MonoCorpus]:
    """Resolve `--mono` arguments into per-language corpora (files of one language merged).

    A spec is a directory of `lang=XX` partitions (labse-clean's `sentences/`, or the clean output
    directory holding it), or `LANG:GLOB` of text files; either may be on object storage (gs://...). Missing inputs and empty languages are
    errors that name the spec, raised before any training work.
    """
    from pipelines.io.completion import require_stage_output

    files: dict[str, dict[str, str]] = {}
    counts: dict[str, int] = {}

    def add(lang: str, paths: list[str], fmt: str, rows: list[int]) -> None:
        # One language may come from several specs (a cleaned crawl and a text corpus): their files merge.
        known = files.setdefault(lang, {})
        for path, count in zip(paths, rows):
            if path not in known:
                known[path] = fmt
                counts[lang] = counts.get(lang, 0) + count

    for spec in specs:
        match = _LANG_SPEC.match(spec)
        # gs://B/sentences matches LANG:GLOB too ("gs", "//B/..."); de:gs://B/*.txt is a spec.
        if match and not match.group(2).startswith("//") and not os.path.exists(spec):
            lang, pattern = match.groups()
            require_stage_output(pattern, f"--mono {spec!r}", plain_allowed=True)
            paths = _visible_files(pattern)
            if not paths:
                raise FileNotFoundError(f"--mono {spec!r}: {pattern!r} matches no files")
            rows = [_count_text_sentences(p) for p in paths]
            if sum(rows) == 0:
                raise UsageError(f"--mono {spec!r}: the files hold no sentence")
            add(lang, paths, TEXT, rows)
            continue
        root = spec
        if storage.isdir(storage.join(root, "sentences")):
            root = storage.join(root, "sentences")
        if not storage.isdir(root):
            raise FileNotFoundError(f"--mono {spec!r} is neither a directory of lang=XX partitions nor LANG:GLOB")
        require_stage_output(root, f"--mono {spec!r} (labse-clean output)")
        partitions = [d for d in storage.listdir(root) if _PARTITION.match(d) and storage.isdir(storage.join(root, d))]
        if not partitions:
            raise UsageError(f"--mono {spec!r}: no lang=XX partitions under {root} (is it labse-clean's output?)")
        for partition in partitions:
            paths = _visible_files(storage.join(root, partition, "*.parquet"))
            rows = [_parquet_rows(p) for p in paths]
            if sum(rows) == 0:
                raise UsageError(f"--mono {spec!r}: the partition {storage.join(root, partition)} holds no sentence "
                                 "(an interrupted or filtered run?); remove it or rerun labse-clean")
            add(_PARTITION.match(partition).group(1), paths, PARQUET, rows)
    if not files:
        raise UsageError("no monolingual input: give --mono")
    return [MonoCorpus(lang, tuple(sorted(files[lang].items())), counts[lang]) for lang in sorted(files)]


def language_probabilities(corpora: list[MonoCorpus], alpha: float) -> np.ndarray:
    """p_l proportional to n_l ** alpha (alpha < 1 raises the share of small languages)."""
    sizes = np.asarray([c.sentences for c in corpora], dtype=np.float64)
    weights = sizes ** alpha
    return weights / weights.sum()


# ----------------------------------------------------------------------------------------------
# Reading and packing one file


def _iter_rows(path: str, fmt: str, start_row: int) -> Iterator[list[tuple[int, Any, str]]]:
    """Batches of (row, document key, text) from `start_row` on; a text file's blank lines end documents."""
    if fmt == PARQUET:
        parquet = storage.parquet_file(path)
        # Whole row groups before the position are not read at all.
        first_row, groups, group_start = 0, [], 0
        for group in range(parquet.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            if group_start + rows > start_row:
                groups.append(group)
            elif not groups:
                first_row = group_start + rows
            group_start += rows
        row = first_row
        for batch in parquet.iter_batches(batch_size=_ROWS_PER_READ, columns=["text", "doc_id"], row_groups=groups):
            texts, docs = batch.column("text").to_pylist(), batch.column("doc_id").to_pylist()
            rows = [(row + i, docs[i], texts[i]) for i in range(len(texts)) if row + i >= start_row]
            row += len(texts)
            if rows:
                yield rows
        return
    document, pending = 0, []
    for row, line in enumerate(storage.iter_lines(path)):
        if row < start_row:
            continue
        if not line.strip():
            document += 1
            continue
        pending.append((row, document, line))
        if len(pending) == _ROWS_PER_READ:
            yield pending
            pending = []
    if pending:
        yield pending


def _rows_naming_the_file(path: str, fmt: str, start_row: int) -> Iterator[list[tuple[int, Any, str]]]:
    """`_iter_rows`, with a file whose content cannot be read (no `text` column, text that is not
    a string, not UTF-8, damaged) reported as one ValueError naming it."""
    try:
        for rows in _iter_rows(path, fmt, start_row):
            wrong = next((type(text).__name__ for _, _, text in rows if text is not None and not isinstance(text, str)),
                         None)
            if wrong is not None:
                raise ValueError(f"its text column holds {wrong} values, not strings")
            yield rows
    except UnreadableTextError as exc:  # names the file and the line already
        raise UsageError(f"--mono file {exc}") from None
    except (ValueError, KeyError) as exc:  # pyarrow's ArrowInvalid and ArrowKeyError, UnicodeDecodeError
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise UsageError(f"--mono file {path}: {first_line}") from None


@dataclass
class PackedSequence:
    ids: list[int]  # [CLS] ... [SEP]
    first_row: int
    next_row: int  # where packing continues after this sequence


class Packer:
    """Packs the sentences of a file into sequences of at most `max_seq_length` tokens."""

    def __init__(self, tokenizer, max_seq_length: int, cls_id: int, sep_id: int):
        if max_seq_length < 3:
            raise UsageError(f"max_seq_length must be >= 3, got {max_seq_length}")
        self.tokenizer = tokenizer
        self.capacity = max_seq_length - 2
        self.cls_id, self.sep_id = cls_id, sep_id
        self.sentences_cut = 0
        self.rows_skipped = 0  # null or empty text rows (Parquet): nothing to learn from, counted
        self.max_chars = self.capacity * CHARS_PER_TOKEN_BOUND

    def cut_text(self, text: str) -> str:
        """`text` cut before tokenising to what can give the first `capacity` tokens.

        Tokens beyond the capacity are dropped anyway, and tokenising a whole 50 MB line took
        11 GB and 2 minutes. WordPiece gives a word of more than 100 characters one [UNK], so
        `capacity` tokens never span more than `capacity` x 128 characters unless runs of spaces
        fill them; the cut is made at the last whitespace before that bound, so the words kept
        tokenise exactly as in the whole line."""
        if len(text) <= self.max_chars:
            return text
        space = max(text.rfind(" ", 0, self.max_chars + 1), text.rfind("\t", 0, self.max_chars + 1))
        return text[: space if space > 0 else self.max_chars]

    def pack(self, path: str, fmt: str, start_row: int = 0) -> Iterator[PackedSequence]:
        current: list[int] = []
        first_row, document, last_row = start_row, None, start_row - 1
        for rows in _rows_naming_the_file(path, fmt, start_row):
            last_row = rows[-1][0]
            kept = [(row, doc, text) for row, doc, text in rows if text]
            self.rows_skipped += len(rows) - len(kept)
            rows = kept
            if not rows:
                continue
            # verbose=False: sentences over the model's 512 tokens are expected here (cut below and counted
            # in `sentences_cut`), so the tokenizer's per-call length warning is noise.
            encoded = self.tokenizer([self.cut_text(text) for _, _, text in rows], add_special_tokens=False,
                                     verbose=False)["input_ids"]
            for (row, doc, text), ids in zip(rows, encoded):
                if not ids:
                    continue
                if len(ids) > self.capacity or len(text) > self.max_chars:
                    ids = ids[: self.capacity]
                    self.sentences_cut += 1
                if current and (doc != document or len(current) + len(ids) > self.capacity):
                    yield PackedSequence([self.cls_id, *current, self.sep_id], first_row, row)
                    current = []
                if not current:
                    first_row, document = row, doc
                current.extend(ids)
        if current:
            yield PackedSequence([self.cls_id, *current, self.sep_id], first_row, last_row + 1)


def is_heldout(path: str, first_row: int, rate: float) -> bool:
    """Whether the packed sequence starting at `first_row` of `path` is held out (stable hash)."""
    if rate <= 0:
        return False
    key = f"{os.path.basename(path)}:{first_row}".encode()
    return zlib.crc32(key) % 1_000_000 < rate * 1_000_000


# ----------------------------------------------------------------------------------------------
# One language's stream for one rank


class LanguageStream:
    """This rank's training sequences of one language, endlessly, epoch after epoch, shuffled in windows."""

    def __init__(self, corpus: MonoCorpus, packer: Packer, *, rank: int, world_size: int, seed: int,
                 heldout_rate: float, shuffle_window: int = 1, position: dict[str, int] | None = None):
        if shuffle_window < 1:
            raise UsageError(f"shuffle_window must be >= 1, got {shuffle_window}")
        self.corpus, self.packer = corpus, packer
        self.seed, self.heldout_rate, self.shuffle_window = seed, heldout_rate, shuffle_window
        if len(corpus.files) >= world_size:
            self.files, self.deal = list(corpus.files[rank::world_size]), (0, 1)
        else:
            self.files, self.deal = list(corpus.files), (rank, world_size)
        self.position = {"epoch": 0, "file": 0, "row": 0, "ordinal": 0, "taken": 0, **(position or {})}
        self._sequences: Iterator[tuple[list[int], dict[str, int]]] | None = None

    def _language_key(self) -> int:
        return zlib.crc32(self.corpus.lang.encode())

    def file_order(self, epoch: int) -> list[tuple[str, str]]:
        rng = np.random.default_rng([self.seed, self._language_key(), epoch])
        return [self.files[i] for i in rng.permutation(len(self.files))]

    def _window_order(self, epoch: int, file_index: int, row: int, size: int) -> np.ndarray:
        return np.random.default_rng([self.seed, self._language_key(), epoch, file_index, row, 7]).permutation(size)

    def _generate(self) -> Iterator[tuple[list[int], dict[str, int]]]:
        epoch, file_index = self.position["epoch"], self.position["file"]
        row, ordinal, taken = self.position["row"], self.position["ordinal"], self.position["taken"]
        owner, ranks = self.deal
        while True:
            kept_in_epoch, whole_epoch = 0, file_index == 0 and row == 0 and taken == 0
            order = self.file_order(epoch)
            while file_index < len(order):
                path, fmt = order[file_index]
                packed = self.packer.pack(path, fmt, row)
                while True:
                    window_row, window_ordinal, window = row, ordinal, []
                    for sequence in itertools.islice(packed, self.shuffle_window):
                        ordinal += 1
                        row = sequence.next_row
                        if (ordinal - 1) % ranks == owner and not is_heldout(path, sequence.first_row, self.heldout_rate):
                            window.append(np.asarray(sequence.ids, dtype=np.int32))
                    if row == window_row:  # the file is exhausted
                        break
                    shuffled = self._window_order(epoch, file_index, window_row, len(window))
                    for k in range(taken, len(window)):
                        kept_in_epoch += 1
                        yield window[shuffled[k]].tolist(), {"epoch": epoch, "file": file_index, "row": window_row,
                                                            "ordinal": window_ordinal, "taken": k + 1}
                    taken = 0
                file_index, row, ordinal = file_index + 1, 0, 0
            if kept_in_epoch == 0 and whole_epoch:
                raise UsageError(f"language {self.corpus.lang!r} gives this process no training sequence "
                                 f"(too little text for {ranks} processes, or all of it held out)")
            epoch, file_index = epoch + 1, 0

    def next_sequence(self) -> list[int]:
        if self._sequences is None:
            self._sequences = self._generate()
        ids, self.position = next(self._sequences)
        return ids


def heldout_sequences(corpora: list[MonoCorpus], packer: Packer, rate: float, per_language: int,
                      max_rows_per_language: int = 200_000) -> list[list[int]]:
    """The first `per_language` held-out packed sequences of each language, in file order.

    Reading stops after `max_rows_per_language` rows of a language, so a huge corpus costs a bounded
    pass; a language with no held-out sequence in that span is left out (with a log line).
    """
    found: list[list[int]] = []
    for corpus in corpora:
        taken = 0
        for path, fmt in corpus.files:
            for sequence in packer.pack(path, fmt):
                if sequence.first_row >= max_rows_per_language or taken >= per_language:
                    break
                if is_heldout(path, sequence.first_row, rate):
                    found.append(sequence.ids)
                    taken += 1
            if taken >= per_language:
                break
        if taken == 0:
            logger.info("no held-out sequence for %s (too little text at held-out rate %g)", corpus.lang, rate)
    return found


# ----------------------------------------------------------------------------------------------
# TLM rows


def join_translation(src: list[int], tgt: list[int], src_first: bool, max_seq_length: int) -> list[int]:
    """`[CLS] a [SEP] b [SEP]` from two `[CLS] x [SEP]` rows, trimming the longer side to fit."""
    first, second = (src, tgt) if src_first else (tgt, src)
    a, b = list(first[1:-1]), list(second[1:-1])
    room = max_seq_length - 3
    while len(a) + len(b) > room:
        if len(a) >= len(b):
            a.pop()
        else:
            b.pop()
    return [first[0], *a, first[-1], *b, second[-1]]


class TLMSource:
    """This rank's translation pairs of each step, from `labse-tfrecords` shards."""

    def __init__(self, stream):
        self.stream = stream

    @classmethod
    def open(cls, pattern: str, *, vocab_path: str, global_rows: int, rank: int, world_size: int, seed: int,
             shuffle_window: int, vocab_size: int | None = None) -> "TLMSource":
        from labse_model.data import PairBatchStream, ShardSet, check_schema_vocab, load_schema, resolve_shards

        paths = resolve_shards(pattern)
        check_schema_vocab(load_schema(paths), vocab_path)
        stream = PairBatchStream(ShardSet.open(paths, pattern), global_batch_size=global_rows, rank=rank,
                                 world_size=world_size, seed=seed, shuffle_window=shuffle_window,
                                 vocab_size=vocab_size)
        logger.info("TLM pairs: %d records in %d shards", stream.shards.num_records, len(paths))
        return cls(stream)

    def rows(self, step: int, rng: np.random.Generator, max_seq_length: int) -> list[list[int]]:
        src, tgt = self.stream.pairs(step)
        sides = rng.random(len(src)) < 0.5
        return [join_translation(s, t, bool(first), max_seq_length) for s, t, first in zip(src, tgt, sides)]


# ----------------------------------------------------------------------------------------------
# Batches


def pad_rows(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    mask = np.arange(int(lengths.max())) < lengths[:, None]
    ids = np.full(mask.shape, pad_id, dtype=np.int64)
    ids[mask] = np.fromiter((t for r in rows for t in r), dtype=np.int64, count=int(lengths.sum()))
    return ids, mask.astype(np.int64)


def masked_batch(rows: list[list[int]], spec: MaskingSpec, rng: np.random.Generator, pad_id: int) -> dict[str, torch.Tensor]:
    ids, attention = pad_rows(rows, pad_id)
    masked = mask_tokens(ids, attention, spec, rng)
    return {
        "input_ids": torch.from_numpy(masked.input_ids),
        "attention_mask": torch.from_numpy(attention),
        "mlm_rows": torch.from_numpy(masked.rows),
        "mlm_columns": torch.from_numpy(masked.columns),
        "mlm_labels": torch.from_numpy(masked.labels),
    }


def step_rng(seed: int, step: int, rank: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng([seed, step, rank, purpose])


class PretrainBatches:
    """This rank's batches for steps `start_step, start_step + 1, ...` (an endless iterator).

    Of each rank's `local_rows`, `tlm_rows` are translation pairs and the rest packed monolingual
    text. `position()` is what a checkpoint must hold to continue exactly after the last batch.
    """

    def __init__(self, corpora: list[MonoCorpus], packer: Packer, *, spec: MaskingSpec, local_rows: int,
                 tlm_rows: int, tlm: TLMSource | None, lang_alpha: float, rank: int, world_size: int, seed: int,
                 heldout_rate: float, max_seq_length: int, pad_id: int, shuffle_window: int = 1,
                 start_step: int = 0, position: dict[str, Any] | None = None):
        if tlm_rows and tlm is None:
            raise UsageError("TLM rows were asked for but no pair shards given (--pairs)")
        self.spec, self.local_rows, self.tlm_rows, self.tlm = spec, local_rows, tlm_rows, tlm
        self.rank, self.seed, self.max_seq_length, self.pad_id = rank, seed, max_seq_length, pad_id
        self.languages = [c.lang for c in corpora]
        self.probabilities = language_probabilities(corpora, lang_alpha)
        saved = (position or {}).get("languages", {})
        self.streams = [LanguageStream(c, packer, rank=rank, world_size=world_size, seed=seed,
                                       heldout_rate=heldout_rate, shuffle_window=shuffle_window,
                                       position=saved.get(c.lang)) for c in corpora]
        self.step = start_step

    def __iter__(self) -> "PretrainBatches":
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        step, self.step = self.step, self.step + 1
        mono_rows = self.local_rows - self.tlm_rows
        chosen = step_rng(self.seed, step, self.rank, _LANGUAGE_STREAM).choice(
            len(self.streams), size=mono_rows, p=self.probabilities)
        rows = [self.streams[i].next_sequence() for i in chosen.tolist()]
        if self.tlm_rows:
            rows += self.tlm.rows(step, step_rng(self.seed, step, self.rank, _SIDE_STREAM), self.max_seq_length)
        return masked_batch(rows, self.spec, step_rng(self.seed, step, self.rank, _MASK_STREAM), self.pad_id)

    def position(self) -> dict[str, Any]:
        return {"languages": {s.corpus.lang: dict(s.position) for s in self.streams}}


def heldout_batches(sequences: list[list[int]], spec: MaskingSpec, seed: int, batch_rows: int,
                    pad_id: int) -> list[dict[str, torch.Tensor]]:
    """The held-out set, masked once with a fixed generator so every evaluation scores the same targets."""
    rng = np.random.default_rng([seed, _HELDOUT_STREAM])
    return [masked_batch(sequences[i : i + batch_rows], spec, rng, pad_id) for i in range(0, len(sequences), batch_rows)]
