"""Choose the sentence splitter: boundary F1 per language and speed, candidates side by side.

Paragraphs are built by joining consecutive known sentences (Tatoeba: one sentence per line,
112 languages; Multi30k test_2016: captions), with a space, or with nothing for Chinese and
Japanese, where running text has no spaces between sentences. A splitter's boundaries are compared
with the known ones as offsets counted in non-space characters, so whitespace handling does not
matter. Some Tatoeba lines hold two sentences themselves ("Go away! I'm busy."); that costs every
candidate the same precision.

    .venv/bin/python benchmarks/sentence_split.py --data ../shared/data
"""
from __future__ import annotations

import argparse
import gzip
import re
import statistics
import sys
import time
from pathlib import Path

# Tatoeba file code -> (lid.176 code used by the project, join string)
LANGUAGES = {
    "eng": ("en", " "), "deu": ("de", " "), "fra": ("fr", " "), "rus": ("ru", " "),
    "pol": ("pl", " "), "tur": ("tr", " "), "ell": ("el", " "), "heb": ("he", " "),
    "ara": ("ar", " "), "pes": ("fa", " "), "hin": ("hi", " "), "mar": ("mr", " "),
    "ben": ("bn", " "), "vie": ("vi", " "), "ind": ("id", " "), "kor": ("ko", " "),
    "tha": ("th", " "), "cmn": ("zh", ""), "jpn": ("ja", ""), "amh": ("am", " "),
    "khm": ("km", " "), "hye": ("hy", " "), "urd": ("ur", " "),
}
MULTI30K = {"en": "en", "de": "de", "fr": "fr", "cs": "cs"}
GROUP = 4          # sentences per paragraph
PER_LANGUAGE = 400  # sentences per language (pysbd is slow)

REGEX_BOUNDARY = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？])|(?<=[।॥؟۔።])\s*")


def regex_split(text: str, lang: str) -> list[str]:
    return [s for s in REGEX_BOUNDARY.split(text) if s.strip()]


def make_candidates():
    import blingfire
    import pysbd
    import sentencex
    import syntok.segmenter as syntok_segmenter

    pysbd_cache: dict[str, object] = {}

    def pysbd_split(text, lang):
        code = lang if lang in pysbd.languages.LANGUAGE_CODES else "en"
        seg = pysbd_cache.get(code) or pysbd_cache.setdefault(code, pysbd.Segmenter(language=code, clean=False))
        return seg.segment(text)

    def syntok_split(text, lang):
        return ["".join(t.spacing + t.value for t in sent) for para in syntok_segmenter.process(text) for sent in para]

    from pipelines.text.sentences import split_sentences

    return {
        "regex baseline": regex_split,
        "blingfire": lambda text, lang: blingfire.text_to_sentences(text).split("\n"),
        "pysbd": pysbd_split,
        "sentencex": lambda text, lang: list(sentencex.segment(lang, text)),
        "syntok": syntok_split,
        "project (pipelines.text.sentences)": split_sentences,
    }


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def build_sets(data: Path) -> dict[str, tuple[str, list[list[str]], str]]:
    sets = {}
    for code, (lang, joiner) in LANGUAGES.items():
        path = data / "tatoeba" / (f"tatoeba.deu-eng.eng" if code == "eng" else f"tatoeba.{code}-eng.{code}")
        sentences = read_lines(path)[:PER_LANGUAGE]
        sets[f"tatoeba/{lang}"] = (lang, [sentences[i:i + GROUP] for i in range(0, len(sentences), GROUP)], joiner)
    for code, lang in MULTI30K.items():
        sentences = read_lines(data / "multi30k" / f"test_2016_flickr.{code}.gz")[:PER_LANGUAGE]
        sets[f"multi30k/{lang}"] = (lang, [sentences[i:i + GROUP] for i in range(0, len(sentences), GROUP)], " ")
    return sets


def boundaries(pieces: list[str]) -> set[int]:
    out, count = set(), 0
    for piece in pieces:
        count += sum(1 for ch in piece if not ch.isspace())
        out.add(count)
    return out


def evaluate(split, sets) -> tuple[dict[str, float], float]:
    f1s, chars, seconds = {}, 0, 0.0
    for name, (lang, paragraphs, joiner) in sets.items():
        tp = fp = fn = 0
        for group in paragraphs:
            text = joiner.join(group)
            started = time.perf_counter()
            predicted = [p for p in split(text, lang) if p.strip()]
            seconds += time.perf_counter() - started
            chars += len(text)
            gold, got = boundaries(group), boundaries(predicted)
            tp += len(gold & got)
            fp += len(got - gold)
            fn += len(gold - got)
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        f1s[name] = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return f1s, chars / seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    args = parser.parse_args(argv)
    sets = build_sets(args.data)
    results = {}
    for name, split in make_candidates().items():
        results[name] = evaluate(split, sets)
        print(f"{name}: mean F1 {statistics.mean(results[name][0].values()):.3f}, "
              f"{results[name][1] / 1e6:.2f} M chars/s", file=sys.stderr, flush=True)
    names = list(results)
    print("| set | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for set_name in sets:
        print(f"| {set_name} | " + " | ".join(f"{results[n][0][set_name]:.3f}" for n in names) + " |")
    print("| **mean F1** | " + " | ".join(f"**{statistics.mean(results[n][0].values()):.3f}**" for n in names) + " |")
    print("| **min F1** | " + " | ".join(f"{min(results[n][0].values()):.3f}" for n in names) + " |")
    print("| speed (M chars/s) | " + " | ".join(f"{results[n][1] / 1e6:.2f}" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
