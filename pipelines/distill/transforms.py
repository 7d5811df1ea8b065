"""The teacher's pass over the corpus, as Beam: the costly part of a distillation at scale (a
sentence through e5-small costs what ~400 through the static table do), so it runs where Beam runs
(Dataflow, or DirectRunner here) and writes vectors the table's training reads.

    (group, text) -> cleaned, deduplicated, capped per group -> chunks -> teacher -> NAME.npy + NAME.txt

A group is a language, or the vocabulary's tokens (`corpus.TOKENS`). The output folder is in the
`vectors:DIR` layout (`pipelines.embed.saved_vectors`), so `--embedder vectors:DIR` mines with it too.
"""
from __future__ import annotations

import io
from typing import Iterable

import apache_beam as beam
import numpy as np

from pipelines.accounting import SumTallies
from pipelines.distill.corpus import SentenceSource
from pipelines.progress import worker_tracker
from pipelines.stage import stable_hash

CHUNK = 2048  # sentences per written NAME.npy: one teacher call's worth of work and one file


def _clean(text) -> str:
    return " ".join(str(text).split()) if isinstance(text, str) else ""


class _ReadSource(beam.DoFn):
    """One SentenceSource -> (lang, text); an unreadable file is counted (files.errored) and skipped."""

    def process(self, source: SentenceSource):
        from apache_beam.io.filesystems import FileSystems

        try:
            paths = sorted(m.path for m in FileSystems.match([source.pattern])[0].metadata_list)
        except Exception:
            paths = []
        for path in paths:
            try:
                with FileSystems.open(path) as handle:
                    data = handle.read()
                if source.kind == "parquet":
                    import pyarrow.parquet as pq

                    texts = pq.read_table(io.BytesIO(data), columns=["text"]).column("text").to_pylist()
                else:  # FileSystems.open has already decompressed a .gz / .bz2 file
                    texts = data.decode("utf-8").splitlines()
            except Exception:  # a damaged file must not stop the run: counted, named in stats.json
                yield beam.pvalue.TaggedOutput("tally", {"files.read": 1, "files.errored.unreadable_file": 1})
                continue
            yield beam.pvalue.TaggedOutput("tally", {"files.read": 1, "files.kept": 1})
            for text in texts:
                yield source.lang, text


class _EmbedChunk(beam.DoFn):
    """(group, chunk number, texts) -> GROUP.part-N.npy + .txt in `output`, written atomically; a
    chunk already there with the same texts (a pass that was interrupted) is kept, not embedded again."""

    def __init__(self, teacher: str, output: str, threads: int):
        self.teacher, self.output, self.threads = teacher, output, threads

    def setup(self):
        from pipelines.embed.embedders import load_embedder

        self._embedder = load_embedder(self.teacher, threads=self.threads)

    def process(self, element):
        from pipelines.io.atomic import write_bytes_atomic

        group, number, texts = element
        worker_tracker("sentences").advance(len(texts))
        name = f"{self.output}/{group}.part-{number:05d}"
        lines = ("\n".join(texts) + "\n").encode("utf-8")
        if _already_written(name, lines):  # an interrupted pass of the same inputs: this chunk is done
            yield {"sentences.embedded": len(texts), f"embedded.{group}": len(texts), "chunks.reused": 1}
            return
        vectors = self._embedder.encode(texts).astype(np.float16)
        buffer = io.BytesIO()
        np.save(buffer, vectors, allow_pickle=False)
        write_bytes_atomic(name + ".txt", lines)
        write_bytes_atomic(name + ".npy", buffer.getvalue())  # last: an .npy always has its .txt
        yield {"sentences.embedded": len(texts), f"embedded.{group}": len(texts)}


def _already_written(name: str, lines: bytes) -> bool:
    """NAME.npy exists and NAME.txt holds exactly these lines (the .npy is written last)."""
    from apache_beam.io.filesystems import FileSystems

    try:
        if not FileSystems.exists(name + ".npy"):
            return False
        with FileSystems.open(name + ".txt") as handle:
            return handle.read() == lines
    except Exception:  # unreadable: embed again
        return False


def _sample_order(text: str) -> tuple[int, str]:
    return stable_hash(text), text


def _chunks(group_texts: tuple[str, list[str]]) -> Iterable[tuple[str, int, list[str]]]:
    group, texts = group_texts
    texts = sorted(texts, key=_sample_order)
    for number, start in enumerate(range(0, len(texts), CHUNK)):
        yield group, number, texts[start:start + CHUNK]


class TeacherPass(beam.PTransform):
    """(group, text) -> teacher vectors written to `output`; yields tallies (one dict per step).

    Per group: empty texts and repeats are dropped (counted), then at most `cap` texts are kept,
    those with the smallest crc32 (the same sample on every runner and rerun)."""

    def __init__(self, teacher: str, output: str, cap: int, threads: int = 1, synthetic: int = 0,
                 synthetic_output: str | None = None):
        super().__init__()
        self.teacher, self.output, self.cap, self.threads = teacher, output, cap, threads
        self.synthetic, self.synthetic_output = synthetic, synthetic_output

    def expand(self, pairs):
        cleaned = pairs | "Clean" >> beam.Map(lambda kv: (kv[0], _clean(kv[1])))
        tallies = [cleaned | "CountRead" >> beam.Map(lambda kv: {"sentences.read": 1})]
        filled = cleaned | "DropEmpty" >> beam.Filter(lambda kv: bool(kv[1]))
        tallies.append(filled | "CountFilled" >> beam.Map(lambda kv: {"sentences.filled": 1}))
        distinct = filled | "Distinct" >> beam.Distinct()
        tallies.append(distinct | "CountDistinct" >> beam.Map(lambda kv: {"sentences.distinct": 1}))
        # A combiner, so a worker holds at most `cap` texts of a language, however large the corpus.
        sampled = distinct | "Cap" >> beam.combiners.Top.PerKey(self.cap, key=_sample_order, reverse=True)
        tallies.append(sampled | "CountKept" >> beam.Map(lambda kv: {"sentences.kept": len(kv[1])}))
        written = (sampled
                   | "Chunks" >> beam.FlatMap(_chunks)
                   | "Spread" >> beam.Reshuffle()
                   | "Teacher" >> beam.ParDo(_EmbedChunk(self.teacher, self.output, self.threads)))
        tallies.append(written)
        if self.synthetic and self.synthetic_output:
            # Drawn from the kept sample, so a worker holds one language's `cap` texts, as above.
            tallies.append(sampled
                           | "Synthesise" >> beam.Map(_synthesise, self.synthetic)
                           | "SyntheticChunks" >> beam.FlatMap(_chunks)
                           | "SpreadSynthetic" >> beam.Reshuffle()
                           | "TeacherSynthetic" >> beam.ParDo(_EmbedChunk(self.teacher, self.synthetic_output,
                                                                          self.threads))
                           | "SyntheticKeys" >> beam.Map(_renamed, "synthetic"))
        return tallies | "AllTallies" >> beam.Flatten()


def _synthesise(group_texts: tuple[str, list[str]], n: int) -> tuple[str, list[str]]:
    from pipelines.distill.synthetic import synthetic_sentences

    group, texts = group_texts
    return group, synthetic_sentences(texts, n)


def _renamed(tally: dict, unit: str) -> dict:
    """A teacher pass's `sentences.*` counts under another unit (`tokens.*`, `synthetic.*`)."""
    return {f"{unit}.{key.split('.', 1)[1]}": value for key, value in tally.items() if key.startswith("sentences.")}


def vocabulary_surfaces(vocab_path: str) -> list[str]:
    """What the teacher embeds of a vocabulary: each token's surface (`corpus.token_text`), once,
    sorted, without the reserved tokens. Read where it runs (a worker: the file is not in the job)."""
    from apache_beam.io.filesystems import FileSystems

    from pipelines.distill.corpus import token_text
    from pipelines.text.wordpiece import SPECIAL_TOKENS, vocab_lines

    with FileSystems.open(vocab_path, compression_type="uncompressed") as handle:
        tokens = vocab_lines(handle.read(), vocab_path)
    return sorted({token_text(t) for t in tokens if t not in SPECIAL_TOKENS})


def _write_completion(tally: dict, folder: str, stage: str) -> None:
    from pipelines.io.completion import finish_output

    finish_output(folder, {"stage": stage, "tally": dict(tally)}, stage=stage)


def build_teacher_pipeline(pipeline, sources: list[SentenceSource], vocab_path: str, vocab_size: int, teacher: str,
                           folder: str, cap: int, threads: int, stage: str, synthetic: int = 0):
    """Both teacher passes (the corpus with `synthetic` synthetic sentences a language, the
    vocabulary's surfaces) in one pipeline, into `folder/sentences`, `folder/synthetic` and
    `folder/tokens`; its last step writes the summed tally as `folder`'s
    stats and `_SUCCESS` (on a worker: a finished Dataflow job is complete without its launcher)."""
    from pipelines.distill.corpus import TOKENS

    read = (pipeline | "Sources" >> beam.Create(sources)
            | "Read" >> beam.ParDo(_ReadSource()).with_outputs("tally", main="sentences"))
    corpus = read.sentences | "Corpus" >> TeacherPass(teacher, f"{folder}/sentences", cap, threads, synthetic,
                                                      f"{folder}/synthetic")
    vocab = (pipeline | "VocabFile" >> beam.Create([vocab_path])
             | "Surfaces" >> beam.FlatMap(lambda path: [(TOKENS, s) for s in vocabulary_surfaces(path)])
             | "Vocabulary" >> TeacherPass(teacher, f"{folder}/tokens", max(1, vocab_size), threads))
    tokens_tally = vocab | "TokenKeys" >> beam.Map(_renamed, "tokens")
    return ((read.tally, corpus, tokens_tally) | "Merge" >> beam.Flatten()
            | "Sum" >> beam.CombineGlobally(SumTallies())
            | "Complete" >> beam.Map(_write_completion, folder, stage))
