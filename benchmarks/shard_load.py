"""Loading index shards while searching them (issue 30): labse-mine's packed search of one group of
query batches through every shard of a labse-index output, in three modes (`MODES`), with the
index on local disk and in a bucket (the GCS emulator of the tests, in a child process: real HTTP
reads through Beam's GCS client, on loopback):

- `sequential, by text` (the way before): each shard read when its searches begin, each hit named
  by its text, looked up in the store (`SavedVectorsEmbedder.find`);
- `prefetch, by text`: the next shard's files read onto local disk while this one is searched;
- `prefetch, by id` (now): and a hit named by its row in the store (the shard's `.ids.npy`, read
  instead of its text).

    python benchmarks/mine_million.py build --out DIR --n 1000000 --dim 256   # the vectors (once)
    python benchmarks/shard_load.py --out DIR --shard-sentences 100000 --group-batches 2

The index is built by labse-index itself (`python -m pipelines.index.cli`) from the target side of
DIR/vectors (once, kept in DIR/shard_load). The group is the first `--group-batches` x 8,192
source sentences, searched as `_SearchPackedShards` searches a group (one thread for FAISS, as on a
worker). Before every run the worker's held shards are dropped, so each run loads every shard.
Lines:

- `index`: the shards' bytes a sentence by file (codes, float16 rows, text, ids) and the build.
- `load`: each shard loaded alone (by text), wall and CPU seconds, per location: in all, and of that its
  files' read onto local disk (`_SearchShard._fetch`; opening them is the rest).
- `group`: the group's wall and CPU seconds, per location and mode, `--repeats` interleaved; the
  summary gives the way before over now, wall and CPU (medians, with ranges), and whether every
  mode found the same hits.
- `memory` (`--memory`, alone): one group from the bucket in the mode of now, the process's
  anonymous memory at its peak above where it started (one process a run; run the script from each
  checkout to compare them: what a worker holds of the shards at once).

The sentences here are ids (`en0000123`, 10 bytes), so a shard's text is far smaller than a
crawl's (~118 bytes a line): the `index` line says the bytes a sentence each part holds.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shard_search import add_search_options  # noqa: E402 (a sibling script)

from pipelines.mine.packed import SRC  # noqa: E402

QUERY_BATCH = 8_192  # labse-mine's default --query-batch
# the way before first, now last: each shard read when its searches begin or the next one read
# while this one is searched; a hit named by its text looked up in the store, or by its row there
MODES = ("sequential, by text", "prefetch, by text", "prefetch, by id")
BUCKET = "labse-bench"


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def build_index(out: Path, factory: str, shard_sentences: int, train_sample: int) -> Path:
    """labse-index over DIR/vectors' target side (kept in DIR/shard_load/index-...)."""
    work = out / "shard_load"
    index = work / f"index-{factory.replace(',', '_')}-{shard_sentences}"
    if (index / "_SUCCESS").exists():
        return index
    target = work / "tgt_vectors"
    target.mkdir(parents=True, exist_ok=True)
    for suffix in (".npy", ".txt"):  # labse-index reads every NAME.npy of a folder
        link = target / f"tgt{suffix}"
        if not link.exists():
            link.symlink_to(out / "vectors" / f"tgt{suffix}")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipelines.index.cli", "--vectors", str(target), "--lang", "en",
                    "--factory", factory, "--shard-sentences", str(shard_sentences), "--train-sample",
                    str(train_sample), "--output", str(index)], check=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    emit({"part": "build", "factory": factory, "shard_sentences": shard_sentences,
          "wall_s": round(time.perf_counter() - started, 1)})
    return index


def shard_bytes(index: Path) -> dict:
    """Bytes a sentence of each part of the shards (the .faiss files less the trained index each repeats)."""
    from pipelines.index.shards import RERANK_SUFFIX, SOURCE_IDS_SUFFIX
    from pipelines.mine.index_search import load_manifest

    manifest = load_manifest(str(index), "--index")
    sentences = manifest.sentences
    names = [s["name"] for s in manifest.shards]
    def per_sentence(suffix: str, less: int = 0) -> float:
        return round(sum((index / f"{n}{suffix}").stat().st_size - less for n in names) / sentences, 1)

    return {"shards": len(names), "sentences": sentences, "codes": per_sentence(".faiss", manifest.shared_bytes_per_shard),
            "rows": per_sentence(RERANK_SUFFIX), "text": per_sentence(".txt"), "ids": per_sentence(SOURCE_IDS_SUFFIX),
            "trained_index_bytes": manifest.shared_bytes_per_shard}


@contextlib.contextmanager
def emulated_bucket(work: Path):
    """The tests' GCS emulator (tests/gcs_emulator.py) with its token endpoint, its variables in
    os.environ while it runs."""
    import http.server
    import threading

    sys.path.insert(0, str(ROOT))
    from tests.gcs_emulator import GcsEmulator, _service_account_key, _start_emulator, _TokenHandler

    root = work / "emulator"
    root.mkdir(parents=True, exist_ok=True)
    endpoint, process = _start_emulator(root, root / "emulator.log")
    token_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TokenHandler)
    threading.Thread(target=token_server.serve_forever, daemon=True).start()
    key = root / "service-account.json"
    _service_account_key(key, f"http://127.0.0.1:{token_server.server_address[1]}/token")
    env = {"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_APPLICATION_CREDENTIALS": str(key),
           "GOOGLE_CLOUD_PROJECT": "labse-test-123", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
           "NO_GCE_CHECK": "true"}
    os.environ.update(env)
    try:
        emulator = GcsEmulator(endpoint=endpoint, env=env)
        emulator.client().create_bucket(BUCKET)
        yield emulator
    finally:
        token_server.shutdown()
        process.terminate()
        process.wait(timeout=10)


def query_group(out: Path, batches: int) -> list:
    """[(range key, store ids)]: the first `batches` x QUERY_BATCH source sentences of the store."""
    from pipelines.embed.saved_vectors import SavedVectorsEmbedder
    from pipelines.mine import packed

    store = SavedVectorsEmbedder(out / "vectors")
    texts = (out / "vectors" / "src.txt").read_text(encoding="utf-8").splitlines()[:batches * QUERY_BATCH]
    ids = packed.store_ids(store.find(texts))
    return [(key, part["ids"]) for key, part in packed.split_by_range(packed.SRC, np.unique(ids), QUERY_BATCH)]


def searcher(index_dir: str, out: Path, mode: str, nprobe: int, rerank: int, k: int):
    """labse-mine's group search of the index in `mode` (MODES)."""
    from pipelines.mine.index_search import index_plan, load_manifest
    from pipelines.mine.packed_search import _SearchPackedShards, store_rows_of

    manifest = load_manifest(index_dir, "--index")
    dirs, shards, nprobes, reranks = index_plan(index_dir, index_dir, manifest, manifest, nprobe, rerank)
    store = f"vectors:{out / 'vectors'}"
    mapping = store_rows_of(store, manifest) if mode.endswith("by id") else None
    if mode.endswith("by id") and mapping is None:
        raise SystemExit(f"{index_dir} was not built from {store}'s files: rebuild it (remove {index_dir})")
    search = _SearchPackedShards(dirs, nprobes, k, reranks, store, shards, prefetch=mode.startswith("prefetch"),
                                 to_store={SRC: mapping})
    search.setup()
    return search, shards[SRC]


def drop_held_shards() -> None:
    from pipelines.mine.index_search import HELD_SHARDS

    HELD_SHARDS.keep(None)
    gc.collect()


def run_group(search, group: list) -> tuple[float, float, list]:
    from pipelines.index.shards import faiss_threads
    from pipelines.mine import packed

    drop_held_shards()
    with faiss_threads(1):
        wall, cpu = time.perf_counter(), time.process_time()
        found = list(search.process(((packed.SRC, 0), group)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    search.finish_bundle()
    drop_held_shards()
    return wall, cpu, found


def anonymous_mb() -> float:
    """This process's anonymous resident memory (the heap, FAISS's codes; not mapped files' pages)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


def memory_of_group(out: Path, index_dir: str, mode: str, args) -> dict:
    """One group searched in `mode`, this process's anonymous memory sampled every 5 ms: its peak
    above what it held before (the shards' codes held at once, the group's state, the reads)."""
    import threading

    group = query_group(out, args.group_batches)
    search, _names = searcher(index_dir, out, mode, args.nprobe, args.rerank, args.k)
    gc.collect()
    before, peak, done = anonymous_mb(), [0.0], threading.Event()

    def sample():
        while not done.wait(0.005):
            peak[0] = max(peak[0], anonymous_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    wall, cpu, _found = run_group(search, group)
    done.set()
    sampler.join()
    return {"anonymous_before_mb": round(before, 1), "anonymous_peak_above_mb": round(peak[0] - before, 1),
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="benchmarks/mine_million.py build's folder")
    parser.add_argument("--factory", default="IVF1024_HNSW32,PQ128x4fs")
    parser.add_argument("--train-sample", type=int, default=100_000)
    parser.add_argument("--shard-sentences", type=int, default=100_000)
    parser.add_argument("--group-batches", type=int, default=2, help="query batches of 8,192 in the group")
    parser.add_argument("--memory", action="store_true",
                        help="only the `memory` line: one group from the bucket, `prefetch, by id`, its peak anonymous "
                             "memory (run it from each checkout to compare them)")
    add_search_options(parser)
    args = parser.parse_args(argv)
    out = Path(args.out)
    index = build_index(out, args.factory, args.shard_sentences, args.train_sample)
    emit({"part": "index", **shard_bytes(index)})
    if args.memory:
        with emulated_bucket(out / "shard_load") as bucket:
            bucket.upload_tree(index, f"gs://{BUCKET}/index")
            emit({"part": "memory", "location": "bucket", "mode": MODES[-1], "checkout": str(ROOT),
                  **memory_of_group(out, f"gs://{BUCKET}/index", MODES[-1], args)})
        return
    group = query_group(out, args.group_batches)
    with emulated_bucket(out / "shard_load") as bucket:
        bucket.upload_tree(index, f"gs://{BUCKET}/index")
        locations = {"local": str(index), "bucket": f"gs://{BUCKET}/index"}
        for location, index_dir in locations.items():
            search, names = searcher(index_dir, out, "prefetch, by text", args.nprobe, args.rerank, args.k)
            for name in names:
                drop_held_shards()
                key = search._key(SRC, name)
                wall, cpu = time.perf_counter(), time.process_time()
                search._ahead = search._fetch(key)  # as the read-ahead leaves it, then opened
                fetch_wall, fetch_cpu = time.perf_counter() - wall, time.process_time() - cpu
                search._load(key)
                emit({"part": "load", "location": location, "shard": name,
                      "wall_s": round(time.perf_counter() - wall, 3), "cpu_s": round(time.process_time() - cpu, 3),
                      "fetch_wall_s": round(fetch_wall, 3), "fetch_cpu_s": round(fetch_cpu, 3)})
        walls: dict = {}
        cpus: dict = {}
        answers: dict = {}
        for repeat in range(args.repeats):
            for location, index_dir in locations.items():
                for mode in MODES:  # interleaved
                    search, names = searcher(index_dir, out, mode, args.nprobe, args.rerank, args.k)
                    wall, cpu, found = run_group(search, group)
                    walls.setdefault((location, mode), []).append(wall)
                    cpus.setdefault((location, mode), []).append(cpu)
                    answers.setdefault((location, mode), [top["hits"].tolist() for _key, top in found])
                    emit({"part": "group", "location": location, "mode": mode, "repeat": repeat, "shards": len(names),
                          "queries": sum(len(ids) for _key, ids in group), "wall_s": round(wall, 2),
                          "cpu_s": round(cpu, 2)})
    same = all(a == answers[("local", MODES[0])] for a in answers.values())
    summary = {}
    for location in locations:
        median = {mode: statistics.median(walls[(location, mode)]) for mode in MODES}
        cpu = {mode: statistics.median(cpus[(location, mode)]) for mode in MODES}
        summary[location] = {
            "before_over_now_wall": round(median[MODES[0]] / median[MODES[-1]], 2),
            "before_over_now_cpu": round(cpu[MODES[0]] / cpu[MODES[-1]], 2),
            "wall_s_median_min_max": {mode: [round(median[mode], 2), round(min(walls[(location, mode)]), 2),
                                              round(max(walls[(location, mode)]), 2)] for mode in MODES},
            "cpu_s_median_min_max": {mode: [round(cpu[mode], 2), round(min(cpus[(location, mode)]), 2),
                                            round(max(cpus[(location, mode)]), 2)] for mode in MODES}}
    emit({"part": "summary", "repeats": args.repeats, "same_answers": same, "by_location": summary})


if __name__ == "__main__":
    main()
