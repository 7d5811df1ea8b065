"""Docs that cannot drift: every command block of README.md and docs/guides/*.md runs as written.

Each fenced shell block (```bash, ```sh, ```shell, ```console or untyped) is either run here, in
order with the blocks before it in its document, on the sample data (LABSE_DATA), or marked in the
document right above it with `<!-- needs: KIND — reason -->` (KIND: see NEEDS). A run fails the test
when a command exits non-zero or when an output the block names (`--output PATH`, or a
`# writes PATH` comment) is missing afterwards. Sizes are scaled only through the variables a block
assigns itself (`STEPS=300` on a line of its own): SCALE sets them smaller here, and a SCALE entry
for a variable the document no longer assigns fails. A guide that starts from the README's outputs
says so with `<!-- uses: PATH ... — where they come from -->`; the test links those paths from its
run of the README. The marker syntax is documented in docs/guides/testing.md.

`python tests/test_doc_commands.py` prints every block with how it is covered.
"""
from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "guides").glob("*.md"))]
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
# Why a block may stay unrun: each needs what a test on one CPU machine with the sample data lacks.
NEEDS = {
    "cloud": "a Google Cloud project and bucket (Dataflow, gs://)",
    "gpu": "GPUs (several processes of the full-size model)",
    "several-hosts": "more than one machine",
    "large-corpus": "more text than the sample data holds",
    "network": "a download from the internet (tests never use the network)",
    "install": "installing into the environment the tests run in",
    "suite": "the test suite itself (it runs these tests already)",
}
MARKER = re.compile(r"^<!--\s*needs:\s*([a-z-]+(?:\s*,\s*[a-z-]+)*)\s*—\s*(\S.*?)\s*-->$")
USES = re.compile(r"^<!--\s*uses:\s*(\S.*?)\s*—\s*(\S.*?)\s*-->$", re.M)
ASSIGNMENT = re.compile(r"^([A-Z][A-Z0-9_]*)=(\S+)$")
INDENTED_COMMAND = re.compile(r"^(?: {4}|\t)(?:labse-[a-z-]+|python3?|\S*/python|make|torchrun|gsutil|pip)(?= ).* -")
# Smaller sizes for the test, per document; each name must be a variable the document assigns.
SCALE = {
    "README.md": {"MAX_PAIRS": "2000", "CALIBRATION_ROWS": "1000", "PER_LANGUAGE": "2000", "PT_STEPS": "15",
                  "STEPS": "10"},
    "docs/guides/embedders.md": {"N": "150", "ROWS": "500"},
    "docs/guides/new-language-pair.md": {"N": "200", "ROWS": "1500", "PAIRS": "600"},
    "docs/guides/re-mining.md": {"N": "60", "ROWS": "800", "PAIRS": "240", "STEPS": "10"},
}
# Documents whose blocks finish in seconds run in the fast suite; the rest are `slow`.
FAST_DOCS = {"docs/guides/testing.md"}
BLOCK_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Block:
    doc: str
    line: int          # 1-based line of the opening fence
    lang: str
    text: str
    needs: tuple[str, ...] = ()
    reason: str = ""

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def is_shell(self) -> bool:
        return self.lang in SHELL_LANGS


def blocks_of(doc: str, text: str) -> list[Block]:
    """Every fenced block of a Markdown text, with the `needs:` marker on the line above it."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != fence.group(1):
            body.append(lines[i])
            i += 1
        above = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(above)
        needs = tuple(kind.strip() for kind in marker.group(1).split(",")) if marker else ()
        found.append(Block(doc, start + 1, fence.group(2), "\n".join(body) + "\n", needs,
                           marker.group(2) if marker else ""))
        i += 1
    return found


def indented_commands(text: str) -> list[str]:
    """Commands in indented (unfenced) code: they would escape the test, so they must be fenced."""
    out, in_fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and INDENTED_COMMAND.match(line):
            out.append(f"{number}: {line.strip()}")
    return out


@functools.cache
def all_blocks() -> tuple[Block, ...]:
    """Read once per session: the runs keep to the blocks they were collected with."""
    return tuple(b for doc in DOCS for b in blocks_of(doc, (ROOT / doc).read_text(encoding="utf-8")))


def shell_blocks(doc: str | None = None) -> list[Block]:
    return [b for b in all_blocks() if b.is_shell and (doc is None or b.doc == doc)]


def runnable(doc: str) -> list[Block]:
    return [b for b in shell_blocks(doc) if not b.needs]


def readme_twin(block: Block) -> Block | None:
    """The README block a guide repeats word for word: run once, in the README's run."""
    if block.doc == "README.md":
        return None
    return next((b for b in runnable("README.md") if b.text == block.text), None)


def assigned(block: Block) -> dict[str, str]:
    return dict(m.groups() for m in map(ASSIGNMENT.match, block.text.splitlines()) if m)


def scaled(block: Block) -> str:
    """The block's text with its size variables set as SCALE says."""
    scale = SCALE.get(block.doc, {})
    return "\n".join(f"{m.group(1)}={scale[m.group(1)]}" if (m := ASSIGNMENT.match(line)) and m.group(1) in scale
                     else line for line in block.text.splitlines()) + "\n"


def described_outputs(block: Block) -> list[str]:
    """Local paths the block says it writes: every `--output PATH` and `# writes PATH` comment."""
    variables = {**assigned(block), **SCALE.get(block.doc, {})}
    outputs = []
    for command in block.text.replace("\\\n", " ").splitlines():
        code, _, comment = command.partition(" #")
        outputs += re.findall(r"writes (\S+)", comment)
        words = shlex.split(code, comments=True) if code.strip() else []
        outputs += [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--output"]
        outputs += [word.split("=", 1)[1] for word in words if word.startswith("--output=")]
    expanded = [re.sub(r"\$\{?([A-Z][A-Z0-9_]*)\}?", lambda m: variables.get(m.group(1), m.group(0)), path)
                for path in outputs]
    return [path for path in expanded if "://" not in path]


# ------------------------------------------------------------------------------------ the runs
class DocRun:
    """One document's runnable blocks, run in order in its own folder (a user's fresh checkout:
    `../shared/data` is the sample data, the repository's scripts and venv beside it)."""

    def __init__(self, doc: str, folder: Path, env: dict, uses_from: "DocRun | None"):
        self.doc, self.folder, self.env, self.uses_from = doc, folder, env, uses_from
        self.done: dict[str, str | None] = {}   # block name -> None (passed) or why it failed
        folder.mkdir(parents=True)
        for name in (".venv", "benchmarks", "dataflow", "docs", "recipes", "tests", "pytest.ini", "setup.py"):
            if (ROOT / name).exists():
                (folder / name).symlink_to(ROOT / name)
        self.linked = False

    def link_uses(self) -> None:
        """The README outputs the guide says it starts from, linked into its folder."""
        if self.linked:
            return
        self.linked = True
        uses = USES.findall((ROOT / self.doc).read_text(encoding="utf-8"))
        if not uses:
            return
        assert self.uses_from is not None, f"{self.doc}: `uses:` needs the README's run"
        self.uses_from.run_all()
        for paths, _ in uses:
            for path in paths.split():
                source, target = self.uses_from.folder / path, self.folder / path
                assert source.exists(), f"{self.doc} uses {path}, which the README's blocks did not write"
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists():
                    target.symlink_to(source, target_is_directory=source.is_dir())

    def run_all(self) -> None:
        for block in runnable(self.doc):
            self.run(block)
        failed = {name: why for name, why in self.done.items() if why}
        assert not failed, f"{self.doc}: blocks failed: {failed}"

    def run(self, block: Block) -> str | None:
        """Run `block` after every earlier runnable block of its document; why it failed, or None."""
        if block.name in self.done:
            return self.done[block.name]
        if (twin := readme_twin(block)) is not None:
            return self.uses_from.run(twin)
        self.link_uses()
        for earlier in runnable(self.doc):
            if earlier.line >= block.line:
                break
            if self.run(earlier):
                self.done[block.name] = f"an earlier block of {self.doc} failed ({earlier.name})"
                return self.done[block.name]
        log = self.folder / f"block-{block.line}.log"
        started = time.monotonic()
        with open(log, "w", encoding="utf-8") as out:
            try:
                code = subprocess.run(["bash", "-e", "-c", scaled(block)], cwd=self.folder,
                                      env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=BLOCK_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            out.write(f"\n[{block.name}: exit {code} after {time.monotonic() - started:.0f} s]\n")
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        missing = [p for p in described_outputs(block) if not (self.folder / p).exists()]
        why = None
        if code != 0:
            why = f"exit {code}:\n{tail}"
        elif missing:
            why = f"described outputs missing: {missing}\n{tail}"
        self.done[block.name] = why
        return why


def start_doc_runs(labse_data: Path, tmp_path_factory) -> dict[str, DocRun]:
    """A DocRun per document (README.md first), each in its own folder beside `shared/data`: the
    session's `doc_runs` fixture (tests/conftest.py), which every test module shares."""
    root = tmp_path_factory.mktemp("doc_commands")
    (root / "shared").mkdir()
    (root / "shared" / "data").symlink_to(labse_data, target_is_directory=True)
    env = {**os.environ, "LABSE_DATA": str(root / "shared" / "data"),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    runs: dict[str, DocRun] = {}
    readme = DocRun("README.md", root / "readme", env, None)
    runs["README.md"] = readme
    for doc in DOCS[1:]:
        runs[doc] = DocRun(doc, root / Path(doc).stem, env, readme)
    return runs


def _one_line(text: str) -> str:
    return " ".join(text.split())


def block_running(blocks: list[Block], command: str) -> Block | None:
    """The block that runs `command` as one of its commands (continuation lines joined, spacing aside)."""
    wanted = _one_line(command)
    return next((b for b in blocks if any(_one_line(line) == wanted
                                          for line in b.text.replace("\\\n", " ").splitlines())), None)


def documented_output(doc_runs: dict[str, DocRun], doc: str, command: str, output: str) -> Path:
    """`output` as the block of `doc` that runs `command` (word for word, line breaks aside) wrote it.

    A chain test that would run a documented command on the same inputs reads the docs test's run
    instead (the block runs once per session, whichever test asks first). The command is named in
    full, so a document that changes it fails here rather than handing the test other data."""
    block = block_running(runnable(doc), command)
    assert block is not None, f"{doc} no longer runs `{_one_line(command)}`; the test reads that command's output"
    why = doc_runs[doc].run(block)
    assert why is None, f"{block.name}, whose output the test reads, does not run: {why}"
    path = doc_runs[doc].folder / output
    assert path.exists(), f"{block.name} did not write {output}"
    return path


def _block_params():
    params = []
    for block in shell_blocks():
        if block.needs:
            continue
        marks = [] if block.doc in FAST_DOCS else [pytest.mark.slow, pytest.mark.timeout(3 * BLOCK_TIMEOUT_S)]
        params.append(pytest.param(block, id=block.name, marks=marks))
    return params


@pytest.mark.parametrize("block", _block_params())
def test_documented_block_runs_and_makes_its_outputs(block, doc_runs):
    why = doc_runs[block.doc].run(block)
    assert why is None, f"{block.name} (the block at line {block.line}) does not run as written: {why}"


# ------------------------------------------------------------------------- fast checks of the docs
def test_every_command_block_is_run_or_marked_with_a_reason():
    blocks = shell_blocks()
    assert len(blocks) >= 40, len(blocks)
    bad = [f"{b.name}: needs {kind!r}" for b in blocks for kind in b.needs if kind not in NEEDS]
    bad += [f"{b.name}: a `needs:` marker without a reason" for b in blocks if b.needs and len(b.reason) < 10]
    assert not bad, "markers must name a kind of " + ", ".join(NEEDS) + f" and a reason: {bad}"
    # A run block whose commands never touch the sample data or a README output is suspicious only if
    # it has no command at all: a diagram or a listing belongs in a ```text block.
    empty = [b.name for b in blocks if not b.needs and not any(
        line.strip() and not line.strip().startswith("#") for line in b.text.splitlines())]
    assert not empty, f"shell blocks without a command (type them ```text): {empty}"
    # Everything run is within sample-data reach: no bucket, no placeholder host or bucket name.
    cloudy = [b.name for b in blocks if not b.needs and re.search(r"gs://|\bBUCKET\b|\bHOST0\b", b.text)]
    assert not cloudy, f"blocks that need the cloud are not marked `<!-- needs: cloud — ... -->`: {cloudy}"


def test_no_command_hides_in_an_indented_block():
    found = {doc: indented_commands((ROOT / doc).read_text(encoding="utf-8")) for doc in DOCS}
    found = {doc: lines for doc, lines in found.items() if lines}
    assert not found, f"commands in indented code escape the docs test; put them in a fenced block: {found}"


def test_scale_variables_are_ones_the_documents_assign():
    for doc, variables in SCALE.items():
        named = {name for block in runnable(doc) for name in assigned(block)}
        assert set(variables) <= named, f"{doc}: SCALE sets {sorted(set(variables) - named)}, which it no longer assigns"


def _top(path: str) -> str:
    return "/".join(path.split("/")[:2])


def test_guides_say_where_their_inputs_come_from():
    # A guide whose run blocks read out/... either makes it in a block or names it in `uses:`.
    for doc in DOCS[1:]:
        text = (ROOT / doc).read_text(encoding="utf-8")
        reads = {_top(m) for b in runnable(doc) for m in re.findall(r"\bout/[\w.=-]+", b.text)}
        made = {_top(p) for b in runnable(doc) for p in described_outputs(b) if p.startswith("out/")}
        made |= {_top(m) for b in runnable(doc) for m in re.findall(r"mkdir -p (out/[\w.-]+)", b.text)}
        used = {_top(p) for paths, _ in USES.findall(text) for p in paths.split()}
        unexplained = reads - made - used
        assert not unexplained, f"{doc} reads {sorted(unexplained)} without making them or a `uses:` marker"


def test_parser_finds_markers_variables_and_outputs():
    text = ("x\n\n<!-- needs: cloud, gpu — a bucket and 8 GPUs -->\n```bash\nlabse-x --output gs://b/o\n```\n"
            "```\nSTEPS=300\nlabse-y --max-steps $STEPS --output out/y \\\n    --flag  # writes out/y/report.html\n```\n"
            "```text\nnot a command\n```\n")
    cloud, local, listing = blocks_of("README.md", text)
    assert (cloud.needs, cloud.reason, cloud.line) == (("cloud", "gpu"), "a bucket and 8 GPUs", 4)
    assert not local.needs and local.is_shell and not listing.is_shell
    assert assigned(local) == {"STEPS": "300"}
    assert sorted(described_outputs(local)) == ["out/y", "out/y/report.html"] and described_outputs(cloud) == []
    assert indented_commands("a\n\n    labse-clean --input x\n\n```\n    labse-y\n```\n") == ["3: labse-clean --input x"]


def test_a_chain_test_finds_the_block_that_runs_its_command_word_for_word():
    text = "```\nN=5\nlabse-x --input 'a/*.gz' \\\n    --output out/x   # writes out/x\nlabse-y --output out/y\n```\n"
    (block,) = blocks_of("README.md", text)
    assert block_running([block], "labse-x  --input 'a/*.gz' --output out/x # writes out/x") == block
    assert block_running([block], "labse-y --output out/y") == block
    assert block_running([block], "labse-x --input 'a/*.gz' --output out/x") is None  # the comment is part of it
    assert block_running([block], "labse-y --output out/z") is None


def coverage_table() -> list[str]:
    rows = []
    for block in shell_blocks():
        first = next((line.strip() for line in block.text.splitlines() if line.strip()), "")
        twin = readme_twin(block)
        how = (f"marked needs {', '.join(block.needs)}: {block.reason}" if block.needs
               else f"run (slow), as {twin.name}, the same commands" if twin
               else "run (fast suite)" if block.doc in FAST_DOCS else "run (slow)")
        rows.append(f"| {block.doc} | {block.line} | `{first[:60]}` | {how} |")
    return rows


if __name__ == "__main__":
    print("| file | line | first line | coverage |\n| --- | --- | --- | --- |")
    print("\n".join(coverage_table()))


def test_gold_set_hides_the_true_pairs_among_sentences_without_a_partner(labse_data, tmp_path):
    # recipes.gold_set makes the guides' mining sets with a known answer from aligned sample text.
    from recipes.gold_set import main
    from tests.conftest import require_file

    src = require_file(labse_data, "multi30k/val.de.gz")
    tgt = require_file(labse_data, "multi30k/val.en.gz")
    assert main(["--src", str(src), "--tgt", str(tgt), "--pairs", "40", "--distractors", "10",
                 "--output", str(tmp_path / "set")]) == 0
    from pipelines.io.text_lines import read_lines

    german, english = read_lines(src), read_lines(tgt)
    source = (tmp_path / "set" / "src.txt").read_text(encoding="utf-8").splitlines()
    target = (tmp_path / "set" / "tgt.txt").read_text(encoding="utf-8").splitlines()
    gold = [tuple(map(int, line.split("\t"))) for line in (tmp_path / "set" / "gold.tsv").read_text().splitlines()]
    assert len(source) == len(target) == 50 and len(gold) == 40
    # every gold pair is a true translation (line i of val.de and line i of val.en) ...
    assert all(german.index(source[s]) == english.index(target[t]) < 40 for s, t in gold)
    # ... and the distractors are rows 40-49 (source) and 50-59 (target): none has its partner
    assert sorted(german.index(source[s]) for s in set(range(50)) - {s for s, _ in gold}) == list(range(40, 50))
    assert sorted(english.index(target[t]) for t in set(range(50)) - {t for _, t in gold}) == list(range(50, 60))
    assert source[:40] != german[:40] and target[:40] != english[:40]  # each side shuffled
    assert main(["--src", str(src), "--tgt", str(tgt), "--pairs", "1000", "--distractors", "10",
                 "--output", str(tmp_path / "too-many")]) == 2


def test_a_block_fails_when_a_command_fails_or_an_output_it_names_is_missing(tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    run = DocRun("docs/guides/testing.md", tmp_path / "run", env, None)
    failing = Block("docs/guides/testing.md", 1, "bash", "echo first\nfalse\necho never\n")
    assert run.run(failing).startswith("exit 1:") and "never" not in run.run(failing)
    silent = Block("docs/guides/testing.md", 2, "", "true --output out/made   # writes out/made/report.html\n")
    assert "described outputs missing: ['out/made/report.html', 'out/made']" in run.run(silent)
    honest = Block("docs/guides/testing.md", 3, "", "N=5\nmkdir -p out/made-$N && touch out/made-$N/report.html\n"
                                                    "true --output out/made-$N  # writes out/made-$N/report.html\n")
    assert run.run(honest) is None
