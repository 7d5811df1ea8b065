"""labse-report's page of the demo's chain (tests/cloud_chain.py: build-data, main-content train,
clean, vocab, mine, score, tfrecords on small real inputs) looked at as a person would: rendered by
Debian's chromium at 1280 px, every image loaded, nothing wider than the window, no console error;
and the same page made from the chain's gs:// copy on the emulator lists the same sections."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cloud_chain import command_path

pytestmark = pytest.mark.slow

WINDOW_WIDTH = 1280
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# the chain's outputs (tests/cloud_chain.py), in data-flow order; other tests of the session add
# outputs of their own under the same roots (a killed run, refused reruns), which the page lists too
CHAIN_OUTPUTS = [("labse-main-content build-data", "main_content/data"),
                 ("main-content model", "main_content/model.bin.metrics.json"), ("labse-clean", "clean"),
                 ("labse-vocab", "vocab"), ("labse-mine", "pairs"), ("labse-score", "scored"),
                 ("labse-tfrecords", "tfrecords")]
EXPECTED_SECTIONS = [title for title, _ in CHAIN_OUTPUTS]


def write_report(root: str, output: Path) -> str:
    done = subprocess.run([command_path("labse-report"), root, "--output", str(output)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return output.read_text(encoding="utf-8")


def chain_rows(page: str) -> list[tuple[str, str, str]]:
    """(title, where, status) of the overview rows that are the chain's own outputs, in page order."""
    rows = re.findall(r'<tr><td><a href="#[^"]*">([^<]+)</a></td><td class="wrap">([^<]+)</td>'
                      r'<td class="[^"]*">([^<]+)</td>', page)
    wanted = set(CHAIN_OUTPUTS)
    return [row for row in rows if (row[0], row[1]) in wanted]


@pytest.fixture(scope="module")
def local_report(chains, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("report") / "report.html"
    write_report(str(chains.local), output)
    return output


def test_the_chain_report_has_a_section_per_stage_in_data_flow_order(local_report):
    rows = chain_rows(local_report.read_text(encoding="utf-8"))
    assert [(title, where) for title, where, _ in rows] == CHAIN_OUTPUTS
    # no stage's books are off; the main-content model's 8-page test split is flagged as too small
    assert {title for title, _, status in rows if status != "ok"} <= {"main-content model"}


def test_the_report_of_the_gs_chain_lists_the_same_sections(chains, local_report, tmp_path):
    page = write_report(chains.gs, tmp_path / "gs_report.html")
    assert chain_rows(page) == chain_rows(local_report.read_text(encoding="utf-8"))


def test_the_report_renders_in_a_real_browser(local_report, tmp_path):
    assert CHROMIUM, "Debian's chromium is not installed: `make test` installs it (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": WINDOW_WIDTH, "height": 900})
            page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}"))
            page.goto(local_report.as_uri(), wait_until="load")
            images = page.evaluate("Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])")
            widths = page.evaluate("[document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]")
            wide = page.evaluate(f"""Array.from(document.querySelectorAll('body *'))
                .filter(e => e.getBoundingClientRect().right > {WINDOW_WIDTH} + 0.5).map(e => e.tagName)""")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert len(images) >= len(EXPECTED_SECTIONS), images
    assert [alt for alt, complete, width in images if not complete or width == 0] == []
    assert max(widths) <= WINDOW_WIDTH and wide == [], (widths, wide)
    assert problems == []
    assert (tmp_path / "report.png").stat().st_size > 10_000
