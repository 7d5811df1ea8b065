"""labse-pretrain: masking, packing, TLM rows, stacking, stage boundaries and exact resume, on real text."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from labse_model import checkpoint as ckpt
from labse_model.config import ModelConfig
from labse_model.masking import MaskingSpec, mask_tokens
from labse_model.mlm import MaskedLanguageModel
from labse_model.pretrain import main as pretrain_main
from labse_model.pretrain_data import (
    MonoCorpus,
    Packer,
    LanguageStream,
    find_mono_corpora,
    is_heldout,
    join_translation,
    language_probabilities,
)
from labse_model.run_log import read_metrics
from labse_model.stacking import build_model, grow, plan_stages
from pipelines.io.completion import mark_complete
from model_helpers import build_vocab, udhr_lines, write_shards
from pipelines.text.wordpiece import CLS_ID, MASK_ID, SEP_ID, hf_tokenizer

SPECIAL_IDS = (0, 1, 2, 3, 4)


@pytest.fixture(scope="module")
def inputs(labse_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrain_inputs")
    vocab = build_vocab(labse_data, root / "vocab", udhr=("deu", "eng"))
    shards = write_shards(labse_data, vocab, root / "shards", pairs_per_lang=32)
    # labse-clean's layout: sentences/lang=XX/*.parquet, one row a sentence, documents in order.
    sentences = root / "clean" / "sentences"
    for lang, udhr in (("de", "deu"), ("en", "eng")):
        lines = udhr_lines(labse_data, udhr)
        (sentences / f"lang={lang}").mkdir(parents=True)
        docs = [f"{udhr}-{i // 12}" for i in range(len(lines))]  # 12-line documents
        table = pa.table({"text": lines, "doc_id": docs, "lang": [lang] * len(lines)})
        pq.write_table(table.slice(0, len(lines) // 2), sentences / f"lang={lang}" / "part-00000-of-00002.parquet",
                       row_group_size=16)
        pq.write_table(table.slice(len(lines) // 2), sentences / f"lang={lang}" / "part-00001-of-00002.parquet",
                       row_group_size=16)
    mark_complete(root / "clean", {}, stage="test: labse-clean's layout")  # readers require it
    return vocab, shards, root / "clean" / "sentences"


def _spec(vocab_size: int, max_predictions: int = 80) -> MaskingSpec:
    return MaskingSpec(mask_prob=0.2, max_predictions=max_predictions, mask_id=MASK_ID, vocab_size=vocab_size,
                       special_ids=SPECIAL_IDS)


# ----------------------------------------------------------------------------------------------
# Masking


def test_masking_statistics_over_ten_thousand_sequences():
    rng = np.random.default_rng(0)
    lengths = rng.integers(4, 160, size=10_000)
    width = int(lengths.max())
    attention = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(5, 1000, size=(10_000, width))
    ids[:, 0] = CLS_ID
    ids[np.arange(10_000), lengths - 1] = SEP_ID
    ids[rng.random(ids.shape) < 0.02] = 1  # some [UNK]s, which must never be targets
    ids[attention == 0] = 0
    spec = _spec(1000, max_predictions=20)
    out = mask_tokens(ids, attention, spec, np.random.default_rng(7))

    per_row = np.bincount(out.rows, minlength=10_000)
    expected = np.minimum(20, np.maximum(1, np.floor(lengths * 0.2 + 0.5))).astype(int)
    assert (per_row == expected).all()  # BERT's count per sequence, the cap included
    assert (per_row == 20).any() and (per_row < 20).any()
    assert not np.isin(out.labels, SPECIAL_IDS).any()  # never [PAD] [UNK] [CLS] [SEP] [MASK]
    assert (attention[out.rows, out.columns] == 1).all()
    assert len(set(zip(out.rows.tolist(), out.columns.tolist()))) == len(out.rows)  # no position twice
    assert (out.labels == ids[out.rows, out.columns]).all()

    now = out.input_ids[out.rows, out.columns]
    masked, kept = now == MASK_ID, now == out.labels
    replaced = ~masked & ~kept
    n = len(now)
    assert abs(masked.sum() / n - 0.8) < 0.01
    # A random replacement equals the original 1 time in 995: "kept" is 10% plus that sliver.
    assert abs(kept.sum() / n - 0.1) < 0.01 and abs(replaced.sum() / n - 0.1) < 0.01
    assert not np.isin(now[replaced], SPECIAL_IDS).any()
    untouched = np.ones(ids.shape, dtype=bool)
    untouched[out.rows, out.columns] = False
    assert (out.input_ids[untouched] == ids[untouched]).all()

    again = mask_tokens(ids, attention, spec, np.random.default_rng(7))
    assert (again.input_ids == out.input_ids).all() and (again.rows == out.rows).all()
    other = mask_tokens(ids, attention, spec, np.random.default_rng(8))
    assert (other.input_ids != out.input_ids).any()


def test_mlm_head_scores_only_masked_positions_with_tied_decoder():
    config = ModelConfig.from_preset("tiny", 300, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = MaskedLanguageModel(config).eval()
    ids = torch.randint(5, 300, (3, 12))
    mask = torch.ones_like(ids)
    rows, columns = torch.tensor([0, 1, 2, 2]), torch.tensor([3, 5, 1, 9])
    labels = ids[rows, columns]
    loss, correct = model(ids, mask, rows, columns, labels)
    # The same loss from logits over EVERY position, then picked: the head only ever sees targets.
    hidden = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    full = model.head(hidden, model.bert.embeddings.word_embeddings.weight)
    assert full.shape == (3, 12, 300)
    reference = torch.nn.functional.cross_entropy(full[rows, columns], labels)
    assert torch.allclose(loss, reference, atol=1e-6)
    assert int(correct) == int((full[rows, columns].argmax(-1) == labels).sum())
    # Tied: no decoder matrix of its own; the loss back-propagates into the word embeddings.
    assert not any("decoder" in name for name in model.state_dict())
    loss.backward()
    assert model.bert.embeddings.word_embeddings.weight.grad[labels].abs().sum() > 0


# ----------------------------------------------------------------------------------------------
# Data


def test_packing_respects_documents_and_length(tmp_path, inputs):
    vocab, _, _ = inputs
    tokenizer = hf_tokenizer(vocab)
    text = tmp_path / "de.txt"
    # Two documents separated by a blank line (BERT's pre-training text format).
    text.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\n\nEine Frau liest ein Buch.\n",
                    encoding="utf-8")
    packer = Packer(tokenizer, max_seq_length=64, cls_id=CLS_ID, sep_id=SEP_ID)
    sequences = list(packer.pack(str(text), "text"))
    first = tokenizer(["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."], add_special_tokens=False)["input_ids"]
    second = tokenizer(["Eine Frau liest ein Buch."], add_special_tokens=False)["input_ids"]
    assert [s.ids for s in sequences] == [[CLS_ID, *first[0], *first[1], SEP_ID], [CLS_ID, *second[0], SEP_ID]]
    assert [(s.first_row, s.next_row) for s in sequences] == [(0, 3), (3, 4)]

    short = Packer(tokenizer, max_seq_length=8, cls_id=CLS_ID, sep_id=SEP_ID)
    cut = list(short.pack(str(text), "text"))
    assert all(len(s.ids) <= 8 for s in cut) and len(cut) == 3 and short.sentences_cut >= 1


def test_language_stream_resumes_from_its_position(inputs):
    vocab, _, sentences = inputs
    corpora = find_mono_corpora([str(sentences)])
    assert [c.lang for c in corpora] == ["de", "en"] and all(len(c.files) == 2 for c in corpora)
    packer = Packer(hf_tokenizer(vocab), max_seq_length=48, cls_id=CLS_ID, sep_id=SEP_ID)
    de = corpora[0]

    def stream(position=None, rank=0, world_size=1, shuffle_window=1):
        return LanguageStream(de, packer, rank=rank, world_size=world_size, seed=3, heldout_rate=0.1,
                              shuffle_window=shuffle_window, position=position)

    epoch = [seq.ids for path, fmt in de.files for seq in packer.pack(path, fmt)
             if not is_heldout(path, seq.first_row, 0.1)]
    assert len(epoch) > 20
    total = len(epoch) + 15  # past the end of the first epoch
    straight = stream()
    reference = [straight.next_sequence() for _ in range(total)]
    assert straight.position["epoch"] == 1
    assert sorted(reference[: len(epoch)]) == sorted(epoch)  # one epoch: every training sequence once
    partial = stream()
    head = [partial.next_sequence() for _ in range(len(epoch) // 2)]
    resumed = stream(dict(partial.position))
    assert head + [resumed.next_sequence() for _ in range(total - len(head))] == reference
    # Shuffled in windows of 7: the same sequences per epoch in another order, and a resume from
    # any point inside a window (or at its end) continues exactly.
    shuffled = stream(shuffle_window=7)
    reference = [shuffled.next_sequence() for _ in range(total)]
    assert sorted(reference[: len(epoch)]) == sorted(epoch) and reference[: len(epoch)] != epoch
    file_order = [seq.ids for path, fmt in stream().file_order(0) for seq in packer.pack(path, fmt)
                  if not is_heldout(path, seq.first_row, 0.1)]
    assert reference[: len(epoch)] != file_order
    for cut in (1, 6, 7, 8, len(epoch) // 2, len(epoch)):
        partial = stream(shuffle_window=7)
        head = [partial.next_sequence() for _ in range(cut)]
        resumed = stream(dict(partial.position), shuffle_window=7)
        assert head + [resumed.next_sequence() for _ in range(total - cut)] == reference, cut
    # Two ranks split the two files: disjoint sequences, all from the training (not held-out) part.
    rank0, rank1 = stream(rank=0, world_size=2), stream(rank=1, world_size=2)
    a = {tuple(rank0.next_sequence()) for _ in range(5)}
    b = {tuple(rank1.next_sequence()) for _ in range(5)}
    assert a and b and not a & b and a | b <= {tuple(ids) for ids in epoch}


def test_one_language_from_parquet_and_text_merges(inputs, tmp_path):
    """A cleaned crawl (Parquet) and a text corpus of the same language form one corpus, each file read
    in its own format."""
    vocab, _, sentences = inputs
    text = tmp_path / "de.txt"
    text.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\n", encoding="utf-8")
    parquet_only = {c.lang: c for c in find_mono_corpora([str(sentences)])}
    corpora = {c.lang: c for c in find_mono_corpora([str(sentences), f"de:{text}"])}
    de = corpora["de"]
    assert de.sentences == parquet_only["de"].sentences + 2
    assert (str(text), "text") in de.files and sum(fmt == "parquet" for _, fmt in de.files) == 2
    assert corpora["en"] == parquet_only["en"]
    packer = Packer(hf_tokenizer(vocab), max_seq_length=48, cls_id=CLS_ID, sep_id=SEP_ID)
    stream = LanguageStream(de, packer, rank=0, world_size=1, seed=3, heldout_rate=0.0)
    seen = {tuple(stream.next_sequence()) for _ in range(200)}
    from_text = tuple(next(packer.pack(str(text), "text")).ids)
    assert from_text in seen  # the text file is read as text, next to the Parquet files


def test_language_sampling_exponent():
    corpora = [MonoCorpus("en", (("a", "text"),), 1_000_000), MonoCorpus("lv", (("b", "text"),), 1_000)]
    p = language_probabilities(corpora, 0.3)
    assert p[1] / p[0] == pytest.approx((1_000 / 1_000_000) ** 0.3)
    assert language_probabilities(corpora, 1.0)[1] == pytest.approx(1_000 / 1_001_000)


def test_tlm_example_by_hand():
    src = [CLS_ID, 10, 11, 12, SEP_ID]
    tgt = [CLS_ID, 20, 21, SEP_ID]
    assert join_translation(src, tgt, True, 64) == [CLS_ID, 10, 11, 12, SEP_ID, 20, 21, SEP_ID]
    assert join_translation(src, tgt, False, 64) == [CLS_ID, 20, 21, SEP_ID, 10, 11, 12, SEP_ID]
    # Too long: the longer side loses its last pieces first, both [SEP]s stay.
    assert join_translation(src, tgt, True, 7) == [CLS_ID, 10, 11, SEP_ID, 20, 21, SEP_ID]
    assert join_translation(src, tgt, True, 6) == [CLS_ID, 10, SEP_ID, 20, 21, SEP_ID]


# ----------------------------------------------------------------------------------------------
# Stacking


def test_growing_copies_layers_exactly():
    config = ModelConfig.from_preset("tiny", 300)
    shallow = build_model(config, 1, seed=1)
    with torch.no_grad():
        for parameter in shallow.parameters():
            parameter.add_(torch.randn_like(parameter))  # "trained" weights, unlike any fresh init
    deep = grow(shallow, 2, seed=2)
    source, grown = shallow.state_dict(), deep.state_dict()
    assert deep.config.num_layers == 2 and len(deep.bert.encoder.layer) == 2
    for name, tensor in grown.items():
        origin = name.replace("encoder.layer.1.", "encoder.layer.0.")
        assert torch.equal(tensor, source[origin]), name
    four = grow(deep, 4, seed=3).state_dict()
    for i in range(4):
        for name, tensor in four.items():
            if f"encoder.layer.{i}." in name:
                assert torch.equal(tensor, grown[name.replace(f"layer.{i}.", f"layer.{i % 2}.")])
    with pytest.raises(ValueError, match="cannot stack"):
        grow(deep, 3, seed=0)


def test_stage_plan_follows_the_fractions_and_checks_the_layers():
    stages = plan_stages(150, (3, 6, 12), (2, 4, 9), 12)
    assert [(s.num_layers, s.begin, s.end) for s in stages] == [(3, 0, 20), (6, 20, 60), (12, 60, 150)]
    with pytest.raises(ValueError, match="multiple"):
        plan_stages(150, (2, 3, 6), (1, 1, 1), 6)
    with pytest.raises(ValueError, match="all 12 layers"):
        plan_stages(150, (3, 6), (1, 1), 12)
    with pytest.raises(ValueError, match="no step"):
        plan_stages(2, (1, 2, 4), (2, 4, 9), 4)


# ----------------------------------------------------------------------------------------------
# The command


def _args(vocab: Path, shards: str, sentences: Path, output: Path, *extra: str) -> list[str]:
    # Dropout stays on and TLM is mixed in: the resume must restore RNG streams and data positions.
    return ["--mono", str(sentences), "--pairs", shards, "--vocab", str(vocab), "--output", str(output),
            "--config", "tiny", "--stage-layers", "1,2", "--stage-fractions", "1,1", "--max-steps", "8",
            "--global-batch-size", "8", "--tlm-fraction", "0.25", "--max-seq-length", "48", "--lr", "1e-3",
            "--warmup-steps", "1", "--log-every", "1", "--save-every", "2", "--eval-every", "4",
            "--keep-checkpoints", "0", "--heldout-rate", "0.1", *extra]


def test_resume_mid_stage_and_at_the_boundary_equals_one_run(inputs, tmp_path):
    vocab, shards, sentences = inputs
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert pretrain_main(_args(vocab, shards, sentences, straight)) == 0
    # Stop mid-stage 1 (step 3), then exactly at the stage boundary (step 4), then finish.
    assert pretrain_main(_args(vocab, shards, sentences, interrupted, "--stop-after-steps", "3")) == 0
    assert not (interrupted / "encoder.safetensors").exists()  # unfinished runs publish no encoder
    assert pretrain_main(_args(vocab, shards, sentences, interrupted, "--resume", "--stop-after-steps", "1")) == 0
    assert ckpt.load_training_state(ckpt.find_checkpoint(interrupted))["num_layers"] == 1
    assert pretrain_main(_args(vocab, shards, sentences, interrupted, "--resume")) == 0

    def losses(run: Path) -> dict[int, float]:
        return {m["step"]: m["loss"] for m in read_metrics(run) if "loss" in m}

    assert sorted(losses(straight)) == list(range(1, 9))
    assert losses(interrupted) == losses(straight)  # bit-identical across both interruptions
    assert len(set(losses(straight).values())) == 8
    a, b = load_file(interrupted / "encoder.safetensors"), load_file(straight / "encoder.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # Held-out loss and accuracy logged per stage; the encoder holds the BERT weights, no head.
    heldout = [m for m in read_metrics(straight) if "heldout_mlm_loss" in m]
    assert [(m["step"], m["stage"]) for m in heldout] == [(4, 1), (8, 2)]
    assert all(0 <= m["heldout_mlm_accuracy"] <= 1 for m in heldout)
    summary = json.loads((straight / "pretrain_summary.json").read_text())
    assert [s["layers"] for s in summary["stages"].values()] == [1, 2]
    assert all(s["tokens_per_second"] > 0 for s in summary["stages"].values())
    assert all(k.startswith("bert.") for k in b) and any("encoder.layer.1." in k for k in b)
    config = json.loads((straight / "pretrain_config.json").read_text())
    assert config["model"]["num_layers"] == 2 and len(config["vocab_sha256"]) == 64

    # Optimizer reset at the boundary: Adam's step count restarts with stage 2.
    state5 = ckpt.load_training_state(ckpt.find_checkpoint(straight, 6))
    adam_steps = {int(s["step"]) for s in state5["optimizer"]["state"].values()}
    assert adam_steps == {2} and state5["scheduler"]["last_epoch"] == 2 and state5["num_layers"] == 2
    state4 = ckpt.load_training_state(ckpt.find_checkpoint(straight, 4))
    assert {int(s["step"]) for s in state4["optimizer"]["state"].values()} == {4}


def test_bad_input_fails_before_any_work(inputs, tmp_path, caplog):
    vocab, shards, sentences = inputs
    run = tmp_path / "run"

    def fails(*argv: str, match: str) -> None:
        caplog.clear()
        assert pretrain_main(_args(vocab, shards, sentences, run, *argv)) == 2
        assert match in caplog.text, caplog.text
        assert not run.exists()  # nothing half-written

    fails("--stage-layers", "3,4", "--config", "mini", match="multiple")
    fails("--config", "mini", "--stage-layers", "1,2", match="all 4 layers")
    fails("--max-seq-length", "1000", match="exceeds")
    empty = tmp_path / "empty" / "sentences" / "lang=xx"
    empty.mkdir(parents=True)
    pq.write_table(pa.table({"text": pa.array([], pa.string()), "doc_id": pa.array([], pa.string())}),
                   empty / "part-0.parquet")
    mark_complete(tmp_path / "empty", {}, stage="labse-clean")  # complete, and empty
    caplog.clear()
    assert pretrain_main(["--mono", str(empty.parent), *_args(vocab, shards, sentences, run)]) == 2
    assert "holds no sentence" in caplog.text and not run.exists()

    # Shards written with another vocabulary.
    other = tmp_path / "other_shards"
    other.mkdir()
    for shard in Path(shards).parent.glob("*.tfrecord"):
        (other / shard.name).write_bytes(shard.read_bytes())
    (other / "schema.json").write_text(json.dumps({"version": 1, "vocab": {"sha256": "0" * 64}}))
    mark_complete(other, {}, stage="labse-tfrecords")
    caplog.clear()
    argv = _args(vocab, str(other / "*.tfrecord"), sentences, run)
    assert pretrain_main(argv) == 2 and "different vocabulary" in caplog.text and not run.exists()

    # A run directory of another config refuses --resume.
    done = tmp_path / "done"
    assert pretrain_main(_args(vocab, shards, sentences, done, "--max-steps", "2", "--stage-layers", "2",
                               "--stage-fractions", "1")) == 0
    caplog.clear()
    assert pretrain_main(_args(vocab, shards, sentences, done, "--resume", "--config", "mini",
                               "--stage-layers", "4", "--stage-fractions", "1")) == 2
    assert "other settings" in caplog.text
    caplog.clear()
    assert pretrain_main(_args(vocab, shards, sentences, done, "--max-steps", "2", "--stage-layers", "2",
                               "--stage-fractions", "1")) == 2
    assert "not empty" in caplog.text


def test_init_from_pretrain_dir_round_trip_is_strict(inputs, tmp_path, caplog):
    from safetensors.torch import save_file

    from labse_model.train import main as train_main

    vocab, shards, sentences = inputs
    pt = tmp_path / "pt"
    assert pretrain_main(_args(vocab, shards, sentences, pt, "--max-steps", "2", "--stage-layers", "2",
                               "--stage-fractions", "1")) == 0
    train_args = ["--data", shards, "--vocab", str(vocab), "--global-batch-size", "8", "--max-steps", "1",
                  "--lr", "0", "--warmup-steps", "0", "--save-every", "1", "--init-from", str(pt)]
    assert train_main([*train_args, "--output", str(tmp_path / "ft")]) == 0
    config = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert config["model"]["preset"] == "tiny" and config["model"]["num_layers"] == 2  # taken from PT_DIR
    pretrained = load_file(pt / "encoder.safetensors")
    tuned = load_file(ckpt.find_checkpoint(tmp_path / "ft") / ckpt.MODEL_FILE)
    assert set(tuned) - set(pretrained) == {"head.weight", "head.bias"}
    assert all(torch.equal(tuned[k], pretrained[k]) for k in pretrained)  # lr 0: the weights as loaded

    caplog.clear()
    assert train_main([*train_args, "--output", str(tmp_path / "mini"), "--config", "mini"]) == 2
    assert "contradicts" in caplog.text
    other_vocab = tmp_path / "vocab.txt"
    other_vocab.write_text(vocab.read_text() + "zzzextra\n")
    caplog.clear()
    assert train_main([*train_args, "--output", str(tmp_path / "v"), "--vocab", str(other_vocab)]) == 2
    assert "not the vocabulary" in caplog.text
    # A missing or an unexpected weight is an error, never a silent random init.
    for broken in ({k: v for k, v in pretrained.items() if "layer.1." not in k},
                   {**pretrained, "bert.pooler.dense.weight": torch.zeros(64, 64)}):
        save_file(broken, pt / "encoder.safetensors")
        caplog.clear()
        assert train_main([*train_args, "--output", str(tmp_path / f"b{len(broken)}")]) == 2
        assert "does not match the encoder" in caplog.text


def test_a_second_run_into_a_locked_output_fails_at_once(inputs, tmp_path, caplog):
    from labse_model.train import main as train_main
    from pipelines.io.locks import output_lock

    vocab, shards, sentences = inputs
    run = tmp_path / "run"
    with output_lock(run):  # another run holds it
        assert pretrain_main(_args(vocab, shards, sentences, run)) == 2
        assert "run.lock" in caplog.text
        caplog.clear()
        assert train_main(["--data", shards, "--vocab", str(vocab), "--output", str(run), "--config", "tiny",
                           "--global-batch-size", "8", "--max-steps", "1"]) == 2
        assert "run.lock" in caplog.text
    assert not (run / "checkpoints").exists()


def test_resume_skips_a_corrupt_latest_checkpoint(inputs, tmp_path, caplog):
    vocab, shards, sentences = inputs
    run = tmp_path / "run"
    assert pretrain_main(_args(vocab, shards, sentences, run, "--stop-after-steps", "4")) == 0
    before = {m["step"]: m["loss"] for m in read_metrics(run) if "loss" in m}
    damaged = run / "checkpoints" / "step-00000004" / ckpt.MODEL_FILE
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])  # as a crash mid-write leaves it

    caplog.clear()
    assert pretrain_main(_args(vocab, shards, sentences, run, "--resume", "--stop-after-steps", "2")) == 0
    fallback = [r.getMessage() for r in caplog.records if "the newest checkpoint that loads" in r.getMessage()]
    assert len(fallback) == 1 and str(damaged) in fallback[0] and "step-00000002" in fallback[0]
    assert (run / "checkpoints" / "step-00000004.corrupt").is_dir()
    after = {m["step"]: m["loss"] for m in read_metrics(run) if "loss" in m}
    assert after == before  # steps 3 and 4 trained again from step 2, bit-identically


def test_a_resume_from_an_earlier_checkpoint_does_not_count_the_rerun_steps_twice(inputs, tmp_path):
    vocab, shards, sentences = inputs
    run = tmp_path / "run"
    assert pretrain_main(_args(vocab, shards, sentences, run, "--stop-after-steps", "6")) == 0
    timed = {k: s["steps_timed"] for k, s in json.loads((run / "pretrain_summary.json").read_text())["stages"].items()}
    assert timed == {"0": 4, "1": 2}
    # Back to the stage boundary: stage 2's steps 5 and 6 run again and are timed once.
    assert pretrain_main(_args(vocab, shards, sentences, run, "--resume", "--resume-step", "4")) == 0
    summary = json.loads((run / "pretrain_summary.json").read_text())
    assert summary["finished"] and {k: s["steps_timed"] for k, s in summary["stages"].items()} == {"0": 4, "1": 4}


def test_the_pretrain_summary_keeps_the_stages_finished_before_a_crash(labse_data, pair_inputs, tmp_path,
                                                                       monkeypatch):
    from labse_model import pretrain_data
    from labse_model.pretrain import main as pretrain_main
    from model_helpers import udhr_lines

    vocab, shards = pair_inputs
    sentences = tmp_path / "clean" / "sentences" / "lang=en"
    sentences.mkdir(parents=True)
    lines = udhr_lines(labse_data, "eng")
    pq.write_table(pa.table({"text": lines, "doc_id": [f"d{i // 12}" for i in range(len(lines))]}),
                   sentences / "part-00000-of-00001.parquet")
    mark_complete(tmp_path / "clean", {}, stage="test: labse-clean's layout")
    args = ["--mono", str(sentences.parent), "--vocab", str(vocab), "--output", str(tmp_path / "pt"),
            "--config", "tiny", "--stage-layers", "1,2", "--stage-fractions", "1,1", "--max-steps", "6",
            "--global-batch-size", "4", "--max-seq-length", "32", "--warmup-steps", "0", "--save-every", "3",
            "--heldout-rate", "0"]
    calls = {"n": 0}
    real_next = pretrain_data.PretrainBatches.__next__

    def crash_at_step_five(self):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("simulated crash in stage 2")
        return real_next(self)

    monkeypatch.setattr(pretrain_data.PretrainBatches, "__next__", crash_at_step_five)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain_main(args)
    monkeypatch.setattr(pretrain_data.PretrainBatches, "__next__", real_next)
    assert pretrain_main(args + ["--resume"]) == 0
    summary = json.loads((tmp_path / "pt" / "pretrain_summary.json").read_text())
    assert summary["finished"]
    assert {k: s["steps_timed"] for k, s in summary["stages"].items()} == {"0": 3, "1": 3}
