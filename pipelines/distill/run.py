"""labse-distill as a library call: `distill(...)` runs the whole recipe into a static embedder directory.

    teacher pass (Beam) -> PCA + SIF init (numpy) -> alignment + contrastive training (torch) -> directory

The work folder (default `OUTPUT.work`, local) keeps what a rerun reuses: the teacher's vectors
(`teacher-<fingerprint>/`, complete only with `_SUCCESS`) and the training checkpoint, so a run
stopped at any point continues where it was.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from pipelines.distill.config import DistillConfig
from pipelines.distill.corpus import (TOKENS, SentenceSource, TeacherVectors, read_teacher_vectors, resolve_teacher,
                                      token_text)
from pipelines.distill.table import fit_projection, initial_table, sif_weights, token_counts
from pipelines.distill.train import Checkpoint, TrainingData, train
from pipelines.io.config_options import UsageError

logger = logging.getLogger(__name__)

STAGE = "labse-distill"
PROJECTION_SAMPLE = 200_000  # sentence vectors the PCA is fitted on (the SVD's cost grows with them)
UNITS = ("sentences", "tokens", "files", "pairs")


@dataclass
class DistillResult:
    output: str
    stats: dict


def _fingerprint(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _file_digest(path: str) -> str:
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()


def teacher_pass(work: Path, sources: list[SentenceSource], vocab: list[str], teacher: str, config: DistillConfig,
                 beam_args: Sequence[str], log: Callable[[str], None]) -> tuple[Path, dict]:
    """The teacher's vectors for the corpus and the vocabulary, from the work folder when a complete
    pass with the same inputs is there, else from a Beam run; (folder, its tally)."""
    from pipelines.io.completion import mark_complete, read_completion

    key = _fingerprint(teacher, [dataclasses.astuple(s) for s in sources], vocab, config.sentences_per_language,
                       *([config.synthetic_per_language] if config.synthetic_per_language else []))
    folder = work / f"teacher-{key}"
    done = read_completion(folder)
    if done is not None:
        log(f"teacher vectors: reusing {folder}")
        return folder, done.get("stats", {}).get("tally", {})
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.distill.transforms import build_teacher_pipeline
    from pipelines.text.wordpiece import SPECIAL_TOKENS

    # An interrupted pass of these inputs left chunks: each is kept when its texts match (_EmbedChunk).
    (folder / "sentences").mkdir(parents=True, exist_ok=True)
    (folder / "tokens").mkdir(exist_ok=True)
    (folder / "synthetic").mkdir(exist_ok=True)
    surfaces = sorted({token_text(t) for t in vocab if t not in SPECIAL_TOKENS})
    log(f"teacher pass ({teacher}): {len(sources)} input(s), {len(surfaces):,} vocabulary surfaces -> {folder}")
    started = time.perf_counter()
    tally_path = folder / "tally.json"
    with beam.Pipeline(options=PipelineOptions(list(beam_args))) as pipeline:
        tally = build_teacher_pipeline(pipeline, sources, surfaces, teacher, str(folder / "sentences"),
                                       str(folder / "tokens"), config.sentences_per_language, config.threads,
                                       config.synthetic_per_language, str(folder / "synthetic"))
        tally | "WriteTally" >> beam.Map(lambda t, path=str(tally_path): Path(path).write_text(json.dumps(dict(t))))
    tally = json.loads(tally_path.read_text())
    log(f"teacher pass done in {time.perf_counter() - started:.0f} s: {tally.get('sentences.kept', 0):,} sentences, "
        f"{tally.get('tokens.kept', 0):,} token surfaces")
    mark_complete(folder, {"tally": tally}, stage=STAGE)
    return folder, tally


def read_pairs(paths: Sequence[str]) -> list[tuple[str, str]]:
    """(src, tgt) rows of labse-mine / labse-score Parquet outputs (complete ones: `_SUCCESS`)."""
    import pyarrow.parquet as pq
    from apache_beam.io.filesystems import FileSystems

    from pipelines.io.completion import require_stage_output

    rows: list[tuple[str, str]] = []
    for path in paths:
        require_stage_output(path, f"--pairs {path}", plain_allowed=True)
        pattern = path if path.endswith(".parquet") or any(c in path for c in "*?[") else path.rstrip("/") + "/*.parquet"
        try:
            files = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
        except Exception:
            files = []
        if not files:
            raise UsageError(f"--pairs {path}: no Parquet files (a labse-mine or labse-score output)")
        for name in files:
            with FileSystems.open(name) as handle:
                table = pq.read_table(io.BytesIO(handle.read()))
            if not {"src", "tgt"} <= set(table.column_names):
                raise UsageError(f"--pairs {name}: no src/tgt columns (columns: {table.column_names})")
            rows += [(s, t) for s, t in zip(table.column("src").to_pylist(), table.column("tgt").to_pylist())
                     if isinstance(s, str) and isinstance(t, str) and s.strip() and t.strip()]
    return rows


def mine_teacher_pairs(vectors: TeacherVectors, pivot: str, min_margin: float) -> tuple[list[tuple[str, str]], dict]:
    """Pairs the teacher mines between each language and `pivot` (ratio margin, max strategy)."""
    from pipelines.mine.margin import MarginConfig, mine

    pairs, per_language = [], {}
    if pivot not in vectors.texts:
        return pairs, per_language
    y = vectors.vectors[pivot]
    for lang in vectors.languages:
        if lang == pivot:
            continue
        x = vectors.vectors[lang]
        if len(x) < 2 or len(y) < 2:
            continue
        found = mine(x / np.linalg.norm(x, axis=1, keepdims=True), y / np.linalg.norm(y, axis=1, keepdims=True),
                     MarginConfig(k=min(4, len(x) - 1, len(y) - 1), threshold=min_margin))
        kept = [(vectors.texts[lang][i], vectors.texts[pivot][j]) for i, j in zip(found.src, found.tgt)]
        per_language[f"{lang}-{pivot}"] = len(kept)
        pairs += kept
    return pairs, per_language


def distill(output: str, vocab_path: str, sources: list[SentenceSource], config: DistillConfig, *,
            pairs: Sequence[str] = (), work_dir: str | None = None, beam_args: Sequence[str] = (),
            log: Callable[[str], None] = logger.info) -> DistillResult:
    """Distil a static embedder into `output` (locked and prepared by the caller, `cli.run_distill`)."""
    import tokenizers

    from pipelines.accounting import accounting_section
    from pipelines.embed.static import StaticMetadata, save_static_embedder, tokenizer_json
    from pipelines.io.completion import mark_complete, write_stats_json
    from pipelines.text.wordpiece import load_vocab

    started = time.perf_counter()
    vocab = load_vocab(vocab_path)
    teacher, reason = resolve_teacher(config.teacher, [s.lang for s in sources])
    work = Path(work_dir or f"{output.rstrip('/')}.work")
    work.mkdir(parents=True, exist_ok=True)
    folder, tally = teacher_pass(work, sources, vocab, teacher, config, beam_args, log)
    if not tally.get("sentences.kept"):
        unreadable = tally.get("files.errored.unreadable_file", 0)
        raise UsageError(f"the inputs hold no sentences ({tally.get('files.read', 0)} file(s) read, {unreadable} "
                         "unreadable): nothing to distil from")
    corpus = read_teacher_vectors(folder / "sentences")
    surfaces = read_teacher_vectors(folder / "tokens")
    teacher_dim = next(iter(corpus.vectors.values())).shape[1]
    if config.dims > teacher_dim:
        raise UsageError(f"--dims {config.dims} is wider than the teacher's {teacher_dim} dimensions")

    tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json(vocab_path))
    tokenizer.no_padding()
    tokenizer.no_truncation()

    def ids_of(texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, np.int64) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    texts = [text for lang in corpus.languages for text in corpus.texts[lang]]
    teacher_vectors = np.concatenate([corpus.vectors[lang] for lang in corpus.languages])
    sentence_ids = ids_of(texts)
    rng = np.random.default_rng(config.seed)
    sample = rng.choice(len(texts), min(len(texts), PROJECTION_SAMPLE), replace=False)
    projection = fit_projection(teacher_vectors[sample], config.dims)
    weights = sif_weights(token_counts(sentence_ids, len(vocab)), config.sif_coefficient)
    table, initialised = initial_table(vocab, dict(zip(surfaces.texts.get(TOKENS, []),
                                                       surfaces.vectors.get(TOKENS, np.zeros((0, 1))))), projection)
    log(f"init: {initialised:,}/{len(vocab):,} token rows from {teacher}, PCA {teacher_dim} -> {config.dims} dims "
        f"keeps {projection.explained:.1%} of the sentence vectors' variance")

    synthetic = read_teacher_vectors(folder / "synthetic") if config.synthetic_per_language else None
    if synthetic is not None and synthetic.languages:  # alignment targets only: not in the PCA, SIF or mined pairs
        sentence_ids += ids_of([text for lang in synthetic.languages for text in synthetic.texts[lang]])
        teacher_vectors = np.concatenate([teacher_vectors, *(synthetic.vectors[lang] for lang in synthetic.languages)])
    filled = [i for i, row in enumerate(sentence_ids) if len(row)]
    data = TrainingData([sentence_ids[i] for i in filled], projection(teacher_vectors[filled]))
    pair_texts, per_pair_language, sources_of_pairs = [], {}, []
    if pairs:
        pair_texts = read_pairs(pairs)
        sources_of_pairs.append(f"{len(pair_texts):,} given")
    if config.mined_pairs or not pairs:
        mined, per_pair_language = mine_teacher_pairs(corpus, config.pivot_language, config.mined_pairs_min_margin)
        pair_texts += mined
        sources_of_pairs.append(f"{len(mined):,} mined by {teacher} (ratio margin >= {config.mined_pairs_min_margin}, "
                                f"pivot {config.pivot_language})")
    pair_source = " + ".join(sources_of_pairs)
    pair_ids = list(zip(ids_of([s for s, _ in pair_texts]), ids_of([t for _, t in pair_texts])))
    usable = [i for i, (s, t) in enumerate(pair_ids) if len(s) and len(t)]
    data.pairs = [pair_ids[i] for i in usable]
    data.pair_keys = [pair_texts[i] for i in usable]
    synthetic_counts = {lang: len(synthetic.texts[lang]) for lang in synthetic.languages} if synthetic else {}
    log(f"training data: {len(data.sentences):,} sentences ({sum(synthetic_counts.values()):,} synthetic) in "
        f"{len(corpus.languages)} languages, "
        f"{len(data.pairs):,} pairs ({pair_source})")

    fingerprint = _fingerprint(STAGE, folder.name, _file_digest(vocab_path), dataclasses.asdict(config),
                               list(pairs), len(data.pairs))
    checkpoint = Checkpoint(work / f"checkpoint-{fingerprint}.safetensors", fingerprint)
    trained, history = train(table, weights, data, config, checkpoint, log=log)

    metadata = StaticMetadata(
        dims=config.dims, vocab_size=len(vocab), teacher=teacher, languages=corpus.languages,
        data=[f"{s.lang}={s.pattern}" for s in sources] + [f"pairs={p}" for p in pairs],
        weighting=f"sif a={config.sif_coefficient:g} on the corpus' token counts",
        steps={"init": {"tokens_from_teacher": initialised, "pca_explained": round(projection.explained, 4)},
               "pairs": {"source": pair_source, "count": len(data.pairs), "per_language_pair": per_pair_language},
               "history": history, "teacher_reason": reason})
    save_static_embedder(output, vocab_path, trained, weights, metadata)

    sentences_read = tally.get("sentences.read", 0)
    counts = {
        "sentences.read": sentences_read, "sentences.kept": tally.get("sentences.kept", 0),
        "sentences.dropped.empty_text": sentences_read - tally.get("sentences.filled", 0),
        "sentences.dropped.duplicate": tally.get("sentences.filled", 0) - tally.get("sentences.distinct", 0),
        "sentences.dropped.over_sample": tally.get("sentences.distinct", 0) - tally.get("sentences.kept", 0),
        "tokens.read": len(vocab), "tokens.kept": initialised,
        "tokens.dropped.reserved_or_shared_surface": len(vocab) - initialised,
        "files.read": tally.get("files.read", 0), "files.kept": tally.get("files.kept", 0),
        **{k: v for k, v in tally.items() if k.startswith("files.errored")},
        "pairs.read": len(pair_texts), "pairs.kept": len(data.pairs),
        "pairs.dropped.no_tokens": len(pair_texts) - len(data.pairs),
    }
    stats = {"stage": STAGE, "teacher": teacher, "teacher_reason": reason, "config": dataclasses.asdict(config),
             **accounting_section(counts, UNITS),
             "sentences_per_language": {lang: len(corpus.texts[lang]) for lang in corpus.languages},
             "synthetic_sentences_per_language": synthetic_counts,
             "pairs_per_language_pair": per_pair_language, "history": history,
             "seconds": round(time.perf_counter() - started, 1)}
    write_stats_json(os.path.join(output, "stats.json"), stats)
    mark_complete(output, stats, stage=STAGE)
    return DistillResult(output, stats)
