"""build-data (Beam, 2 worker processes) -> train -> evaluate on the real Common Crawl samples."""
import json
import shutil
from collections import Counter

import pytest

from pipelines.main_content import cli
from pipelines.main_content.config import BuildConfig
from pipelines.main_content.transforms import training_examples
from pipelines.main_content.evaluate import labelled_pages_from_warc, token_f1
from pipelines.main_content.labels import split_of
from pipelines.main_content.train import read_pages

from tests.conftest import require_file

# The fixture's first use runs the README's cleaning and main-content blocks when the docs test has
# not run them yet in this session (this module alone): the blocks' own limit, not the test's 900 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def built(labse_data, doc_runs):
    """build-data on both sample WARCs with 2 worker processes: the README's example is this command,
    so the docs test's run of it is read here rather than repeated."""
    from test_doc_commands import documented_output

    require_file(labse_data, "commoncrawl/web-pages-sample.warc.gz")
    require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz")
    pattern = str(labse_data / "commoncrawl" / "*.warc.gz")
    out = documented_output(doc_runs, "README.md", "labse-main-content build-data --input "
                            "'../shared/data/commoncrawl/*.warc.gz' --output out/mc-data "
                            "--direct_running_mode multi_processing --direct_num_workers 2", "out/mc-data")
    return pattern, out


def test_stats_account_for_every_record(built):
    _pattern, out = built
    stats = json.loads((out / "stats.json").read_text())
    assert stats["identity_holds"]
    # 126 HTML responses; requests, metadata and warcinfo records are dropped by reason
    assert stats["documents_kept"] == 126 and stats["documents_read"] == 161
    assert stats["documents_dropped"]["warc_type:request"] == 17
    assert sum(stats["pages"].values()) == 126 and min(stats["pages"].values()) > 0
    assert stats["train_examples"] == sum(stats["train_examples_per_language"].values()) > 1000
    assert {"de", "en", "zh"} <= set(stats["train_examples_per_language"])


def test_accounting_section_balances_and_matches_the_files_written(built):
    """README contract 11: documents and lines, read = kept + dropped + errored, with the lines
    kept equal to the rows of train.txt, dev.txt and test.txt."""
    from pipelines.accounting import identity_violations

    _pattern, out = built
    stats = json.loads((out / "stats.json").read_text())
    assert identity_violations(stats) == [] and stats["identity_holds"]
    documents, lines = stats["accounting"]["documents"], stats["accounting"]["lines"]
    assert (documents["read"], documents["kept"], documents["dropped"]) == (
        stats["documents_read"], stats["documents_kept"], stats["documents_dropped"])
    assert documents["kept"] == sum(stats["pages"].values())
    assert lines["read"] == sum(n for split in stats["lines"].values() for n in split.values())
    written = {name: len([row for row in (out / name).read_text(encoding="utf-8").split("\n") if row])
               for name in ("train.txt", "dev.txt", "test.txt")}
    assert lines["kept"] == sum(written.values()) and written["train.txt"] == stats["train_examples"]
    assert set(lines["dropped"]) <= {"page_balance", "language_cap", "disputed_label"}
    assert lines["dropped"]["page_balance"] > 0 and lines["dropped"]["disputed_label"] > 0  # committee labels
    assert stats["train_examples_dropped"]["disputed_label"] == lines["dropped"]["disputed_label"]
    assert lines["dropped"] == {k: v for k, v in stats["train_examples_dropped"].items() if v}
    pages = [json.loads(line) for name in ("dev.pages.jsonl", "test.pages.jsonl")
             for line in (out / name).read_text(encoding="utf-8").split("\n") if line]
    assert written["dev.txt"] + written["test.txt"] == sum(len(p["lines"]) for p in pages)


def test_splits_are_page_disjoint_and_train_rows_come_only_from_train_pages(built):
    pattern, out = built
    dev = {p.url for p in read_pages(str(out / "dev.pages.jsonl"))}
    test = {p.url for p in read_pages(str(out / "test.pages.jsonl"))}
    assert dev and test and not dev & test
    assert all(split_of(u) == "dev" for u in dev) and all(split_of(u) == "test" for u in test)
    # Recompute, without Beam, the training rows the train pages must give: the multiset matches.
    expected = Counter()
    config = BuildConfig()
    for page in labelled_pages_from_warc(pattern):
        if split_of(page.url) == "train":
            page_json = page.to_json()
            expected.update(row for _lang, (_digest, row) in training_examples(page_json, config))
            assert page.url not in dev | test
    written = Counter(line for line in (out / "train.txt").read_text(encoding="utf-8").split("\n") if line)
    assert written == expected
    test_rows = (out / "test.txt").read_text(encoding="utf-8").splitlines()
    assert len(test_rows) == sum(len(p.lines) for p in read_pages(str(out / "test.pages.jsonl")))


def test_trained_model_beats_no_filter_on_the_test_split(built, tmp_path, capsys):
    _pattern, out = built
    model = tmp_path / "model.bin"
    assert cli.main(["train", "--data", str(out), "--output", str(model)]) == 0
    printed = capsys.readouterr().out
    assert "test (page-disjoint, vs teacher): P" in printed
    report = json.loads((tmp_path / "model.bin.metrics.json").read_text())
    test = report["test"]
    pages = list(read_pages(str(out / "test.pages.jsonl")))
    main_lines = sum(sum(p.labels) for p in pages)
    all_lines = sum(len(p.lines) for p in pages)
    keep_all_precision = main_lines / all_lines
    keep_all_f1 = 2 * keep_all_precision / (keep_all_precision + 1)
    keep_all_token_f1 = sum(token_f1("\n".join(p.lines), p.teacher_text) for p in pages) / len(pages)
    assert test["lines"] == all_lines
    assert test["f1"] > keep_all_f1 + 0.1
    assert test["agreement"] > keep_all_precision + 0.1  # keeping everything agrees on the main lines only
    assert test["kept_text_token_f1_vs_teacher"] > keep_all_token_f1 + 0.1
    text_only = report["test_text_only"]  # the same model without the HTML feature, as for WET
    assert text_only["f1"] > keep_all_f1 + 0.1
    assert text_only["kept_text_token_f1_vs_teacher"] > keep_all_token_f1 + 0.1


def test_evaluate_prints_the_same_metrics_for_any_warc(built, tmp_path, labse_data, capsys):
    _pattern, out = built
    model = tmp_path / "model.bin"
    assert cli.main(["train", "--data", str(out), "--output", str(model), "--epoch", "5"]) == 0
    capsys.readouterr()
    warc = require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz")
    assert cli.main(["evaluate", "--model", str(model), "--input", str(warc), "--json", str(tmp_path / "e.json")]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "e.json").read_text())
    assert "agreement" in printed and summary["pages"] == 16 and 0 < summary["f1"] <= 1


def test_demo_step_trains_a_model_and_reports_held_out_quality(built, labse_data, tmp_path, monkeypatch):
    """The demo's build-data is the README's command on the same WARCs, run in one process rather than
    two workers (the runner does not change what build-data writes: tests/test_portable_workers.py):
    its output is copied from the docs test's run rather than labelled again; the demo's train and
    held-out measure run for real."""
    import recipes.demo_text as demo_text

    pattern, readme_data = built
    real_main = demo_text.main_content_main
    built_by_demo = []

    def main_content(argv):
        if argv[0] != "build-data":
            return real_main(argv)
        args, beam_args = cli.build_data_parser().parse_known_args(argv[1:])  # the demo's options exist
        assert (args.input, beam_args) == (pattern, []) and args.overwrite, argv
        shutil.copytree(readme_data, args.output)
        built_by_demo.append(args.output)
        return 0

    monkeypatch.setattr(demo_text, "main_content_main", main_content)
    artifacts: dict = {}
    lines = demo_text.main_content_step(labse_data, tmp_path, artifacts)
    assert built_by_demo == [str(tmp_path / "main_content" / "data")]
    model = artifacts["main_content_model"]
    assert model == str(tmp_path / "main_content" / "model.bin")
    from pipelines.main_content.model import MainContentModel

    MainContentModel.load(model)
    held_out = next(line for line in lines if line.startswith("held-out article pages"))
    f1_with_html = float(held_out.split("text: ")[1].split(" ")[0])
    assert f1_with_html > 0.8  # no filter scores 0.65 on these pages
    assert any(line.startswith("test split vs teacher") for line in lines)


def test_build_data_output_is_complete_and_guarded(built, tmp_path, capsys):
    """build-data marks its output complete; a rerun needs --overwrite; train refuses incomplete data."""
    pattern, out = built
    assert json.loads((out / "_SUCCESS").read_text())["stats"]["documents_read"] == 161
    assert cli.main(["build-data", "--input", pattern, "--output", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "train.txt").write_text((out / "train.txt").read_text())  # build-data interrupted: no _SUCCESS
    assert cli.main(["train", "--data", str(partial), "--output", str(tmp_path / "m.bin")]) == 2
    assert "rerun the stage" in capsys.readouterr().err and not (tmp_path / "m.bin").exists()
