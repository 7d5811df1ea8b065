"""The docs: the MkDocs site builds strictly, the reference pages' option blocks are what the
commands' `--help` prints today, and README.md is a map whose table of contents resolves."""
from __future__ import annotations

import difflib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_builds_strictly(tmp_path):
    # --strict turns every warning into a failure: a broken link or anchor between pages, a page
    # missing from the site, a bad config. The theme is MkDocs' built-in one, so nothing is fetched.
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-4000:]
    pages = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    assert "index.html" in pages and "reference/labse-clean/index.html" in pages, sorted(pages)
    assert any(page.startswith("guides/") for page in pages), sorted(pages)


def test_every_command_has_a_reference_page_whose_options_match_its_help():
    generator = load_generator()
    scripts = generator.console_scripts()
    assert len(scripts) >= 10, scripts
    stale = {}
    for path, (on_disk, expected) in generator.expected_pages().items():
        if on_disk != expected:
            stale[path.name] = "".join(difflib.unified_diff(
                on_disk.splitlines(True), expected.splitlines(True), "on disk", "from --help", n=1))[:3000]
    assert not stale, ("reference pages out of date with the commands' --help; run "
                       "`python docs/gen_reference.py`:\n" + "\n".join(stale.values()))


def test_refresh_replaces_a_stale_block_and_adds_a_missing_subcommand():
    generator = load_generator()
    page = "# x\n\nprose stays\n\n" + generator.block("labse-x", "usage: labse-x [--old]\n") + "\n\nmore prose\n"
    helps = {"labse-x": "usage: labse-x [--new]\n", "labse-x sub": "usage: labse-x sub [-h]\n"}
    refreshed = generator.refresh(page, helps, ["labse-x", "labse-x sub"])
    assert "[--new]" in refreshed and "[--old]" not in refreshed
    assert "prose stays" in refreshed and "more prose" in refreshed
    assert generator.declared_blocks(refreshed) == ["labse-x", "labse-x sub"]
    assert generator.refresh(refreshed, helps, ["labse-x", "labse-x sub"]) == refreshed


def test_subcommands_are_found_in_argparse_usage_and_in_a_commands_list():
    generator = load_generator()
    assert generator.subcommands("labse-eval", "usage: labse-eval [-h] {tatoeba,mining} ...\n") == [
        "labse-eval tatoeba", "labse-eval mining"]
    listed = "intro\n\ncommands:\n  build-data  label pages\n  train       train it\n\nmore\n"
    assert generator.subcommands("labse-main-content", listed) == ["labse-main-content build-data",
                                                                    "labse-main-content train"]
    assert generator.subcommands("labse-clean", "usage: labse-clean [-h] --input PATTERN\n") == []


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than - and _ removed,
    spaces to hyphens (markup characters such as backticks count as punctuation)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def readme_anchors(text: str) -> set[str]:
    anchors, seen = set(), {}
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"(#{1,6}) (.*)", line)
        if match:
            slug = github_slug(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_readme_is_a_map_with_a_resolving_table_of_contents():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    toc = re.search(r"^## Contents\n(.*?)(?=^## )", text, re.S | re.M)
    assert toc, "README.md needs a '## Contents' table of contents"
    links = re.findall(r"\]\(#([^)]+)\)", toc.group(1))
    assert len(links) >= 8, links
    anchors = readme_anchors(text)
    unresolved = [link for link in links if link not in anchors]
    assert not unresolved, f"table-of-contents links without a heading: {unresolved}"
    # Every ## section is in the table of contents.
    sections = [github_slug(h) for h in re.findall(r"^## (.*)", text, re.M) if h != "Contents"]
    assert not [s for s in sections if s not in links], "sections missing from the table of contents"


def test_readme_links_to_files_and_headings_that_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)#][^)]*)\)", text) if "://" not in t]
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert targets and not missing, f"README links to missing files: {missing}"
    # A link into another Markdown file's section (BENCHMARKS.md#...) must name one of its headings.
    broken = [t for t in targets if "#" in t and t.split("#")[0].endswith(".md")
              and t.split("#", 1)[1] not in readme_anchors((ROOT / t.split("#")[0]).read_text(encoding="utf-8"))]
    assert not broken, f"README links to sections that do not exist: {broken}"


def test_readme_first_two_commands_are_make_demo_and_make_test():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()]
    assert commands[:2] == ["make demo", "make test"], commands


# Beam's own options, passed through by every Beam command (not in the commands' --help).
BEAM_OPTIONS = {"--runner", "--project", "--region", "--experiments"}


def example_commands(text: str) -> list[tuple[str, list[str]]]:
    """(command line, its --options) for every labse-* command in the text's code blocks."""
    found = []
    for block_text in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M):
        for command in block_text.replace("\\\n", " ").splitlines():
            words = command.split("#")[0].split()
            if not words or not words[0].startswith("labse-") or words[0].endswith(":"):
                continue  # not a command (`labse-clean: ...` is a line a command printed)
            line = words[0] + (f" {words[1]}" if len(words) > 1 and not words[1].startswith(("-", "…", "...")) else "")
            options = [w.lstrip("[|(").rstrip("]|)").split("=")[0] for w in words]
            options = [o for o in options if o.startswith("--") and len(o) > 2]
            found.append((line, [o for o in options if "_" not in o and o not in BEAM_OPTIONS]))
    return found


def test_examples_use_only_options_the_commands_have():
    generator = load_generator()
    # Not docs/benchmarks.md (BENCHMARKS.md): it records the commands as they were run.
    pages = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if not p.is_symlink())]
    examples = {page.name: example_commands(page.read_text(encoding="utf-8")) for page in pages}
    lines = sorted({line for found in examples.values() for line, _ in found})
    assert "labse-clean" in lines and "labse-train" in lines, lines
    helps = generator.run_helps(lines, generator.console_scripts())
    unknown = [f"{page}: {line} {option}" for page, found in examples.items() for line, options in found
               for option in options if not re.search(re.escape(option) + r"\b", helps[line])]
    assert not unknown, f"examples use options their command does not have: {unknown}"


def test_every_command_and_subcommand_help_shows_the_verbose_switch():
    # Quiet by default, `-v`/`--verbose` for the libraries' lines: the switch is in every --help.
    generator = load_generator()
    scripts = generator.console_scripts()
    lines = sorted({line for _, expected in generator.expected_pages().values()
                    for line in generator.declared_blocks(expected)})
    assert "labse-eval mining" in lines and "labse-main-content build-data" in lines, lines
    helps = generator.run_helps(lines, scripts)
    without = [line for line in lines if not re.search(r"-v, --verbose", helps[line])]
    assert not without, f"--help without -v/--verbose: {without}"
