"""The pair quality scorer: P(good translation | pair features), trained on known parallel text.

Training data per language pair, from line-aligned parallel files (Multi30k `train`):

* positives: true pairs, with cosine and margin measured inside a mining pool where a third of the
  sentences on each side are distractors whose partners are absent;
* negatives as mining produces them: every sentence's best-margin candidate that is not its
  partner (hard negatives, the errors margin mining actually makes);
* synthetic negatives: shuffled partners, truncated targets, targets with a third of the words
  swapped for words of other sentences, a translation into the wrong language, and copies of the
  source as target (and the other way round).

The model is two scikit-learn logistic regressions over standardised features (plus squares of
cosine and margin): a ranker (true vs mined) and a sanity model (true vs synthetic); the score is
their product. Then, on parallel rows neither model was fitted on, it mines calibration pools (true
pairs among distractors, at many sizes and shares) and fits the calibration that turns the two
models' outputs into P(good pair) on any mined set (`calibration.py`). It is saved as plain JSON
(feature names, scaling, coefficients), so loading a scorer never unpickles anything, and it
records the embedder and margin it was trained with.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from pipelines.io.atomic import write_json_atomic
from pipelines.io.config_options import UsageError, not_an_option, option
from pipelines.score.calibration import (MIN_CALIBRATION_ROWS, POOL_GRID_ROWS, Calibration, CalibrationError,
                                         fit_calibration, scaled_grid)
from pipelines.score.features import CURRENT_FEATURE_SET, FEATURE_NAMES, FEATURE_SETS, pair_features
from pipelines.mine.margin import MARGIN_KINDS, MarginConfig, best_candidates, margin_scores, mine, neighbours
from pipelines.mine.search import knn

logger = logging.getLogger(__name__)
SCORER_FILE = "scorer.json"
FORMAT_VERSION = 1
# Nonlinear terms on top of the raw features: margin and cosine matter most, and not linearly.
EXTRA_TERMS = ("cosine^2", "margin^2", "cosine*margin")
MAX_Z = 5.0  # standardised features beyond +-5 training standard deviations are clipped to it
NEGATIVE_KINDS = ("mined", "shuffled", "truncated", "word_swap", "wrong_language", "copy")


class ScorerError(Exception):
    """A scorer file is missing, malformed, or of another format version."""


@dataclass(frozen=True)
class ScorerConfig:
    k: int = option(4, "neighbours for the margins of the mined negatives (as labse-mine --k)")
    margin_kind: str = option("ratio", "margin of the mined negatives (as labse-mine --margin)", choices=MARGIN_KINDS,
                              flag="--margin")
    max_pairs_per_lang: int = option(6000, "parallel rows used per language pair", flag="--max-pairs")
    distractor_share: float = not_an_option(1 / 3)   # share of each side's pool whose partner is absent
    synthetic_share: float = not_an_option(0.2)      # synthetic negatives of each kind, as a share of true pairs
    regularisation_c: float = not_an_option(1.0)
    seed: int = not_an_option(0)
    # 0: no calibration; labse-score then falls back to the uncalibrated product re-weighted by the
    # EM of Saerens et al.
    calibration_rows: int = option(
        POOL_GRID_ROWS, f"held-out parallel rows (beyond --max-pairs) mined into calibration pools, at most "
                        f"(default {POOL_GRID_ROWS:,}); fewer shrink the pools in proportion (a coarser "
                        f"calibration); 0 or at least {MIN_CALIBRATION_ROWS} (0: no calibration)")

    def __post_init__(self) -> None:
        problems = [f"{name} (--{flag}) must be at least 1, got {getattr(self, name)}"
                    for name, flag in (("k", "k"), ("max_pairs_per_lang", "max-pairs")) if getattr(self, name) < 1]
        if self.calibration_rows != 0 and self.calibration_rows < MIN_CALIBRATION_ROWS:
            problems.append(f"calibration_rows (--calibration-rows) must be 0 (no calibration) or at least "
                            f"{MIN_CALIBRATION_ROWS} (the smallest calibration pools), got {self.calibration_rows}")
        if self.margin_kind not in MARGIN_KINDS:
            problems.append(f"margin_kind (--margin) must be one of {MARGIN_KINDS}, got {self.margin_kind!r}")
        if problems:
            raise ValueError("; ".join(problems))


def expand(features: np.ndarray) -> np.ndarray:
    cosine, margin = features[:, 0:1], features[:, 1:2]
    return np.hstack([features, cosine ** 2, margin ** 2, cosine * margin])


@dataclass
class LogisticModel:
    """Standardisation + logistic regression, as plain arrays (saved as JSON, never pickled)."""

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float

    def predict_proba(self, expanded: np.ndarray) -> np.ndarray:
        # Standardised features are clipped to +-MAX_Z: a feature (almost) constant in training, such
        # as same_script for a scorer trained on Latin-script pairs only (scale 0.016), would otherwise
        # move a Cyrillic pair by 60 standard deviations, saturating both models for every ru-en pair.
        standardised = np.clip((expanded - self.mean) / self.scale, -MAX_Z, MAX_Z)
        logits = np.clip(standardised @ self.coef + self.intercept, -40, 40)
        return 1.0 / (1.0 + np.exp(-logits))

    def to_dict(self) -> dict:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist(), "coef": self.coef.tolist(),
                "intercept": self.intercept}

    @classmethod
    def from_dict(cls, payload: dict, n_features: int) -> "LogisticModel":
        arrays = [np.asarray(payload[name], dtype=np.float64) for name in ("mean", "scale", "coef")]
        if any(a.shape != (n_features,) for a in arrays):
            raise ScorerError(f"coefficient arrays do not match {n_features} features")
        intercept = float(payload["intercept"])
        # NaN or infinite coefficients would score every pair NaN, and NaN passes no threshold test
        # loudly: refuse the model when it loads, before any pair is scored.
        if not all(np.isfinite(a).all() for a in arrays) or not np.isfinite(intercept):
            raise ScorerError("non-finite (NaN or infinite) coefficients, scaling or intercept")
        if (arrays[1] == 0).any():
            raise ScorerError("a feature scale of 0 (division by zero)")
        return cls(*arrays, intercept)

    @classmethod
    def fit(cls, features: np.ndarray, labels: np.ndarray, c: float = 1.0) -> "LogisticModel":
        from sklearn.linear_model import LogisticRegression

        expanded = expand(np.asarray(features, dtype=np.float64))
        mean = expanded.mean(axis=0)
        scale = expanded.std(axis=0)
        scale[scale < 1e-9] = 1.0
        model = LogisticRegression(C=c, max_iter=2000, class_weight="balanced")
        model.fit((expanded - mean) / scale, labels)
        return cls(mean, scale, model.coef_[0].astype(np.float64), float(model.intercept_[0]))


class RemoteScorerPath(str):
    """The two things `QualityScorer.load` asks of a path, answered through Beam's FileSystems
    for an object store: is it a directory (no object of that name), and its text."""

    def is_dir(self) -> bool:
        from apache_beam.io.filesystems import FileSystems

        return not self.endswith(".json") or not FileSystems.exists(self)

    def __truediv__(self, name: str) -> "RemoteScorerPath":
        return RemoteScorerPath(self.rstrip("/") + "/" + name)

    def read_text(self, encoding: str = "utf-8") -> str:
        from apache_beam.io.filesystems import FileSystems

        try:
            with FileSystems.open(self, compression_type="uncompressed") as handle:
                return handle.read().decode(encoding)
        except Exception as error:  # Beam's filesystems raise their own error types
            if not FileSystems.exists(self):
                raise FileNotFoundError(self) from error
            raise OSError(f"{self}: {error}") from error


@dataclass
class QualityScorer:
    """score = P_ranker(good | pair) * P_sanity(not corrupted | pair).

    The ranker learns true pairs against the hard negatives margin mining produces; the sanity
    model learns true pairs against synthetic corruptions (copies, wrong language, truncations,
    word swaps, shuffles). Kept apart because the easy synthetic negatives, mixed into one model,
    pull its decision boundary away from the region where mined pairs need ranking (measured on
    Multi30k val: best-threshold F1 0.819 mixed vs 0.859 split).
    """

    ranker: LogisticModel
    sanity: LogisticModel
    embedder: str = ""
    margin_kind: str = "ratio"   # scorer.json keeps it as "margin"
    k: int = 4
    training: dict = field(default_factory=dict)
    calibration: Calibration | None = None   # P(good) on any mined set; see calibration.py
    # how its length features are measured (features.py); a scorer.json without one predates set 2
    feature_set: int = CURRENT_FEATURE_SET

    feature_names = list(FEATURE_NAMES) + list(EXTRA_TERMS)

    def components(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        features = np.asarray(features, dtype=np.float64)
        if features.ndim != 2 or features.shape[1] != len(FEATURE_NAMES):
            raise ValueError(f"expected features of shape [n, {len(FEATURE_NAMES)}], got {features.shape}")
        if len(features) == 0:
            return np.zeros(0), np.zeros(0)
        expanded = expand(features)
        return self.ranker.predict_proba(expanded), self.sanity.predict_proba(expanded)

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        ranker, sanity = self.components(features)
        return ranker * sanity

    def save(self, directory: str | os.PathLike) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        payload = {
            "format_version": FORMAT_VERSION, "model": "logistic_regression x2 (ranker * sanity)",
            "feature_names": self.feature_names, "ranker": self.ranker.to_dict(),
            "sanity": self.sanity.to_dict(), "embedder": self.embedder, "margin": self.margin_kind,
            "k": self.k, "training": self.training, "feature_set": self.feature_set,
        }
        if self.calibration is not None:
            payload["calibration"] = self.calibration.to_dict()
        path = directory / SCORER_FILE
        write_json_atomic(path, payload, indent=1)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "QualityScorer":
        """The scorer in the directory (or file) `path`, local or on an object store (gs://...):
        Dataflow workers load it from the path the job names."""
        if "://" in str(path):
            path = RemoteScorerPath(str(path))
        else:
            path = Path(path)
        if path.is_dir():
            path = path / SCORER_FILE
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as error:
            raise ScorerError(f"no scorer at {path} (train one with `labse-score train`)") from error
        except (OSError, ValueError) as error:
            raise ScorerError(f"cannot read scorer {path}: {error}") from error
        if not isinstance(payload, dict) or payload.get("format_version") != FORMAT_VERSION:
            raise ScorerError(f"{path}: not a scorer of format version {FORMAT_VERSION}")
        if payload.get("feature_names") != cls.feature_names:
            raise ScorerError(f"{path}: scorer features {payload.get('feature_names')} != {cls.feature_names}")
        if payload.get("feature_set", 1) not in FEATURE_SETS:
            raise ScorerError(f"{path}: unknown feature set {payload.get('feature_set')!r} (known: {FEATURE_SETS})")
        try:
            n = len(cls.feature_names)
            calibration = payload.get("calibration")
            return cls(LogisticModel.from_dict(payload["ranker"], n), LogisticModel.from_dict(payload["sanity"], n),
                       payload.get("embedder", ""), payload.get("margin", "ratio"), int(payload.get("k", 4)),
                       payload.get("training", {}),
                       None if calibration is None else Calibration.from_dict(calibration),
                       payload.get("feature_set", 1))
        except CalibrationError as error:
            raise ScorerError(f"{path}: {error}") from error
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ScorerError(f"{path}: malformed scorer: {error}") from error
        except ScorerError as error:
            raise ScorerError(f"{path}: {error}") from error


def fit_scorer(features: np.ndarray, labels: np.ndarray, kinds: Sequence[str],
               config: ScorerConfig = ScorerConfig(), **metadata) -> QualityScorer:
    """Fit the ranker on true vs mined pairs and the sanity model on true vs synthetic pairs."""
    features = np.asarray(features, dtype=np.float64)
    labels = np.asarray(labels)
    kinds = np.asarray(kinds)
    for_ranker = np.isin(kinds, ["true", "mined"])
    for_sanity = kinds != "mined"
    for name, rows in (("ranker", for_ranker), ("sanity", for_sanity)):
        if len(set(labels[rows].tolist())) < 2:
            raise UsageError(f"cannot fit the {name}: training pairs hold only one class")
    return QualityScorer(LogisticModel.fit(features[for_ranker], labels[for_ranker], config.regularisation_c),
                         LogisticModel.fit(features[for_sanity], labels[for_sanity], config.regularisation_c),
                         **metadata)


# ------------------------------------------------------------------------- training data
def read_parallel_file(path: str | os.PathLike) -> list[str]:
    from pipelines.io.text_lines import read_lines

    return read_lines(path)


def find_parallel_file(prefix: str, lang: str) -> str | None:
    for suffix in (f".{lang}.gz", f".{lang}", f".{lang}.txt"):
        if os.path.isfile(prefix + suffix):
            return prefix + suffix
    return None


def corrupt_truncate(text: str, rng: np.random.Generator) -> str:
    words = text.split()
    if len(words) < 3:
        return words[0] if words else text
    return " ".join(words[: max(1, int(len(words) * rng.uniform(0.3, 0.6)))])


def corrupt_word_swap(text: str, vocabulary: Sequence[str], rng: np.random.Generator) -> str:
    words = text.split()
    if not words:
        return text
    n_swap = max(1, len(words) // 3)
    for position in rng.choice(len(words), size=n_swap, replace=False):
        words[position] = vocabulary[int(rng.integers(len(vocabulary)))]
    return " ".join(words)


def pair_margins(src_vectors, tgt_vectors, src_pool, tgt_pool, k: int, margin_kind: str):
    """Cosine and margin of row-aligned pairs whose kNN means are taken in the given pools."""
    cosine = np.einsum("ij,ij->i", src_vectors, tgt_vectors).astype(np.float64)
    fwd_mean = knn(src_vectors, tgt_pool, k)[0].mean(axis=1)
    bwd_mean = knn(tgt_vectors, src_pool, k)[0].mean(axis=1)
    return cosine, margin_scores(cosine, fwd_mean, bwd_mean, margin_kind)


@dataclass
class TrainingSet:
    src: list[str] = field(default_factory=list)
    tgt: list[str] = field(default_factory=list)
    cosine: list[float] = field(default_factory=list)
    margin: list[float] = field(default_factory=list)
    label: list[int] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    src_lang: list[str] = field(default_factory=list)
    tgt_lang: list[str] = field(default_factory=list)

    def add(self, src, tgt, cosine, margin, label: int, kind: str, src_lang: str, tgt_lang: str) -> None:
        n = len(src)
        self.src += list(src)
        self.tgt += list(tgt)
        self.cosine += [float(c) for c in cosine]
        self.margin += [float(m) for m in margin]
        self.label += [label] * n
        self.kind += [kind] * n
        self.src_lang += [src_lang] * n
        self.tgt_lang += [tgt_lang] * n

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for kind in self.kind:
            out[kind] = out.get(kind, 0) + 1
        return out


def _usable_rows(*sides: Sequence[str]) -> list[int]:
    n = min(len(side) for side in sides)
    return [i for i in range(n) if all(side[i].strip() for side in sides)]


def fitting_rows(src: Sequence[str], tgt: Sequence[str], config: ScorerConfig) -> np.ndarray:
    """The rows `build_training_pairs` fits on (same permutation, same seed)."""
    return np.random.default_rng(config.seed).permutation(_usable_rows(src, tgt))[: config.max_pairs_per_lang]


def calibration_rows(srcs: Sequence[Sequence[str]], tgt: Sequence[str], config: ScorerConfig) -> np.ndarray:
    """The rows `train_scorer` mines its calibration pools from: rows no language pair
    was fitted on (their target side is shared), at most `config.calibration_rows` of them."""
    fitted: set[int] = set()
    for n, src in enumerate(srcs):
        fitted.update(fitting_rows(src, tgt, ScorerConfig(**{**asdict(config), "seed": config.seed + n})).tolist())
    held_out = [i for i in _usable_rows(tgt, *srcs) if i not in fitted]
    return np.random.default_rng(config.seed + 999).permutation(held_out)[: config.calibration_rows].astype(np.int64)


class _CachedLid:
    """lid.176 probabilities cached per (text, language): calibration pools share their sentences."""

    def __init__(self, lid):
        self.lid, self.cache = lid, {}

    def probability_of(self, texts: list[str], lang: str) -> list[float]:
        missing = [t for t in dict.fromkeys(texts) if (t, lang) not in self.cache]
        if missing:
            self.cache.update({(t, lang): p for t, p in zip(missing, self.lid.probability_of(missing, lang))})
        return [self.cache[(t, lang)] for t in texts]


def calibration_pools(src: Sequence[str], tgt: Sequence[str], rows: Sequence[int], src_lang: str, tgt_lang: str,
                      embedder, scorer: "QualityScorer", lid, config: ScorerConfig,
                      tgt_vectors: np.ndarray | None = None) -> list[dict]:
    """Mine labelled pools from held-out aligned `rows`: for each (true pairs, distractors) of the
    grid, true pairs plus sentences on each side whose partners are absent, mined as labse-mine does
    (LASER `max`), with the scorer's two outputs and the label (1 = the pair is aligned)."""
    rows = np.asarray(rows)
    src_vectors = embedder.encode([src[i] for i in rows])
    if tgt_vectors is None:
        tgt_vectors = embedder.encode([tgt[i] for i in rows])
    rng = np.random.default_rng(config.seed + 1000)
    pools = []
    for n_true, n_distractor in scaled_grid(len(rows)):
        pick = rng.permutation(len(rows))[: n_true + 2 * n_distractor]
        on_src = np.concatenate([pick[:n_true], pick[n_true:n_true + n_distractor]])
        on_tgt = np.concatenate([pick[:n_true], pick[n_true + n_distractor:]])
        pairs = mine(src_vectors[on_src], tgt_vectors[on_tgt], MarginConfig(k=config.k, margin_kind=config.margin_kind))
        label = ((pairs.src == pairs.tgt) & (pairs.src < n_true)).astype(int)
        features = pair_features([src[rows[on_src[i]]] for i in pairs.src], [tgt[rows[on_tgt[j]]] for j in pairs.tgt],
                                 [src_lang] * len(pairs), [tgt_lang] * len(pairs), pairs.cosine, pairs.margin, lid,
                                 scorer.feature_set)
        ranker, sanity = scorer.components(features)
        pools.append({"language_pair": f"{src_lang}-{tgt_lang}", "true_pairs": int(n_true),
                      "distractors": int(n_distractor), "ranker": ranker, "sanity": sanity,
                      "cosine": pairs.cosine, "margin": pairs.margin, "label": label})
    return pools


def build_training_pairs(src: Sequence[str], tgt: Sequence[str], src_lang: str, tgt_lang: str, embedder,
                         config: ScorerConfig, other_language: Sequence[str] | None = None,
                         into: TrainingSet | None = None) -> TrainingSet:
    """Positives and negatives for one language pair from line-aligned `src`/`tgt`."""
    into = into or TrainingSet()
    rng = np.random.default_rng(config.seed)
    rows = rng.permutation(_usable_rows(src, tgt))[: config.max_pairs_per_lang]  # = fitting_rows(...)
    n_distractor = int(len(rows) * config.distractor_share / (1 + config.distractor_share))
    aligned, src_only, tgt_only = np.split(rows, [len(rows) - 2 * n_distractor, len(rows) - n_distractor])
    src_pool_text = [src[i] for i in aligned] + [src[i] for i in src_only]
    tgt_pool_text = [tgt[i] for i in aligned] + [tgt[i] for i in tgt_only]
    src_pool, tgt_pool = embedder.encode(src_pool_text), embedder.encode(tgt_pool_text)
    n_aligned = len(aligned)
    logger.info("%s-%s: %d true pairs among %d/%d pool sentences", src_lang, tgt_lang, n_aligned,
             len(src_pool_text), len(tgt_pool_text))

    nn = neighbours(src_pool, tgt_pool, config.k)
    fwd_mean, bwd_mean = nn.fwd_mean, nn.bwd_mean
    true_cos = np.einsum("ij,ij->i", src_pool[:n_aligned], tgt_pool[:n_aligned]).astype(np.float64)
    true_margin = margin_scores(true_cos, fwd_mean[:n_aligned], bwd_mean[:n_aligned], config.margin_kind)
    into.add(src_pool_text[:n_aligned], tgt_pool_text[:n_aligned], true_cos, true_margin, 1, "true",
             src_lang, tgt_lang)

    # the mistakes margin mining makes: best candidates that are not the partner
    fwd_best, fwd_m, fwd_c = best_candidates(nn.fwd_sims, nn.fwd_ids, fwd_mean, bwd_mean, config.margin_kind)
    bwd_best, bwd_m, bwd_c = best_candidates(nn.bwd_sims, nn.bwd_ids, bwd_mean, fwd_mean, config.margin_kind)
    mined = {}
    for i, (j, m, c) in enumerate(zip(fwd_best, fwd_m, fwd_c)):
        mined[(i, int(j))] = (m, c)
    for j, (i, m, c) in enumerate(zip(bwd_best, bwd_m, bwd_c)):
        mined[(int(i), j)] = (m, c)
    wrong = [(i, j, m, c) for (i, j), (m, c) in mined.items() if not (i == j and i < n_aligned)]
    into.add([src_pool_text[i] for i, _, _, _ in wrong], [tgt_pool_text[j] for _, j, _, _ in wrong],
             [c for *_, c in wrong], [m for _, _, m, _ in wrong], 0, "mined", src_lang, tgt_lang)

    n_synthetic = max(1, int(n_aligned * config.synthetic_share))
    picks = rng.choice(n_aligned, size=min(n_synthetic, n_aligned), replace=False)
    src_sel = src_pool[picks]

    # shuffled partners: both sides already embedded in the pool
    partners = (picks + rng.integers(1, max(n_aligned, 2), size=len(picks))) % max(n_aligned, 1)
    cosine, margin = pair_margins(src_sel, tgt_pool[partners], src_pool, tgt_pool, config.k, config.margin_kind)
    into.add([src_pool_text[i] for i in picks], [tgt_pool_text[j] for j in partners], cosine, margin, 0,
             "shuffled", src_lang, tgt_lang)

    vocabulary = [w for t in tgt_pool_text[:n_aligned] for w in t.split()] or ["x"]
    # every source below is a pool sentence, already embedded: only new targets are encoded
    src_text = [src_pool_text[i] for i in picks]
    truncated = [corrupt_truncate(tgt_pool_text[i], rng) for i in picks]
    swapped = [corrupt_word_swap(tgt_pool_text[i], vocabulary, rng) for i in picks]
    # a copy on either side: the target is the source sentence, or the source is the target
    copies = [src_pool_text[i] for i in picks[::2]] + [tgt_pool_text[i] for i in picks[1::2]]
    copy_vectors = np.vstack([src_pool[picks[::2]], tgt_pool[picks[1::2]]])
    corrupted = {  # kind -> (source texts, their vectors, target texts, their vectors)
        "truncated": (src_text, src_sel, truncated, embedder.encode(truncated)),
        "word_swap": (src_text, src_sel, swapped, embedder.encode(swapped)),
        "copy": (copies, copy_vectors, copies, copy_vectors),
    }
    if other_language is not None:
        wrong_language = [other_language[rows[i]] for i in picks]
        corrupted["wrong_language"] = (src_text, src_sel, wrong_language, embedder.encode(wrong_language))
    for kind, (s_text, s_vec, t_text, t_vec) in corrupted.items():
        cosine, margin = pair_margins(s_vec, t_vec, src_pool, tgt_pool, config.k, config.margin_kind)
        into.add(s_text, t_text, cosine, margin, 0, kind, src_lang, tgt_lang)
    return into


WRONG_LANGUAGE_PREFERENCE = ("fr", "de", "cs", "es", "it", "ru")  # the prefix form's search order


def shared_target(positives: Sequence) -> tuple[str, str]:
    """(target language, target file) of the language pairs to train on, which must all share both:
    one target file, line i of every source file its translation (the held-out calibration rows
    are rows of that file, and another pair's source is a pair's wrong-language negative). A
    ValueError says what is wrong: no pair, two targets, a language twice, a pair within one language."""
    if not positives:
        raise UsageError("--positives: give at least one SRC_LANG:PATH,TGT_LANG:PATH")
    targets = {(spec.tgt_lang, _same_file_key(spec.tgt_path)) for spec in positives}
    if len(targets) > 1:
        raise UsageError("--positives: every language pair must have the same target file (line-aligned parallel "
                         "text around one target side, e.g. de:train.de.gz,en:train.en.gz and fr:train.fr.gz,"
                         "en:train.en.gz), got " + ", ".join(str(spec) for spec in positives))
    sources = [spec.src_lang for spec in positives]
    for spec in positives:
        if spec.src_lang == spec.tgt_lang:
            raise UsageError(f"--positives: {spec} pairs {spec.src_lang} with itself")
        if sources.count(spec.src_lang) > 1:
            raise UsageError(f"--positives: source language {spec.src_lang} is given twice")
    return positives[0].tgt_lang, positives[0].tgt_path


def _same_file_key(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


def wrong_language_files(positives: Sequence, other_language: tuple[str, str] | None = None
                         ) -> dict[str, tuple[str, str]]:
    """Source language -> (language, file) of its "wrong language" negative: line i of that file is
    line i of the target in a third language, paired with the source as if it were the target.

    `other_language` (LANG, PATH), when given, serves every language pair it is a third language of;
    the others take the source file of another language pair (in the order given: de-en gets fr's,
    fr-en gets de's). A language pair left without one is a ValueError that says what to add.
    """
    chosen = {}
    for spec in positives:
        pair_langs = (spec.src_lang, spec.tgt_lang)
        if other_language is not None and other_language[0] not in pair_langs:
            chosen[spec.src_lang] = other_language
            continue
        other = next(((o.src_lang, o.src_path) for o in positives if o.src_lang not in pair_langs), None)
        if other is None:
            raise UsageError(
                f"--positives {spec}: no third language for its wrong-language negatives (line i of the target "
                f"translated into another language, paired with source line i); add --other-language LANG:PATH, "
                f"a file line-aligned with {spec.tgt_path}, or another --positives language pair on the same "
                f"target, or --other-language none to train without them")
        chosen[spec.src_lang] = other
    return chosen


def train_scorer(positives: Sequence, embedder_spec: str, output: str | os.PathLike,
                 config: ScorerConfig = ScorerConfig(), wrong_language: dict | None = None,
                 embedder=None, lid=None, training: dict | None = None) -> QualityScorer:
    """Train on line-aligned parallel text and save the scorer under `output`.

    `positives`: `ParallelTextSpec`s (`pipelines/io/parallel_text.py`), one per language pair, all
    around one target file (`shared_target`). `wrong_language`: source language -> (language, file)
    of its wrong-language negatives, None or absent for none (`wrong_language_files` derives it);
    each such file must have as many lines as the target.
    """
    from pipelines.embed.embedders import load_embedder
    from pipelines.text.langid import LanguageIdentifier

    tgt_lang, tgt_path = shared_target(positives)
    wrong_language = wrong_language or {}
    src_langs = [spec.src_lang for spec in positives]
    src_paths = {spec.src_lang: spec.src_path for spec in positives}

    @functools.cache  # a file can be one pair's source and another's wrong-language negative: read it once
    def lines(path: str) -> list[str]:
        return read_parallel_file(path)

    tgt = lines(tgt_path)
    for src_lang in src_langs:  # every file is read (and checked) before any embedding work
        lines(src_paths[src_lang])
        other = wrong_language.get(src_lang)
        if other is not None and len(lines(other[1])) != len(tgt):
            raise UsageError(f"wrong-language file {other[1]} ({other[0]}) has {len(lines(other[1]))} lines, "
                             f"the target {tgt_path} {len(tgt)}: they are not line-aligned")
    embedder = embedder or load_embedder(embedder_spec)
    lid = lid or LanguageIdentifier()
    data = TrainingSet()
    for n, src_lang in enumerate(src_langs):
        src = lines(src_paths[src_lang])
        # a third language's translation of the same line is the "wrong language" negative
        other = wrong_language.get(src_lang)
        other_lines = lines(other[1]) if other is not None else None
        build_training_pairs(src, tgt, src_lang, tgt_lang, embedder,
                             ScorerConfig(**{**asdict(config), "seed": config.seed + n}), other_lines, data)
    logger.info("features of %d training pairs (lid.176 on both sides), then the fit", len(data.label))
    features = pair_features(data.src, data.tgt, data.src_lang, data.tgt_lang, data.cosine, data.margin, lid)
    labels = np.asarray(data.label)
    scorer = fit_scorer(features, labels, data.kind, config, embedder=embedder_spec, margin_kind=config.margin_kind, k=config.k,
                        training={**(training or {}), "positives": [str(spec) for spec in positives],
                                  "src_langs": list(src_langs), "tgt_lang": tgt_lang,
                                  "wrong_language": {lang: f"{o[0]}:{o[1]}" for lang, o in wrong_language.items() if o},
                                  "counts": data.counts(), "config": asdict(config)})
    probabilities = scorer.predict_proba(features)
    scorer.training["train_accuracy"] = float(((probabilities >= 0.5) == labels).mean())
    if config.calibration_rows > 0:
        rows = calibration_rows([lines(src_paths[lang]) for lang in src_langs], tgt, config)
        if len(scaled_grid(len(rows))) == 0:
            logger.warning("only %d held-out rows: the scorer is saved without calibration", len(rows))
        else:
            cached_lid = _CachedLid(lid)
            logger.info("calibration: %d held-out rows, mined into pools per language pair", len(rows))
            tgt_vectors = embedder.encode([tgt[i] for i in rows])
            pools = []
            for src_lang in src_langs:
                pools += calibration_pools(lines(src_paths[src_lang]), tgt, rows, src_lang, tgt_lang, embedder, scorer,
                                           cached_lid, config, tgt_vectors=tgt_vectors)
            scorer.calibration = fit_calibration(pools, config.margin_kind)
            scorer.training["calibration"] = {"held_out_rows": int(len(rows)), "pools": len(pools),
                                              "pairs": int(sum(len(p["label"]) for p in pools))}
    scorer.save(output)
    logger.info("scorer trained on %s, accuracy on its training pairs %.3f", data.counts(),
             scorer.training["train_accuracy"])
    return scorer


def train_scorer_from_prefix(prefix: str, src_langs: Sequence[str], tgt_lang: str, embedder_spec: str,
                             output: str | os.PathLike, config: ScorerConfig = ScorerConfig(),
                             embedder=None, lid=None) -> QualityScorer:
    """The older form (`labse-score train --positives PREFIX --src-langs --tgt-lang`, deprecated):
    `PREFIX.{lang}[.gz|.txt]` files; each language pair's wrong-language file is the first of
    `WRONG_LANGUAGE_PREFERENCE` found beside them (none when there is none)."""
    from pipelines.io.parallel_text import ParallelTextSpec

    def path(lang: str) -> str:
        found = find_parallel_file(prefix, lang)
        if found is None:
            raise FileNotFoundError(f"no parallel file {prefix}.{lang}[.gz]")
        return found

    positives = [ParallelTextSpec(src_lang, path(src_lang), tgt_lang, path(tgt_lang)) for src_lang in src_langs]
    wrong_language = {}
    for src_lang in src_langs:
        other = next((lang for lang in WRONG_LANGUAGE_PREFERENCE
                      if lang not in (src_lang, tgt_lang) and find_parallel_file(prefix, lang)), None)
        wrong_language[src_lang] = (other, path(other)) if other else None
    return train_scorer(positives, embedder_spec, output, config, wrong_language, embedder, lid,
                        training={"prefix": prefix})
