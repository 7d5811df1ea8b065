"""`labse-main-content`: build teacher-labelled data, train the fastText classifier, evaluate it.

    labse-main-content build-data --input 'PATTERN.warc.gz' --output DIR [Beam options]
    labse-main-content train --data DIR --output model.bin [--quantize]
    labse-main-content evaluate --model model.bin --input 'PATTERN.warc.gz'

Then ``labse-clean ... --main-content-model model.bin`` filters lines with it.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

COMMANDS = {
    "build-data": ("pipelines.main_content.build_data", "label WARC pages with the teacher; write train/dev/test"),
    "train": ("pipelines.main_content.train", "train the fastText classifier; report P/R/F1 on the test split"),
    "evaluate": ("pipelines.main_content.evaluate", "agreement of a model with the teacher on any WARC"),
}


def _usage() -> str:
    lines = [__doc__.strip(), "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_module, help_) in COMMANDS.items()]
    lines.append("\n`labse-main-content COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(COMMANDS[command][0]).main(rest)


DEMO_INPUT = "commoncrawl/*.warc.gz"
DEMO_ARTICLES = "maincontent/article-pages.warc.gz"
DEMO_TRUTH = "maincontent/article-pages.ground-truth.json"


def run_demo(data: Path, out: Path, artifacts: dict) -> list[str]:
    """Build data from the two Common Crawl sample WARCs, train, and measure on held-out article pages.

    The 181 article pages are never used for training, so their F1 against the human main text is
    a held-out number. Writes under out/main_content/; sets artifacts["main_content_model"].
    """
    stage = out / "main_content"
    data_dir, model_path = stage / "data", stage / "model.bin"
    started = time.perf_counter()
    argv = ["build-data", "--input", str(data / DEMO_INPUT), "--output", str(data_dir), "--overwrite"]
    print("labse-main-content " + " ".join(argv), flush=True)
    if main(argv) != 0:
        raise RuntimeError("labse-main-content build-data failed")
    build_seconds = time.perf_counter() - started
    # One thread: fastText's training repeats exactly only single-threaded, and every later stage of
    # the demo (vocabulary, mining, training) depends on the sentences this model keeps.
    argv = ["train", "--data", str(data_dir), "--output", str(model_path), "--threads", "1"]
    print("labse-main-content " + " ".join(argv), flush=True)
    if main(argv) != 0:
        raise RuntimeError("labse-main-content train failed")
    artifacts["main_content_model"] = str(model_path)
    stats = json.loads((data_dir / "stats.json").read_text(encoding="utf-8"))
    report = json.loads(Path(str(model_path) + ".metrics.json").read_text(encoding="utf-8"))
    test = report["test"]
    lines = [
        f"build-data on {DEMO_INPUT}: {stats['documents_kept']} HTML pages labelled by trafilatura "
        f"(train/dev/test pages {stats['pages']['train']}/{stats['pages']['dev']}/{stats['pages']['test']}), "
        f"{stats['train_examples']} balanced training lines, {build_seconds:.0f} s",
        f"model {model_path} ({report['model_bytes'] / 1e6:.1f} MB), trained in {report['train_seconds']:.1f} s",
        f"test split vs teacher ({test['pages']} pages, {test['lines']} lines): P {test['precision']:.3f} "
        f"R {test['recall']:.3f} F1 {test['f1']:.3f}, agreement {test['agreement']:.3f} "
        f"(text only: F1 {report['test_text_only']['f1']:.3f}, agreement {report['test_text_only']['agreement']:.3f})",
    ]
    articles, truth_file = data / DEMO_ARTICLES, data / DEMO_TRUTH
    if articles.is_file() and truth_file.is_file():
        from pipelines.main_content.evaluate import html_pages, mean_token_f1_vs_truth, model_kept_text
        from pipelines.main_content.model import MainContentModel

        model = MainContentModel.load(str(model_path))
        truth = json.loads(truth_file.read_text(encoding="utf-8"))
        pages = html_pages(str(articles))
        f1, count = mean_token_f1_vs_truth(lambda html: model_kept_text(model, html), pages, truth)
        f1_text, _ = mean_token_f1_vs_truth(lambda html: model_kept_text(model, html, use_html=False), pages, truth)
        lines.append(f"held-out article pages ({count}, never trained on), kept-text token F1 vs human main text: "
                     f"{f1:.3f} with the HTML feature, {f1_text:.3f} text only "
                     f"(data README: all visible text 0.594, trafilatura 0.955)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
