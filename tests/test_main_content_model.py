"""MainContentModel (contract 3): clear errors for bad files, featurisation, and a real trained model."""
import bisect
import subprocess
import sys

import numpy as np
import pytest

from pipelines.main_content import model as model_module
from pipelines.main_content.model import (
    FEATURE_SET_TOKEN,
    MainContentModel,
    MainContentModelError,
    featurise_document,
    html_main_flags,
    postprocess_scores,
    training_lines,
)
from pipelines.main_content.config import MainContentTrainConfig
from pipelines.main_content.train import train_fasttext

from tests.conftest import require_file

NAV = ["Home", "News", "Sport", "Weather", "Contact us"]
ARTICLE = [
    "River restoration brings salmon back to the upper valley",
    "For the first time in forty years, wild salmon have been counted above the old mill weir, after volunteers removed barriers.",
    "The project, funded by the regional water board and fishing clubs, replaced the weir with shallow stone steps for fish.",
    "Biologists counted more than two hundred adult fish in October and expect the numbers to grow in the coming years.",
]
FOOTER = ["Copyright 2024 Valley Gazette. All rights reserved.", "Privacy policy | Terms of use"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A small real model trained (in a subprocess, as `train` does) on synthetic pages."""
    folder = tmp_path_factory.mktemp("tiny")
    rows = []
    for page in range(60):
        lines = [f"{n} {page % 7}" if page % 3 == 0 else n for n in NAV] + ARTICLE + FOOTER
        rows += training_lines(lines, [False] * len(NAV) + [True] * len(ARTICLE) + [False] * len(FOOTER))
    (folder / "train.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    path = folder / "model.bin"
    train_fasttext(str(folder / "train.txt"), str(path), MainContentTrainConfig(epoch=10, bucket=20_000, dim=8, threads=1))
    return path


def test_featurisation_is_one_clean_string_per_line():
    lines = NAV + ARTICLE + FOOTER
    feats = featurise_document(lines)
    assert len(feats) == len(lines) and featurise_document(lines) == feats
    assert all(f.startswith(FEATURE_SET_TOKEN + " ") and "\n" not in f for f in feats)
    assert "p:contact" in feats[len(NAV)] and "n:for" in feats[len(NAV)]  # neighbour context
    assert featurise_document([]) == []
    assert training_lines(["a"], [True])[0].startswith("__label__main __fs_")
    assert all(" RMx " in f for f in feats)  # no HTML: the HTML feature is "unknown"
    with_html = featurise_document(lines, [False] * len(NAV) + [True] * len(ARTICLE) + [False] * len(FOOTER))
    assert " RM1 " in with_html[len(NAV)] and " RM0 " in with_html[0]
    with pytest.raises(ValueError):
        featurise_document(lines, [True])


def test_html_feature_flags_the_lines_resiliparse_keeps_as_main_content():
    from tests.test_main_content_labels import PAGE
    from pipelines.text.html import html_to_lines

    lines = html_to_lines(PAGE)
    flags = dict(zip(lines, html_main_flags(lines, PAGE)))
    assert flags["Home"] is False and flags["Privacy policy | Terms of use"] is False
    assert flags[next(line for line in lines if line.startswith("Biologists"))] is True


def test_trained_model_separates_article_from_navigation(tiny_model):
    model = MainContentModel.load(str(tiny_model))
    scores = model.score_lines(NAV + ARTICLE + FOOTER)
    assert scores.dtype == np.float32 and scores.shape == (len(NAV) + len(ARTICLE) + len(FOOTER),)
    assert np.all((scores >= 0) & (scores <= 1))
    assert scores[len(NAV):len(NAV) + len(ARTICLE)].min() > 0.5
    assert scores[:len(NAV)].max() < 0.5 and scores[-len(FOOTER):].max() < 0.5
    assert model.score_lines([]).shape == (0,)


def test_postprocess_drops_prose_far_from_the_main_run():
    lines = ["x " * 40] * 10 + ["menu"] * 30 + ["y " * 40]
    raw = np.array([0.95] * 10 + [0.05] * 30 + [0.7])
    out = postprocess_scores(raw, lines)
    assert out[:10].min() > 0.5 and out[-1] < 0.5
    with pytest.raises(ValueError):
        postprocess_scores(raw, lines[:-1])


@pytest.mark.parametrize("content, message", [
    (None, "not found"),
    (b"", "empty"),
    (b"this is not a fastText model, just some text" * 5, "not a fastText model"),
])
def test_bad_files_give_a_clear_error(tmp_path, content, message):
    path = tmp_path / "model.bin"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(MainContentModelError, match=message):
        MainContentModel.load(str(path))


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.999])
def test_truncated_model_is_refused_before_fasttext_sees_it(tiny_model, tmp_path, keep):
    data = tiny_model.read_bytes()
    path = tmp_path / "truncated.bin"
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(MainContentModelError, match="truncated"):
        MainContentModel.load(str(path))
    path.write_bytes(data + b"\0")
    with pytest.raises(MainContentModelError, match="trailing"):
        MainContentModel.load(str(path))


def test_a_fasttext_model_of_another_kind_is_refused():
    from pipelines.text.langid import lid176_path

    with pytest.raises(MainContentModelError, match="not a main-content model"):
        MainContentModel.load(lid176_path())


def test_labse_clean_refuses_a_truncated_model_before_the_pipeline(labse_data, tiny_model, tmp_path):
    from pipelines.clean.cli import main as clean_main

    bad = tmp_path / "bad.bin"
    bad.write_bytes(tiny_model.read_bytes()[:5000])
    warc = require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz")
    out = tmp_path / "out"
    assert clean_main(["--input", str(warc), "--output", str(out), "--main-content-model", str(bad)]) == 2
    assert not (out / "stats.json").exists()


def test_a_model_on_an_object_store_is_loaded_and_its_local_copy_removed(tiny_model, tmp_path, monkeypatch):
    """labse-clean workers copy a gs://-style model to a temporary file for fastText, load it and
    delete the copy at once; a missing remote model is a clear MainContentModelError."""
    import tempfile

    from pipelines.clean.transforms import load_main_content_model
    from tests.object_store import ObjectStoreOnDisk

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    model = load_main_content_model(ObjectStoreOnDisk.PREFIX + str(tiny_model))
    assert model.score_lines(NAV + ARTICLE + FOOTER).shape == (len(NAV + ARTICLE + FOOTER),)
    assert list(scratch.iterdir()) == []
    with pytest.raises(MainContentModelError, match="cannot copy main-content model"):
        load_main_content_model(ObjectStoreOnDisk.PREFIX + str(tmp_path / "missing.bin"))
    assert list(scratch.iterdir()) == []


def test_cli_reports_a_bad_model_clearly(tmp_path, labse_data):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"garbage")
    warc = require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz")
    done = subprocess.run([sys.executable, "-m", "pipelines.main_content.cli", "evaluate", "--model", str(bad),
                           "--input", str(warc)], capture_output=True, text=True)
    assert done.returncode == 2 and "not a fastText model" in done.stderr and "Traceback" not in done.stderr


def test_score_lines_uses_the_page_html(tmp_path):
    """A model trained where only the HTML feature tells the label (the same lines are main on one
    page and boilerplate on the next, as resiliparse flags them): given the page's HTML, score_lines
    follows resiliparse's flags; without it the model cannot tell."""
    import random

    from tests.test_main_content_labels import PAGE
    from pipelines.text.html import html_to_lines

    lines = html_to_lines(PAGE)
    flags = html_main_flags(lines, PAGE)
    assert 0 < sum(flags) < len(lines), flags
    rng = random.Random(0)
    rows = []
    for _page in range(80):
        labels = [rng.random() < 0.5 for _ in lines]
        rows += training_lines(lines, labels, labels)
    (tmp_path / "train.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    train_fasttext(str(tmp_path / "train.txt"), str(tmp_path / "model.bin"),
                   MainContentTrainConfig(epoch=10, bucket=20_000, dim=8, threads=1))
    model = MainContentModel.load(str(tmp_path / "model.bin"))

    with_html = model.score_lines(lines, html=PAGE)
    assert with_html.shape == (len(lines),) and np.all((with_html >= 0) & (with_html <= 1))
    np.testing.assert_array_equal(with_html, model.score_lines_with_flags(lines, flags))
    assert (with_html > 0.5).tolist() == flags, with_html
    assert (model.score_lines(lines) > 0.5).tolist() != flags


def test_quantized_model_loads_validates_and_scores(tmp_path, tiny_model):
    path = tmp_path / "model.ftz"
    train_fasttext(str(tiny_model.parent / "train.txt"), str(path),
                   MainContentTrainConfig(epoch=10, bucket=20_000, dim=8, threads=1, quantize=True))
    assert path.stat().st_size < tiny_model.stat().st_size
    scores = MainContentModel.load(str(path)).score_lines(NAV + ARTICLE + FOOTER)
    assert scores[len(NAV):len(NAV) + len(ARTICLE)].min() > scores[:len(NAV)].max()
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(MainContentModelError, match="truncated"):
        MainContentModel.load(str(path))


# Straightforward reference implementations of featurisation, fastText post-processing and page
# smoothing (the code the trained models and the measured quality were made with). The fast
# versions in model.py must give byte-identical strings and identical float32 scores.

def _featurise_reference(lines, end, html_main=None):
    m = model_module
    n = len(lines)
    if n == 0:
        return []
    tokens = [line.lower().split()[:m.MAX_LINE_TOKENS] for line in lines]
    length_buckets = [bisect.bisect_right(m._CHAR_LENGTH_EDGES, len(line)) for line in lines]
    prose = [len(line) >= m.PROSE_MIN_CHARS and line[-1] in m._SENTENCE_END for line in lines]
    own = [" ".join(t) for t in tokens]
    heads = [f"L{lb} W{bisect.bisect_right(m._TOKEN_COUNT_EDGES, len(toks))}"
             for lb, toks in zip(length_buckets, tokens)]
    ends = [m._end_class(line) if line else "E0" for line in lines]
    as_prev = [f"pL{lb} p:" + " p:".join(toks[:m.CONTEXT_TOKENS]) if toks else f"pL{lb} "
               for lb, toks in zip(length_buckets, tokens)]
    as_next = [f"nL{lb} n:" + " n:".join(toks[:m.CONTEXT_TOKENS]) if toks else f"nL{lb} "
               for lb, toks in zip(length_buckets, tokens)]
    as_prev.insert(0, "pL_start")
    as_next.append("nL_end")
    distance = [min([abs(i - j) for j in range(n) if prose[j]], default=1 << 30) for i in range(n)]
    prose_at = [i for i in range(n) if prose[i]]
    first_prose, last_prose = (prose_at[0], prose_at[-1]) if prose_at else (n, -1)
    prose_chars = sum(len(line) for line, is_prose in zip(lines, prose) if is_prose) or 1
    html_tokens = ["RMx"] * n if html_main is None else ["RM1" if flag else "RM0" for flag in html_main]
    window_tokens = (["RWx"] * n if html_main is None
                     else [f"RW{sum(html_main[max(0, i - 2):i + 3])}" for i in range(n)])
    features = []
    for i in range(n):
        d = distance[i]
        span = "Sin" if first_prose <= i <= last_prose else ("Sbefore" if i < first_prose else "Safter")
        nearby = sum(prose[max(0, i - 4):min(n, i + 5)])
        chars_before = sum(len(lines[j]) for j in range(i) if prose[j])
        features.append(
            f"{m.FEATURE_SET_TOKEN} {heads[i]} P{i * m._POSITION_BUCKETS // n} {ends[i]} "
            f"{m._DISTANCE_TOKENS[d] if d < 9 else 'D4'} {span} PD{min(nearby, 5)} "
            f"PM{chars_before * 5 // prose_chars} {html_tokens[i]} {window_tokens[i]} {own[i]} "
            f"{as_prev[i]} {as_next[i + 1]}{end}")
    return features


def _raw_scores_reference(model, lines, html_main):
    labels, probs = model._model.f.multilinePredict(_featurise_reference(lines, "\n", html_main), 1, 0.0, "replace")
    top = np.concatenate(probs).astype(np.float64)
    is_main = np.array([label == ["__label__main"] for label in labels])
    return np.clip(np.where(is_main, top, 1.0 - top), 0.0, 1.0)


def _postprocess_scores_reference(raw, lines, window=2, region_pivot=0.5, region_min_share=0.3, outside_factor=0.5):
    scores = np.asarray(raw, dtype=np.float64)
    n = len(scores)
    if window > 0 and n > 1:
        padded = np.pad(scores, (window, window), mode="edge")
        local = np.convolve(padded, np.ones(2 * window + 1) / (2 * window + 1), mode="valid")
        scores = 0.5 * scores + 0.5 * local
    weights = np.array([line.count(" ") + 1.0 for line in lines]) * (scores - region_pivot)
    prefix = np.concatenate(([0.0], np.cumsum(weights)))
    running_low = np.minimum.accumulate(prefix)
    low_at = np.maximum.accumulate(np.where(prefix <= running_low, np.arange(n + 1), 0))
    ending = prefix[1:] - running_low[:-1]
    best = float(ending.max())
    if best > 0:  # every run scoring >= share * best, best first, unless it overlaps a taken one
        inside = np.zeros(n, dtype=bool)
        candidates = np.flatnonzero(ending >= region_min_share * best)
        chosen = []
        for end in candidates[np.argsort(-ending[candidates], kind="stable")].tolist():
            start = int(low_at[end])
            if all(end < a or start > b for a, b in chosen):
                chosen.append((start, end))
                inside[start:end + 1] = True
        scores = np.where(inside, scores, scores * outside_factor)
    return np.clip(scores, 0.0, 1.0).astype(np.float32)


@pytest.fixture(scope="module")
def sample_pages(labse_data):
    """(lines, HTML flags) of every page of the real samples, as labse-clean gets them."""
    from pipelines.main_content.evaluate import html_pages
    from pipelines.text.html import parse_html, tree_to_lines

    pages = []
    for name in ("commoncrawl/CC-MAIN-2020-34-sample.warc.gz", "commoncrawl/web-pages-sample.warc.gz",
                 "maincontent/article-pages.warc.gz"):
        for _url, html in html_pages(str(require_file(labse_data, name))):
            tree = parse_html(html)
            lines = tree_to_lines(tree)
            if lines:
                pages.append((lines, html_main_flags(lines, tree)))
    assert len(pages) >= 300
    return pages


ODD_LINES = ["", " ", "\t a  B\u00a0c ", "ΟΔΟΣ Σ.", "x" * 700, " ".join(["Tok"] * 40) + " !", "İstanbul ǅ ß 42",
             "word " * 20 + "end.", "Menu »", "¿Qué?", "価格は100円です。"]


def test_html_flags_equal_the_reference_on_every_sample_page(labse_data):
    """html_main_flags (normalised blocks by html_to_lines' fast path) == membership in the set of
    `" ".join(block.split())` of resiliparse's main-content blocks, on every sample page, with
    empty and whitespace-odd lines added."""
    from resiliparse.extract.html2text import extract_plain_text

    from pipelines.main_content.evaluate import html_pages
    from pipelines.text.html import parse_html, tree_to_lines

    pages = 0
    for name in ("commoncrawl/CC-MAIN-2020-34-sample.warc.gz", "commoncrawl/web-pages-sample.warc.gz",
                 "maincontent/article-pages.warc.gz"):
        for _url, html in html_pages(str(require_file(labse_data, name))):
            tree = parse_html(html)
            lines = tree_to_lines(tree) + ODD_LINES
            text = extract_plain_text(tree, preserve_formatting=True, main_content=True, list_bullets=False,
                                      alt_texts=False, links=False, form_fields=False, noscript=False)
            kept = {" ".join(block.split()) for block in text.split("\n")}
            assert html_main_flags(lines, tree) == [line in kept for line in lines]
            pages += 1
    assert pages >= 300


def test_featurisation_equals_the_reference_on_every_sample_page(sample_pages):
    for lines, flags in sample_pages:
        assert featurise_document(lines) == _featurise_reference(lines, "")
        assert featurise_document(lines, flags) == _featurise_reference(lines, "", flags)
    for k in range(len(ODD_LINES)):  # whitespace, empty and very long lines, in every position
        for lines in (ODD_LINES[k:] + ODD_LINES[:k], ODD_LINES[:k + 1], ODD_LINES[k:] * 3):
            assert featurise_document(lines) == _featurise_reference(lines, "")


@pytest.mark.parametrize("numpy_from_lines", [0, 100, 10 ** 9])  # all long, as shipped, all short
def test_scores_equal_the_reference_on_every_sample_page(tiny_model, sample_pages, monkeypatch, numpy_from_lines):
    monkeypatch.setattr(model_module, "_NUMPY_FROM_LINES", numpy_from_lines)
    model = MainContentModel.load(str(tiny_model))
    rng = np.random.default_rng(0)
    for lines, flags in sample_pages:
        raw = _raw_scores_reference(model, lines, flags)
        np.testing.assert_array_equal(model.raw_scores(lines, flags), raw)
        np.testing.assert_array_equal(model.score_lines_with_flags(lines, flags),
                                      _postprocess_scores_reference(raw, lines))
        # Random scores, some rounded so that runs tie: every branch of the region selection.
        for scores in (rng.random(len(lines)), np.round(rng.random(len(lines)), 1)):
            np.testing.assert_array_equal(postprocess_scores(scores, lines),
                                          _postprocess_scores_reference(scores, lines))
