"""Refresh the generated option blocks of docs/reference/*.md from the commands' own `--help`.

    python docs/gen_reference.py            # rewrite the blocks (and create missing pages)
    python docs/gen_reference.py --check    # exit 1 and show the diff when a page has drifted

The commands come from setup.py's console_scripts (read, never executed), so moving a module
only needs the entry point updated. Each page holds one generated block per command line it
documents, between the markers below; everything outside the markers is hand-written prose and
is never touched. A page gets a block for its command, for every subcommand the command's help
announces (argparse's `{a,b}` choices or a `commands:` list), and for any other command line the
page's author declared with a marker of its own (e.g. `labse-score train`, which the top-level
help only mentions in prose).

All `--help` texts are produced in ONE child process (imports dominate the cost), with a fixed
terminal width so the text does not depend on who runs it.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DIR = ROOT / "docs" / "reference"
COLUMNS = 100

BEGIN = "<!-- BEGIN GENERATED: {} --help -->"
END = "<!-- END GENERATED -->"
BLOCK_RE = re.compile(r"<!-- BEGIN GENERATED: (?P<command>[^>]*?) --help -->\n(?P<body>.*?)" + re.escape(END), re.S)

# Runs in the child: for each [entry point, argv], call the entry point with argv + --help as the
# installed script would, and keep what it printed on stdout.
_RUNNER = r"""
import contextlib, importlib, io, json, sys
out = {}
for key, (entry, argv) in json.load(sys.stdin).items():
    module, func = entry.split(":")
    main = getattr(importlib.import_module(module), func)
    sys.argv = [argv[0], *argv[1:], "--help"]
    buffer = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(buffer):
        try:
            result = main()
            code = result if isinstance(result, int) else 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    out[key] = {"code": code, "text": buffer.getvalue()}
json.dump(out, sys.stdout)
"""


def console_scripts(setup_py: Path = ROOT / "setup.py") -> dict[str, str]:
    """{command: "module:function"} from the console_scripts list in setup.py."""
    tree = ast.parse(setup_py.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "console_scripts":
                    entries = ast.literal_eval(value)
                    return {name.strip(): target.strip() for name, target in (e.split("=", 1) for e in entries)}
    raise SystemExit(f"no console_scripts in {setup_py}")


def run_helps(command_lines: list[str], scripts: dict[str, str]) -> dict[str, str]:
    """{"labse-eval tatoeba": help text} for each command line, all in one child process."""
    jobs = {line: (scripts[line.split()[0]], line.split()) for line in command_lines}
    env = dict(os.environ, COLUMNS=str(COLUMNS), LINES="50", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    child = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(jobs), env=env, cwd=ROOT,
                           capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(f"running the --help texts failed:\n{child.stderr[-4000:]}")
    results = json.loads(child.stdout)
    failed = [line for line, result in results.items() if result["code"] != 0]
    if failed:
        raise RuntimeError(f"--help exited with an error for: {', '.join(failed)}")
    return {line: normalise(result["text"]) for line, result in results.items()}


def normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def subcommands(command: str, help_text: str) -> list[str]:
    """Subcommands a help text announces: argparse's `{a,b,c}` after the program name in the
    usage line, or the names listed under a `commands:` heading."""
    found: list[str] = []
    usage = re.search(r"usage: \S+(?: \[-h\])? \{([\w,-]+)\}", help_text)
    if usage:
        found += usage.group(1).split(",")
    listing = re.search(r"^commands:\n((?:  \S.*\n)+)", help_text, re.M)
    if listing:
        found += [line.split()[0] for line in listing.group(1).splitlines()]
    return [f"{command} {name}" for name in dict.fromkeys(found)]


def block(command_line: str, help_text: str) -> str:
    return f"{BEGIN.format(command_line)}\n```text\n{help_text}```\n{END}"


def declared_blocks(page_text: str) -> list[str]:
    return [match.group("command") for match in BLOCK_RE.finditer(page_text)]


def new_page(command: str) -> str:
    return f"# `{command}`\n\nOptions (generated from `{command} --help`):\n\n{block(command, '')}\n"


def refresh(page_text: str, helps: dict[str, str], required: list[str]) -> str:
    """The page with every generated block replaced by the current help text; a required command
    line without a block gets one appended under a heading of its own."""
    text = BLOCK_RE.sub(lambda m: block(m.group("command"), helps[m.group("command")]), page_text)
    present = set(declared_blocks(text))
    for line in required:
        if line not in present:
            text = text.rstrip("\n") + f"\n\n## `{line}`\n\n{block(line, helps[line])}\n"
    return text


def expected_pages() -> dict[Path, tuple[str, str]]:
    """{page: (text on disk, text it should have)} for every console script."""
    scripts = console_scripts()
    pages = {name: REFERENCE_DIR / f"{name}.md" for name in scripts}
    current = {name: (path.read_text(encoding="utf-8") if path.exists() else new_page(name)) for name, path in pages.items()}
    wanted = {name: [name, *declared_blocks(text)] for name, text in current.items()}
    helps = run_helps(sorted({line for lines in wanted.values() for line in lines}), scripts)
    required = {name: subcommands(name, helps[name]) for name in scripts}
    missing = sorted({line for lines in required.values() for line in lines} - set(helps))
    if missing:
        helps.update(run_helps(missing, scripts))
    out = {}
    for name, path in pages.items():
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        out[path] = (old, refresh(current[name], helps, [name, *required[name]]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift and exit 1 instead of writing")
    args = parser.parse_args(argv)
    drifted = []
    for path, (old, new) in expected_pages().items():
        if old == new:
            continue
        drifted.append(path)
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       str(path.relative_to(ROOT)), "from --help"))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(new, encoding="utf-8")
            print(f"updated {path.relative_to(ROOT)}")
    if args.check and drifted:
        print(f"\n{len(drifted)} page(s) out of date: run `python docs/gen_reference.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
