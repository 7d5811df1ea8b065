"""MainContentModel (contract 3): clear errors for bad files, featurisation, and a real trained model."""
import subprocess
import sys

import numpy as np
import pytest

from pipelines.main_content.model import (
    FEATURE_SET_TOKEN,
    MainContentModel,
    MainContentModelError,
    featurise_document,
    html_main_flags,
    postprocess_scores,
    training_lines,
)
from pipelines.main_content.train import TrainConfig, train_fasttext

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
    train_fasttext(str(folder / "train.txt"), str(path), TrainConfig(epoch=10, bucket=20_000, dim=8, threads=1))
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
    from pipelines.clean import main as clean_main

    bad = tmp_path / "bad.bin"
    bad.write_bytes(tiny_model.read_bytes()[:5000])
    warc = require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz")
    out = tmp_path / "out"
    assert clean_main(["--input", str(warc), "--output", str(out), "--main-content-model", str(bad)]) == 2
    assert not (out / "stats.json").exists()


def test_cli_reports_a_bad_model_clearly(tmp_path, labse_data):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"garbage")
    warc = require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz")
    done = subprocess.run([sys.executable, "-m", "pipelines.main_content.cli", "evaluate", "--model", str(bad),
                           "--input", str(warc)], capture_output=True, text=True)
    assert done.returncode == 2 and "not a fastText model" in done.stderr and "Traceback" not in done.stderr


def test_score_lines_accepts_the_page_html(tiny_model):
    from tests.test_main_content_labels import PAGE
    from pipelines.text.html import html_to_lines

    model = MainContentModel.load(str(tiny_model))
    lines = html_to_lines(PAGE)
    with_html = model.score_lines(lines, html=PAGE)
    assert with_html.shape == (len(lines),) and np.all((with_html >= 0) & (with_html <= 1))
    assert np.allclose(model.score_lines(lines), model.score_lines_with_flags(lines, None))


def test_quantized_model_loads_validates_and_scores(tmp_path, tiny_model):
    path = tmp_path / "model.ftz"
    train_fasttext(str(tiny_model.parent / "train.txt"), str(path),
                   TrainConfig(epoch=10, bucket=20_000, dim=8, threads=1, quantize=True))
    assert path.stat().st_size < tiny_model.stat().st_size
    scores = MainContentModel.load(str(path)).score_lines(NAV + ARTICLE + FOOTER)
    assert scores[len(NAV):len(NAV) + len(ARTICLE)].min() > scores[:len(NAV)].max()
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(MainContentModelError, match="truncated"):
        MainContentModel.load(str(path))
