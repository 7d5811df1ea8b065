"""labse-clean's main-content modes (pipelines.main_content.scoring): classifier, classifier with
fallback to trafilatura, teacher alone; each through labse-clean on the real Common Crawl samples."""
import json

import pytest

from pipelines.clean.cli import main
from pipelines.clean.config import CleanConfig
from pipelines.main_content.scoring import MainContentScorer, uncertain_share
from pipelines.accounting import main_content_section
from tests.conftest import require_file

CC = "commoncrawl/CC-MAIN-2020-34-sample.warc.gz"
WEB = "commoncrawl/web-pages-sample.warc.gz"


def test_uncertain_share_weighs_lines_by_words():
    lines = ["one two three", "four", "five six"]
    assert uncertain_share(lines, [0.9, 0.5, 0.1]) == pytest.approx(1 / 6)
    assert uncertain_share(lines, [0.45, 0.59, 0.4]) == 1.0
    assert uncertain_share(lines, [0.6, 0.39, 1.0]) == 0.0  # the band is [0.4, 0.6)
    assert uncertain_share([], []) == 0.0


def test_mode_options_are_checked_in_one_line():
    with pytest.raises(ValueError, match="needs --main-content-model"):
        CleanConfig(main_content_fallback=0.1)
    with pytest.raises(ValueError, match="between 0 and 1"):
        CleanConfig(main_content_model="m.bin", main_content_fallback=1.5)
    with pytest.raises(ValueError, match="exclude each other"):
        CleanConfig(main_content_model="m.bin", main_content_teacher=True)
    with pytest.raises(ValueError):
        MainContentScorer(fallback=0.1)


def test_the_stats_section_counts_pages_per_decider():
    section = main_content_section({"main_content.classifier": 6, "main_content.fallback": 2, "documents.read": 9})
    assert section == {"pages": {"classifier": 6, "fallback": 2}, "fallback_share": 0.25}
    assert main_content_section({"documents.read": 3}) == {"pages": {}, "fallback_share": 0.0}
    failed = main_content_section({"main_content.classifier": 3, "main_content.fallback_failed": 1})
    assert failed["fallback_share"] == 0.25


@pytest.fixture(scope="module")
def model(labse_data, tmp_path_factory):
    """A real fastText main-content model, trained on teacher labels of 40 pages of the web sample."""
    from pipelines.io.documents import KIND_HTML, Document
    from pipelines.main_content.config import MainContentTrainConfig
    from pipelines.main_content.labels import label_page
    from pipelines.main_content.model import training_lines
    from pipelines.main_content.train import train_fasttext
    from pipelines.read.readers import read_records

    work = tmp_path_factory.mktemp("modes")
    rows = []
    pages = [r for r in read_records(str(require_file(labse_data, WEB)), "warc")
             if isinstance(r, Document) and r.kind == KIND_HTML][:40]
    for doc in pages:
        page = label_page(doc.url, doc.body, scheme="teacher")
        if page.lines:
            rows += training_lines(page.lines, page.labels, page.html_main)
    (work / "train.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    train_fasttext(str(work / "train.txt"), str(work / "mc.bin"), MainContentTrainConfig(epoch=5, threads=1))
    return str(work / "mc.bin")


def _clean(labse_data, out, *options) -> tuple[dict, set]:
    import pyarrow.parquet as pq

    assert main(["--input", str(require_file(labse_data, CC)), "--output", str(out), *options]) == 0
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert stats["identity_holds"]
    texts = {text for path in sorted(out.rglob("*.parquet")) for text in pq.read_table(path)["text"].to_pylist()}
    return stats, texts


@pytest.mark.slow
def test_each_mode_runs_through_labse_clean_and_is_counted(labse_data, model, tmp_path):
    stats, classifier = _clean(labse_data, tmp_path / "classifier", "--main-content-model", model)
    scored = stats["main_content"]["pages"]["classifier"]
    assert scored > 10 and stats["main_content"] == {"pages": {"classifier": scored}, "fallback_share": 0.0}

    stats, teacher = _clean(labse_data, tmp_path / "teacher", "--main-content-teacher")
    assert stats["main_content"]["pages"] == {"teacher": scored} and teacher and teacher != classifier

    # Share 0: every page is "unsure enough", so all go to the fallback's teacher (fast, recall mode,
    # the model's sure boilerplate vetoed): output of its own, neither the classifier's nor the teacher's.
    stats, everything = _clean(labse_data, tmp_path / "all", "--main-content-model", model,
                               "--main-content-fallback", "0")
    assert stats["main_content"] == {"pages": {"fallback": scored}, "fallback_share": 1.0}
    assert everything and everything != teacher and everything != classifier

    stats, mixed = _clean(labse_data, tmp_path / "mixed", "--main-content-model", model,
                          "--main-content-fallback", "0.05")
    pages = stats["main_content"]["pages"]
    assert pages.get("classifier", 0) + pages.get("fallback", 0) == scored
    assert stats["main_content"]["fallback_share"] == round(pages.get("fallback", 0) / scored, 4)
    assert stats["config"]["main_content_fallback"] == 0.05
    assert mixed <= classifier | everything  # each page's sentences come from one of the two deciders


class _UnsureModel:
    """Stands in for MainContentModel: every line scores 0.5 (the model is unsure everywhere)."""

    def score_lines(self, lines, html=None):
        import numpy as np

        return np.full(len(lines), 0.5, dtype=np.float32)

    def score_lines_with_flags(self, lines, html_main):
        return self.score_lines(lines)


class _FixedModel(_UnsureModel):
    """Stands in for MainContentModel: the given score per line."""

    def __init__(self, scores):
        self.scores = scores

    def score_lines(self, lines, html=None):
        import numpy as np

        return np.array(self.scores, dtype=np.float32)


def test_who_decides_text_input_and_a_failing_teacher(monkeypatch):
    from pipelines.main_content import labels, scoring

    html = "<html><body><p>The council approved the new budget on Tuesday after a long debate.</p></body></html>"
    lines = ["The council approved the new budget on Tuesday after a long debate."]
    assert MainContentScorer(teacher=True).score(lines, None) == (None, None)  # text input: the rules decide
    assert MainContentScorer(teacher=True).score(lines, html) == ([1.0], scoring.BY_TEACHER)
    unsure = MainContentScorer(model=_UnsureModel(), fallback=0.5)
    assert unsure.score(lines, None) == ([0.5], scoring.BY_CLASSIFIER)  # no HTML: nothing to fall back to
    assert unsure.score(lines, html) == ([1.0], scoring.BY_FALLBACK)

    def broken(*_args, **_kwargs):
        raise RuntimeError("lxml gave up")

    # On a page sent back, a line the teacher keeps but the model is sure is boilerplate is dropped.
    two = "<html><body><p>The council approved the new budget on Tuesday after a long debate.</p>" \
          "<p>Residents may comment on the plan at the town hall until the end of the month.</p></body></html>"
    pair = ["The council approved the new budget on Tuesday after a long debate.",
            "Residents may comment on the plan at the town hall until the end of the month."]
    assert MainContentScorer(model=_FixedModel([0.5, 0.5]), fallback=0.5).score(pair, two) == (
        [1.0, 1.0], scoring.BY_FALLBACK)
    assert MainContentScorer(model=_FixedModel([0.5, scoring.FALLBACK_MODEL_FLOOR - 0.01]), fallback=0.4).score(
        pair, two) == ([1.0, 0.0], scoring.BY_FALLBACK)

    monkeypatch.setattr(labels, "teacher_extract", broken)
    assert unsure.score(lines, html) == ([0.0], "fallback_failed")
    assert MainContentScorer(teacher=True).score(lines, html) == ([0.0], "teacher_failed")
