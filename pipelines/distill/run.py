"""labse-distill's run through the stage kit (`pipelines.stage`): `DistillRun` gives `run_stage` /
`execute_stage` its inputs' check, its Beam job (the teacher pass) and its `finish` (the training).

    teacher pass (Beam, WORK/teacher-<fingerprint>/) -> PCA + SIF init (numpy)
        -> alignment + contrastive training (torch, one machine) -> OUTPUT (model, stats.json, _SUCCESS last)

The work folder (`--work-dir`, default `OUTPUT.work`; local or gs://, beside a gs:// output on
Dataflow) keeps what a rerun reuses: the teacher's vectors (`teacher-<fingerprint>/`, complete only
with its `_SUCCESS`, written by the job's last step) and the training checkpoint (safetensors,
uploaded after every epoch when the work folder is remote), so a run stopped at any point continues
where it was. The output is locked, refused or replaced (`--overwrite`) by the kit; the work folder
is never removed by a run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from pipelines.distill.config import DistillConfig
from pipelines.distill.corpus import TOKENS, SentenceSource, TeacherVectors, read_teacher_vectors, resolve_teacher
from pipelines.distill.table import fit_projection, initial_table, sif_weights, token_counts
from pipelines.distill.train import Checkpoint, TrainingData, train
from pipelines.io import storage
from pipelines.io.config_options import UsageError

logger = logging.getLogger(__name__)

STAGE = "labse-distill"
PROJECTION_SAMPLE = 200_000  # sentence vectors the PCA is fitted on (the SVD's cost grows with them)
UNITS = ("sentences", "tokens", "files", "pairs")


def _fingerprint(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextmanager
def local_copy(path: str) -> Iterator[str]:
    """`path` as a local file for the block (a gs:// object is downloaded to a temporary folder)."""
    if not storage.is_remote(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="labse-distill-") as folder:
        local = Path(folder) / path.rsplit("/", 1)[-1]
        storage.download(path, local)
        yield str(local)


class MirroredCheckpoint(Checkpoint):
    """A checkpoint in a remote work folder: trained against a local copy (`storage.cache_dir`),
    uploaded after every save (one object, complete or absent), downloaded before the first load,
    so a run on another machine resumes where the last one stopped."""

    def __init__(self, url: str, fingerprint: str):
        super().__init__(storage.cache_dir("distill", storage.url_key(url)) / url.rsplit("/", 1)[-1], fingerprint)
        self.url = url

    def load(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if storage.exists(self.url):
            storage.download(self.url, self.path)
        else:
            self.path.unlink(missing_ok=True)  # a stale local copy of another run never resumes
        return super().load()

    def save(self, header: dict, tensors: dict[str, np.ndarray]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        super().save(header, tensors)
        storage.upload(self.path, self.url)


def checkpoint_at(path: str, fingerprint: str) -> Checkpoint:
    return MirroredCheckpoint(path, fingerprint) if storage.is_remote(path) else Checkpoint(path, fingerprint)


def publish_model(output: str, write: Callable[[str], None]) -> None:
    """`write(folder)` writes the model directory; locally it becomes `output` atomically (a staging
    folder renamed: `save_static_embedder`); on gs:// it is written to a temporary folder and its
    files uploaded below `output`, whose `_SUCCESS` (written after them) makes it visible."""
    if not storage.is_remote(output):
        write(output)
        return
    with tempfile.TemporaryDirectory(prefix="labse-distill-model-") as folder:
        local = os.path.join(folder, "model")
        write(local)
        for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            storage.upload(path, storage.join(output, path.relative_to(local).as_posix()))


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


@dataclass
class DistillRun:
    """One labse-distill run, as the stage kit's arguments (`stage_arguments()`): `check_inputs`,
    `wire` (the teacher pass, or `NOTHING_TO_RUN` when a complete pass of these inputs is in the work
    folder) and `finish` (training, the model, its stats and `_SUCCESS`). `sentences` are labse-clean
    outputs (or their folders), `texts` LANG=FILE specs, `pairs` labse-mine/labse-score outputs."""

    output: str
    vocab: str
    config: DistillConfig
    sentences: Sequence[str] = ()
    texts: Sequence[str] = ()
    pairs: Sequence[str] = ()
    work_dir: str | None = None
    beam_args: Sequence[str] = ()
    overwrite: bool = False
    log: Callable[[str], None] = logger.info
    sources: list[SentenceSource] = field(default_factory=list)  # set by check_inputs
    teacher: str = ""
    teacher_reason: str = ""
    folder: str = ""  # the teacher pass's folder in the work folder, set by wire
    stats: dict = field(default_factory=dict)  # set by finish

    def __post_init__(self) -> None:
        self.output = storage.strip(self.output)
        self.work = storage.strip(self.work_dir or f"{self.output}.work")

    @property
    def inputs(self) -> list[str]:
        return [self.vocab, *self.sentences, *[t.split("=", 1)[-1] for t in self.texts], *self.pairs]

    def stage_arguments(self) -> dict:
        """The keyword arguments of `pipelines.stage.run_stage` / `execute_stage`."""
        return dict(output=self.output, overwrite=self.overwrite, beam_args=list(self.beam_args),
                    inputs=self.inputs, check_inputs=self.check_inputs, wire=self.wire, finish=self.finish)

    def check_inputs(self) -> None:
        """Every input present and complete, the teacher known for their languages, the work
        folder apart from the inputs and the output; UsageError (one line) otherwise."""
        from pipelines.distill.corpus import sentence_sources
        from pipelines.embed.base import EmbedderError
        from pipelines.embed.embedders import check_embedder_spec
        from pipelines.io.completion import require_stage_output
        from pipelines.io.overlap import check_output_apart, collision

        for path in self.sentences:
            require_stage_output(path, f"--sentences {path}", plain_allowed=True)
        self.sources = sentence_sources(list(self.sentences), list(self.texts))
        if not storage.isfile(self.vocab):
            raise UsageError(f"--vocab {self.vocab}: no such file (labse-vocab's vocab.txt)")
        self.teacher, self.teacher_reason = resolve_teacher(self.config.teacher, [s.lang for s in self.sources])
        if self.config.teacher.lower() != "auto":
            try:
                check_embedder_spec(self.config.teacher)
            except EmbedderError as error:
                raise UsageError(f"--teacher: {error}") from error
        check_output_apart(self.work, self.inputs, option="--work-dir")
        relation = collision(self.output, self.work) or collision(self.work, self.output)
        if relation:
            raise UsageError(f"--work-dir {self.work} and --output {self.output} overlap: the work folder outlives "
                             "the output (--overwrite replaces the output, a rerun reuses the work): keep them apart")

    def wire(self, pipeline):
        """The teacher pass into `WORK/teacher-<fingerprint>/`, unless a complete one is there."""
        from pipelines.distill.transforms import build_teacher_pipeline
        from pipelines.io.completion import read_completion
        from pipelines.stage import NOTHING_TO_RUN, runs_on_dataflow
        from pipelines.text.wordpiece import load_vocab

        with local_copy(self.vocab) as vocab_file:
            vocab = load_vocab(vocab_file)
        if not storage.is_remote(self.work) and runs_on_dataflow(pipeline.options):
            raise UsageError(f"--work-dir {self.work}: Dataflow's workers write the teacher's vectors there, so it "
                             "must be on Cloud Storage (gs://...; the default is OUTPUT.work)")
        synthetic = self.config.synthetic_per_language
        key = _fingerprint(self.teacher, [dataclasses.astuple(s) for s in self.sources], vocab,
                           self.config.sentences_per_language, *([synthetic] if synthetic else []))
        self.folder = storage.join(self.work, f"teacher-{key}")
        if read_completion(self.folder) is not None:
            self.log(f"teacher vectors: reusing {self.folder}")
            return NOTHING_TO_RUN
        self.log(f"teacher pass ({self.teacher}): {len(self.sources)} input(s), {len(vocab):,} vocabulary tokens "
                 f"-> {self.folder}")
        # An interrupted pass of these inputs left chunks: each is kept when its texts match (_EmbedChunk).
        return build_teacher_pipeline(pipeline, self.sources, self.vocab, len(vocab), self.teacher, self.folder,
                                      self.config.sentences_per_language, self.config.threads, STAGE, synthetic)

    def finish(self) -> dict:
        """After the teacher pass: the table's training, the model into the output, its stats and
        `_SUCCESS` last; the stats."""
        with local_copy(self.vocab) as vocab_file:
            self.stats = self._train_and_publish(vocab_file)
        return self.stats

    def _train_and_publish(self, vocab_path: str) -> dict:
        import tokenizers

        from pipelines.accounting import accounting_section
        from pipelines.embed.static import StaticMetadata, save_static_embedder, tokenizer_json
        from pipelines.io.completion import finish_output, read_completion
        from pipelines.text.wordpiece import load_vocab

        config, started = self.config, time.perf_counter()
        vocab = load_vocab(vocab_path)
        tally = (read_completion(self.folder) or {}).get("stats", {}).get("tally", {})
        if not tally.get("sentences.kept"):
            unreadable = tally.get("files.errored.unreadable_file", 0)
            raise UsageError(f"the inputs hold no sentences ({tally.get('files.read', 0)} file(s) read, {unreadable} "
                             "unreadable): nothing to distil from")
        corpus = read_teacher_vectors(storage.join(self.folder, "sentences"))
        surfaces = read_teacher_vectors(storage.join(self.folder, "tokens"))
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
        self.log(f"init: {initialised:,}/{len(vocab):,} token rows from {self.teacher}, PCA {teacher_dim} -> "
                 f"{config.dims} dims keeps {projection.explained:.1%} of the sentence vectors' variance")

        corpus_filled = sum(1 for row in sentence_ids if len(row))
        synthetic = (read_teacher_vectors(storage.join(self.folder, "synthetic"))
                     if config.synthetic_per_language else None)
        if synthetic is not None and synthetic.languages:  # alignment targets only: not in the PCA, SIF or mined pairs
            sentence_ids += ids_of([text for lang in synthetic.languages for text in synthetic.texts[lang]])
            teacher_vectors = np.concatenate([teacher_vectors, *(synthetic.vectors[lang]
                                                                 for lang in synthetic.languages)])
        synthetic_counts = {lang: len(synthetic.texts[lang]) for lang in synthetic.languages} if synthetic else {}
        filled = [i for i, row in enumerate(sentence_ids) if len(row)]
        data = TrainingData([sentence_ids[i] for i in filled], projection(teacher_vectors[filled]))
        pair_texts, per_pair_language, sources_of_pairs = [], {}, []
        if self.pairs:
            pair_texts = read_pairs(self.pairs)
            sources_of_pairs.append(f"{len(pair_texts):,} given")
        if config.mined_pairs or not self.pairs:
            mined, per_pair_language = mine_teacher_pairs(corpus, config.pivot_language, config.mined_pairs_min_margin)
            pair_texts += mined
            sources_of_pairs.append(f"{len(mined):,} mined by {self.teacher} (ratio margin >= "
                                    f"{config.mined_pairs_min_margin}, pivot {config.pivot_language})")
        pair_source = " + ".join(sources_of_pairs)
        pair_ids = list(zip(ids_of([s for s, _ in pair_texts]), ids_of([t for _, t in pair_texts])))
        usable = [i for i, (s, t) in enumerate(pair_ids) if len(s) and len(t)]
        data.pairs = [pair_ids[i] for i in usable]
        data.pair_keys = [pair_texts[i] for i in usable]
        self.log(f"training data: {len(data.sentences):,} sentences ({sum(synthetic_counts.values()):,} synthetic) "
                 f"in {len(corpus.languages)} languages, "
                 f"{len(data.pairs):,} pairs ({pair_source})")

        fingerprint = _fingerprint(STAGE, self.folder.rsplit("/", 1)[-1],
                                   hashlib.sha1(Path(vocab_path).read_bytes()).hexdigest(),
                                   dataclasses.asdict(config), list(self.pairs), len(data.pairs))
        checkpoint = checkpoint_at(storage.join(self.work, f"checkpoint-{fingerprint}.safetensors"), fingerprint)
        trained, history = train(table, weights, data, config, checkpoint, log=self.log)

        metadata = StaticMetadata(
            dims=config.dims, vocab_size=len(vocab), teacher=self.teacher, languages=corpus.languages,
            data=[f"{s.lang}={s.pattern}" for s in self.sources] + [f"pairs={p}" for p in self.pairs],
            weighting=f"sif a={config.sif_coefficient:g} on the corpus' token counts",
            steps={"init": {"tokens_from_teacher": initialised, "pca_explained": round(projection.explained, 4)},
                   "pairs": {"source": pair_source, "count": len(data.pairs), "per_language_pair": per_pair_language},
                   "history": history, "teacher_reason": self.teacher_reason})
        publish_model(self.output, lambda folder: save_static_embedder(folder, vocab_path, trained, weights, metadata))

        kept_by_pass = tally.get("sentences.kept", 0)
        counts = {
            "sentences.read": tally.get("sentences.read", 0), "sentences.kept": corpus_filled,
            "sentences.dropped.empty_text": tally.get("sentences.read", 0) - tally.get("sentences.filled", 0),
            "sentences.dropped.duplicate": tally.get("sentences.filled", 0) - tally.get("sentences.distinct", 0),
            "sentences.dropped.over_sample": tally.get("sentences.distinct", 0) - kept_by_pass,
            "sentences.dropped.no_tokens": kept_by_pass - corpus_filled,
            "tokens.read": len(vocab), "tokens.kept": initialised,
            "tokens.dropped.reserved_or_shared_surface": len(vocab) - initialised,
            "files.read": tally.get("files.read", 0), "files.kept": tally.get("files.kept", 0),
            **{k: v for k, v in tally.items() if k.startswith("files.errored")},
            "pairs.read": len(pair_texts), "pairs.kept": len(data.pairs),
            "pairs.dropped.no_tokens": len(pair_texts) - len(data.pairs),
        }
        stats = {"stage": STAGE, "teacher": self.teacher, "teacher_reason": self.teacher_reason,
                 "config": dataclasses.asdict(config), **accounting_section(counts, UNITS),
                 "sentences_per_language": {lang: len(corpus.texts[lang]) for lang in corpus.languages},
                 "synthetic_sentences_per_language": synthetic_counts,
                 "pairs_per_language_pair": per_pair_language, "history": history,
                 "teacher_pass": self.folder, "checkpoint": str(getattr(checkpoint, "url", checkpoint.path)),
                 "seconds": round(time.perf_counter() - started, 1)}
        finish_output(self.output, stats, stage=STAGE)  # stats.json, then _SUCCESS last
        return stats


def distill_summary(stats: dict, output: str) -> str:
    """labse-distill's closing lines (`summary_text`): the sentences' books, then the model written,
    its teacher, languages and pairs, the training's last losses and the work folder. Sentences
    over `--sentences-per-language` are a sample's rest, not a degenerate result: `summary_text`'s
    "< 1% kept" warning is left out when the sample is what keeps so few."""
    from pipelines.accounting import summary_text

    languages = stats.get("sentences_per_language", {})
    books = stats.get("accounting", {})
    sentences, pairs = books.get("sentences", {}), books.get("pairs", {})
    losses = ", ".join(f"{row['phase']} {row['loss']}" for row in stats.get("history", [])[-2:])
    decisions = [f"wrote {output}: {stats.get('config', {}).get('dims')} dims, teacher {stats.get('teacher')} "
                 f"({stats.get('teacher_reason')}), {len(languages)} languages "
                 f"({', '.join(f'{lang} {n:,}' for lang, n in sorted(languages.items()))} sentences)",
                 f"pairs: {pairs.get('kept', 0):,} trained on of {pairs.get('read', 0):,}; last losses: {losses or 'none'}",
                 f"teacher vectors {stats.get('teacher_pass')}, checkpoint {stats.get('checkpoint')} (a rerun reuses "
                 "both)"]
    text = summary_text(STAGE, stats, "sentences", decisions)
    sampled = sentences.get("kept", 0) + sentences.get("dropped", {}).get("over_sample", 0)
    if sampled >= 0.01 * sentences.get("read", 0):
        text = "\n".join(line for line in text.splitlines() if not line.startswith("WARNING only "))
    return text
