"""labse_model.data: global batches independent of world size and workers, resume, uneven shards."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from labse_model.data import build_train_loader
from labse_model.shuffle import EpochPlan, keyed_permutation
from labse_model.train import main as train_main
from pipelines.io.completion import mark_complete
from pipelines.io.tfrecord import TFRecordWriter, encode_example

SHARD_SIZES = (7, 11, 5)  # 23 records in 3 uneven shards


def record_id(src_row: torch.Tensor, mask: torch.Tensor) -> int:
    """The record number a hand-made record encodes in its second token."""
    ids = src_row[mask.bool()].tolist()
    return ids[1] - 1000


def write_shards(directory, sizes=SHARD_SIZES) -> str:
    k = 0
    for shard, size in enumerate(sizes):
        with TFRecordWriter(directory / f"part-{shard:05d}-of-{len(sizes):05d}.tfrecord") as writer:
            for _ in range(size):
                # Lengths vary so that dynamic padding is exercised; [CLS]=2 first, [SEP]=3 last.
                src = [2] + [1000 + k] * (1 + k % 5) + [3]
                tgt = [2, 5000 + k] + [7] * (k % 3) + [3]
                writer.write(encode_example({"src_ids": src, "tgt_ids": tgt, "src_lang": "de", "tgt_lang": "en", "score": 1.0}))
                k += 1
    mark_complete(directory, {"records": k}, stage="test shards")  # readers require it, as for labse-tfrecords
    return str(directory / "*.tfrecord")


def rows(batch: dict[str, torch.Tensor]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Unpadded (src, tgt) id tuples of a batch, checking padding and masks on the way."""
    out = []
    for side in ("src", "tgt"):
        ids, mask = batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"]
        assert ids.dtype == torch.long and mask.dtype == torch.long and ids.shape == mask.shape
        assert bool((ids[mask == 0] == 0).all()), "padding must use pad_id 0"
        assert int(mask.sum(1).max()) == ids.shape[1], "padded to the longest row of the slice, not further"
    for i in range(batch["src_input_ids"].shape[0]):
        src = batch["src_input_ids"][i][batch["src_attention_mask"][i].bool()].tolist()
        tgt = batch["tgt_input_ids"][i][batch["tgt_attention_mask"][i].bool()].tolist()
        assert src[0] == 2 and src[-1] == 3 and tgt[0] == 2 and tgt[-1] == 3
        assert src[1] - 1000 == tgt[1] - 5000, "src and tgt of a row come from the same record"
        out.append((tuple(src), tuple(tgt)))
    return out


def global_batches(pattern, world_size, steps, num_workers=0, start_step=0, global_batch_size=6, seed=13):
    per_rank = []
    for rank in range(world_size):
        loader = build_train_loader(
            pattern, global_batch_size=global_batch_size, rank=rank, world_size=world_size, seed=seed,
            shuffle_window=2, num_workers=num_workers, start_step=start_step, num_steps=steps,
        )
        per_rank.append([rows(b) for b in loader])
    assert len({len(r) for r in per_rank}) == 1, "every rank yields the same number of steps"
    return [sum((per_rank[r][s] for r in range(world_size)), []) for s in range(steps)]


def test_global_batch_is_independent_of_world_size_and_workers(tmp_path):
    pattern = write_shards(tmp_path)
    steps = 9  # 23 // 6 = 3 steps per epoch: three epochs
    single = global_batches(pattern, 1, steps)
    assert global_batches(pattern, 2, steps) == single
    assert global_batches(pattern, 3, steps) == single
    assert global_batches(pattern, 2, steps, num_workers=2) == single

    ids = [[r[0][1] - 1000 for r in batch] for batch in single]
    for epoch in range(3):
        seen = sum(ids[epoch * 3 : epoch * 3 + 3], [])
        assert len(seen) == 18 and len(set(seen)) == 18, "no record twice within an epoch"
        assert set(seen) <= set(range(23))
    assert ids[0:3] != ids[3:6], "each epoch is reshuffled"
    # A different seed gives a different order.
    assert global_batches(pattern, 1, 3, seed=14) != single[:3]


def test_resume_from_start_step_equals_continuing(tmp_path):
    pattern = write_shards(tmp_path)
    full = global_batches(pattern, 2, 10)
    for start in (1, 3, 7):  # inside an epoch, on an epoch boundary, in the third epoch
        assert global_batches(pattern, 2, 10 - start, start_step=start) == full[start:]
    assert global_batches(pattern, 1, 4, num_workers=2, start_step=5) == full[5:9]


def test_uneven_shards_give_every_rank_the_same_steps_forever(tmp_path):
    pattern = write_shards(tmp_path, sizes=(4, 9, 2))  # 15 records, 3 shards, 2 ranks
    loaders = [
        build_train_loader(pattern, global_batch_size=4, rank=r, world_size=2, seed=0, shuffle_window=2)
        for r in range(2)
    ]
    assert loaders[0].steps_per_epoch == loaders[1].steps_per_epoch == 3
    for _ in range(3 * 3 + 1):  # infinite: past three epochs, every rank still has a batch of 2
        for loader in loaders:
            batch = next(loader)
            assert batch["src_input_ids"].shape[0] == 2


def test_keyed_permutation_is_a_bijection_for_every_size():
    keys = np.arange(1, 7, dtype=np.uint64)
    for n in (1, 2, 3, 5, 16, 17, 1000, 4097):
        image = keyed_permutation(np.arange(n), n, keys)
        assert sorted(image.tolist()) == list(range(n))
    other = keyed_permutation(np.arange(1000), 1000, keys + np.uint64(1))
    assert not np.array_equal(other, keyed_permutation(np.arange(1000), 1000, keys)), "the key changes the order"


def test_epoch_plan_visits_every_record_once_and_mixes_the_window():
    counts = np.array([50, 30, 0, 20, 40])
    plan = EpochPlan(counts, seed=1, epoch=0, window=2)
    shards, records = plan.locate(np.arange(140))
    assert sorted(zip(shards.tolist(), records.tolist())) == [(k, r) for k in range(5) for r in range(counts[k])]
    again = EpochPlan(counts, seed=1, epoch=0, window=2).locate(np.arange(140))
    np.testing.assert_array_equal(again[0], shards)
    np.testing.assert_array_equal(again[1], records)
    # The first window's records come from both its shards, interleaved, not one shard after the other.
    first = plan.window_starts[1]
    assert len(set(shards[:first].tolist())) == len(set(plan.window_shards(0).tolist()) - {2})
    assert not np.array_equal(EpochPlan(counts, seed=1, epoch=1, window=2).locate(np.arange(140))[1], records)


def test_errors_are_clear(tmp_path):
    pattern = write_shards(tmp_path)
    with pytest.raises(ValueError, match="divisible"):
        build_train_loader(pattern, global_batch_size=5, rank=0, world_size=2, seed=0)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        build_train_loader(pattern, global_batch_size=64, rank=0, world_size=1, seed=0)
    with pytest.raises(FileNotFoundError, match="no TFRecord shards"):
        build_train_loader(str(tmp_path / "nothing*.tfrecord"), global_batch_size=2, rank=0, world_size=1, seed=0)


def test_schema_vocab_check(tmp_path):
    from labse_model.data import check_schema_vocab

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n", encoding="utf-8")
    import hashlib

    schema = {"version": 1, "vocab": {"sha256": hashlib.sha256(vocab.read_bytes()).hexdigest()}}
    check_schema_vocab(schema, vocab)
    check_schema_vocab(None, vocab)  # shards from another tool: nothing to check
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match="different vocabulary"):
        check_schema_vocab(schema, vocab)


def test_unsupported_schema_version_is_refused(tmp_path):
    pattern = write_shards(tmp_path)
    (tmp_path / "schema.json").write_text('{"version": 99}', encoding="utf-8")
    with pytest.raises(ValueError, match="version 99 is not supported"):
        build_train_loader(pattern, global_batch_size=2, rank=0, world_size=1, seed=0)


def test_reading_needs_no_tensorflow(tmp_path):
    """GPU hosts run torch alone: loading batches must not import TensorFlow."""
    import subprocess
    import sys

    pattern = write_shards(tmp_path)
    code = (
        "import sys\n"
        "from labse_model.data import build_train_loader\n"
        f"batch = next(build_train_loader({pattern!r}, global_batch_size=4, rank=0, world_size=1, seed=0))\n"
        "assert batch['src_input_ids'].shape[0] == 4\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


def test_empty_shard_is_harmless(tmp_path):
    pattern = write_shards(tmp_path, sizes=(3, 0, 5))
    batches = global_batches(pattern, 2, 4, global_batch_size=4)
    seen = [r[0][1] - 1000 for b in batches[:2] for r in b]
    assert sorted(seen) == list(range(8))


def test_an_out_of_vocabulary_id_names_its_shard_in_one_line(pair_inputs, tmp_path, caplog):
    from pipelines.io.tfrecord import TFRecordWriter, encode_example

    vocab, _ = pair_inputs
    vocab_size = len(vocab.read_text(encoding="utf-8").splitlines())
    shards = tmp_path / "shards"
    shards.mkdir()
    shard = shards / "pairs-00000-of-00001.tfrecord"
    with TFRecordWriter(shard) as writer:
        for i in range(16):
            tgt = [2, 10 + i, 3] if i != 11 else [2, vocab_size + 7, 3]
            writer.write(encode_example({"src_ids": [2, 20 + i, 3], "tgt_ids": tgt}))
    mark_complete(shards, {}, stage="test shards")
    # 2 steps of 8 = every record of the epoch: the bad one is met whatever the order.
    assert train_main(["--data", str(shards), "--vocab", str(vocab), "--output", str(tmp_path / "run"),
                       "--config", "tiny", "--global-batch-size", "8", "--max-steps", "2",
                       "--warmup-steps", "0"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and str(shard) in errors[0] and str(vocab_size + 7) in errors[0], errors


def _ids(batch: dict[str, torch.Tensor]) -> list[int]:
    return [r[0][1] - 1000 for r in rows(batch)]


def test_a_thousand_steps_resume_exactly_at_any_world_size(tmp_path):
    """1,000 steps (about 200 epochs of 23 records, 4 a step) at 2 processes, stopped at 377, resumed at
    1 process until 701, then at 2 again: the same global batches bit for bit, each record once an epoch."""
    pattern = write_shards(tmp_path)
    steps, batch = 1000, 4

    def run(world_size: int, start: int, stop: int) -> list[list[int]]:
        loaders = [build_train_loader(pattern, global_batch_size=batch, rank=r, world_size=world_size, seed=5,
                                      shuffle_window=2, start_step=start, num_steps=stop - start)
                   for r in range(world_size)]
        return [sum((_ids(b) for b in step), []) for step in zip(*loaders)]

    straight = run(2, 0, steps)
    assert run(2, 0, 377) + run(1, 377, 701) + run(2, 701, steps) == straight
    per_epoch = 23 // batch
    for epoch in range(steps // per_epoch):
        seen = sum(straight[epoch * per_epoch : (epoch + 1) * per_epoch], [])
        assert len(set(seen)) == len(seen) == per_epoch * batch, f"epoch {epoch} repeats a record"
    assert len({tuple(sum(straight[e * per_epoch : (e + 1) * per_epoch], [])) for e in range(50)}) > 45


def test_the_loader_state_is_small_and_guards_the_order(tmp_path):
    import io

    pattern = write_shards(tmp_path)
    loader = build_train_loader(pattern, global_batch_size=4, rank=0, world_size=1, seed=5, shuffle_window=2)
    state = loader.state(123)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert buffer.tell() <= 4096, f"loader state of {buffer.tell()} bytes in the checkpoint"
    assert (state["epoch"], state["position"]) == divmod(123, 5)[0:1] + (divmod(123, 5)[1] * 4,)
    loader.check_resume(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True), 123)
    other = build_train_loader(pattern, global_batch_size=4, rank=0, world_size=1, seed=5, shuffle_window=3)
    with pytest.raises(ValueError, match="shuffle_window 2 -> 3"):
        other.check_resume(state, 123)


KILLED_READER = """
import sys
from labse_model.data import build_train_loader
loader = build_train_loader(sys.argv[1], global_batch_size=4, rank=0, world_size=1, seed=5, shuffle_window=2,
                            num_workers=2)
for step, batch in enumerate(loader):
    ids = batch["src_input_ids"][:, 1].tolist()
    print(step, *ids, flush=True)
"""


def test_a_reader_killed_with_sigkill_resumes_with_the_same_next_batches(tmp_path):
    import signal
    import subprocess
    import sys

    pattern = write_shards(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", KILLED_READER, pattern], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(__file__)))
    seen = []
    for line in child.stdout:
        seen.append([int(v) for v in line.split()])
        if len(seen) == 250:
            child.send_signal(signal.SIGKILL)
            break
    child.wait(timeout=60)
    child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    last = seen[-1][0]
    resumed = build_train_loader(pattern, global_batch_size=4, rank=0, world_size=1, seed=5, shuffle_window=2,
                                 start_step=last + 1, num_steps=20)
    straight = build_train_loader(pattern, global_batch_size=4, rank=0, world_size=1, seed=5, shuffle_window=2,
                                  num_steps=last + 21)
    expected = [b["src_input_ids"][:, 1].tolist() for b in straight]
    assert [s[1:] for s in seen] == expected[: last + 1], "the killed reader (2 workers) read the straight order"
    assert [b["src_input_ids"][:, 1].tolist() for b in resumed] == expected[last + 1 :]


def test_shards_without_an_index_get_one_on_first_read(tmp_path):
    from pipelines.io.tfrecord import decode_index, index_path, index_records

    indexed = write_shards(tmp_path / "indexed")
    old = write_shards(tmp_path / "old")
    for index in (tmp_path / "old").glob("*.index"):
        index.unlink()  # shards of an older labse-tfrecords
    expected = global_batches(indexed, 1, 7)
    assert global_batches(old, 1, 7) == expected
    for shard in (tmp_path / "old").glob("*.tfrecord"):
        built = decode_index(open(index_path(str(shard)), "rb").read(), "")
        np.testing.assert_array_equal(built, index_records(shard))


def test_a_stale_or_truncated_index_is_refused(tmp_path):
    from pipelines.io.tfrecord import TFRecordCorruptError

    pattern = write_shards(tmp_path)
    shard = tmp_path / "part-00001-of-00003.tfrecord"
    data = shard.read_bytes()
    shard.write_bytes(data[:-3])  # truncated after its index was written
    with pytest.raises(TFRecordCorruptError, match="part-00001"):
        global_batches(pattern, 1, 5)


def test_shards_on_object_storage_read_by_ranges_as_on_disk(tmp_path):
    """fsspec's memory:// filesystem stands for gs://: indexes read whole, records by cat_ranges."""
    import fsspec

    from pipelines.io import storage

    pattern = write_shards(tmp_path / "local")
    fs = fsspec.filesystem("memory")
    base = f"memory://loader-test-{os.getpid()}"
    for path in sorted((tmp_path / "local").iterdir()):
        fs.pipe_file(f"{base}/shards/{path.name}", path.read_bytes())
    try:
        assert global_batches(f"{base}/shards/*.tfrecord", 2, 7) == global_batches(pattern, 2, 7)
        storage.remove(f"{base}/shards/part-00000-of-00003.tfrecord.index")
        with pytest.raises(ValueError, match="python -m labse_model.data index"):
            build_train_loader(f"{base}/shards/*.tfrecord", global_batch_size=4, rank=0, world_size=1, seed=0)
        from labse_model.data import main

        assert main(["index", f"{base}/shards/*.tfrecord"]) == 0
        assert global_batches(f"{base}/shards/*.tfrecord", 2, 7) == global_batches(pattern, 2, 7)
    finally:
        fs.rm(base.split("://")[1], recursive=True)


LANGS = ("de", "fr", "ja", "sw")
LANG_SHARE = (0.4, 0.3, 0.2, 0.1)


def _write_tagged_shards(directory, shard_of: np.ndarray, lang_of: np.ndarray) -> str:
    """Record k (language lang_of[k]) in shard shard_of[k]; its src id encodes k."""
    directory.mkdir()
    for shard in range(int(shard_of.max()) + 1):
        with TFRecordWriter(directory / f"part-{shard:05d}.tfrecord") as writer:
            for k in np.flatnonzero(shard_of == shard).tolist():
                writer.write(encode_example({"src_ids": [2, 1000 + k, 3], "tgt_ids": [2, 5000 + k, 3],
                                             "src_lang": LANGS[lang_of[k]], "tgt_lang": "en"}))
    mark_complete(directory, {"records": len(shard_of)}, stage="test shards")
    return str(directory / "*.tfrecord")


def _mixing(batches: list[np.ndarray], lang_of: np.ndarray, shard_of: np.ndarray) -> dict[str, float]:
    """Mean over batches: total-variation distance of the batch's languages from the corpus's, longest
    run of one language, and the share of neighbouring rows from the same source shard."""
    corpus = np.bincount(lang_of, minlength=len(LANGS)) / len(lang_of)
    tv, runs, same_shard = [], [], []
    for ids in batches:
        langs = lang_of[ids]
        tv.append(0.5 * np.abs(np.bincount(langs, minlength=len(LANGS)) / len(ids) - corpus).sum())
        breaks = np.flatnonzero(np.diff(langs) != 0)
        runs.append(np.diff(np.concatenate([[-1], breaks, [len(langs) - 1]])).max())
        same_shard.append(float((np.diff(shard_of[ids]) == 0).mean()))
    return {"tv": float(np.mean(tv)), "run": float(np.mean(runs)), "same_shard": float(np.mean(same_shard))}


def test_shuffle_mixes_languages_as_an_ideal_shuffle_does(tmp_path):
    """Shards written as labse-tfrecords writes them (shard = hash mod shards) read through windows of 4 of
    16 shards mix languages within batches like a uniform permutation of the whole corpus; shards of one
    language each (no write-time shuffle) read one shard at a time do not: the check can fail. Fixed
    seeds: deterministic, never flaky."""
    rng = np.random.default_rng(7)
    records, shards, batch, window = 4096, 16, 64, 4
    lang_of = rng.choice(len(LANGS), size=records, p=LANG_SHARE)
    hashed = rng.integers(0, shards, size=records)  # the write-time global shuffle
    by_language = np.repeat(np.arange(shards), records // shards)[np.argsort(lang_of, kind="stable").argsort()]

    def loader_batches(pattern: str, shuffle_window: int) -> list[np.ndarray]:
        loader = build_train_loader(pattern, global_batch_size=batch, rank=0, world_size=1, seed=3,
                                    shuffle_window=shuffle_window, num_steps=records // batch)
        return [np.asarray([ids[1] - 1000 for ids in b["src_input_ids"].tolist()]) for b in loader]

    ideal = _mixing(list(rng.permutation(records)[: records // batch * batch].reshape(-1, batch)), lang_of, hashed)
    mixed = _mixing(loader_batches(_write_tagged_shards(tmp_path / "hashed", hashed, lang_of), window), lang_of, hashed)
    assert mixed["tv"] <= 1.25 * ideal["tv"], (mixed, ideal)
    assert mixed["run"] <= ideal["run"] + 0.5, (mixed, ideal)
    # Within a window the source shard of neighbouring rows is as random as the window allows (1/4 here).
    assert mixed["same_shard"] <= 1.5 / window, mixed

    sorted_pattern = _write_tagged_shards(tmp_path / "by_language", by_language, lang_of)
    unmixed = _mixing(loader_batches(sorted_pattern, 1), lang_of, by_language)
    assert unmixed["tv"] > 3 * ideal["tv"] and unmixed["run"] > 3 * ideal["run"], (unmixed, ideal)


def test_the_loader_state_of_a_checkpoint_resumes_at_another_world_size(tmp_path):
    """A checkpoint written by 2 processes (each rank's loader state) continues at 1 and at 3: the
    state names no world size, every rank's is the same, and the resumed ranks together give the
    global batch the 2 processes would have given next. Another global batch size is refused."""
    from pipelines.io.config_options import UsageError

    pattern = write_shards(tmp_path)

    def loaders(world_size, start, batch=6):
        return [build_train_loader(pattern, global_batch_size=batch, rank=r, world_size=world_size, seed=5,
                                   shuffle_window=2, start_step=start, num_steps=3) for r in range(world_size)]

    two = loaders(2, 0)
    saved = [loader.state(7) for loader in two]
    assert saved[0] == saved[1] and "world_size" not in saved[0]
    expected = [sum((_ids(b) for b in step), []) for step in zip(*loaders(2, 7))]
    for world_size in (1, 3):
        resumed = loaders(world_size, 7)
        for loader in resumed:
            loader.check_resume(saved[0], 7)
        assert [sum((_ids(b) for b in step), []) for step in zip(*resumed)] == expected, world_size
    with pytest.raises(UsageError, match="global_batch_size 6 -> 4"):
        loaders(1, 7, batch=4)[0].check_resume(saved[0], 7)
