"""Which module may import which: imports run one way, down the layers, and never in a circle.

Layers, bottom to top (a module imports only its own layer or lower ones):

    pipelines.io                      the storage floor: Beam-free paths, lock, _SUCCESS, formats
    pipelines.text                    pure text functions (never the readers, nor anything above)
    pipelines.accounting, .stage      counting and the stage kit (Beam; .beam_worker: its SDK workers)
    pipelines.read                    the readers (may use pipelines.text)
    pipelines.embed                   the embedders and `auto` (imports no stage; the stages use it)
    pipelines.<stage>                 clean, main_content, index, mine, score, tfrecords, distill
    vocab                             the vocabulary stage (uses pipelines, never the reverse)
    labse_model                       the trainer (never the recipes)
    recipes                           orchestration on top: `make demo` (recipes/demo.py), re-mining

A stage may use another stage's logic but never its command-line module, no file imports a file
that imports it back (directly or through others), and the three top-level packages import each
other in one direction only. Read from the sources with `ast`, so the check needs no heavy import
and sees imports inside functions too. Only the recipes may drive several stages' commands.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def _imports(path: Path, module_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    nodes = tree.body if module_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def _is(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_sources_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in _sources("pipelines", "vocab")}
    assert {"pipelines/io/tfrecord.py", "pipelines/tfrecords/transforms.py", "vocab/builder.py"} <= names


def test_pipelines_and_vocab_never_import_labse_model():
    offenders = [
        f"{path.relative_to(ROOT).as_posix()}:{line} imports {module}"
        for path in _sources("pipelines", "vocab")
        for line, module in _imports(path)
        if _is(module, "labse_model")
    ]
    assert offenders == []


@pytest.mark.parametrize("module", ["pipelines/io/tfrecord.py", "pipelines/io/storage.py",
                                    "pipelines/io/locks.py", "pipelines/io/completion.py",
                                    "pipelines/io/overlap.py", "pipelines/io/atomic.py", "pipelines/io/text_lines.py",
                                    "pipelines/io/parallel_text.py", "pipelines/io/config_options.py",
                                    "pipelines/tfrecords/encode.py"])
def test_modules_used_without_beam_import_no_heavy_framework_at_load(module):
    """GPU hosts run torch alone: what the trainer loads from pipelines.io imports no Beam,
    TensorFlow or torch when it is loaded; the pure TFRecord-pair logic imports none anywhere."""
    heavy = ("apache_beam", "tensorflow", "tensorflow_text", "torch")
    path = ROOT / module
    imports = _imports(path, module_level_only=not module.startswith("pipelines/tfrecords/"))
    assert [m for _, m in imports if any(_is(m, h) for h in heavy)] == []


def test_the_storage_floor_imports_no_beam_and_nothing_above_it():
    """pipelines/io is the bottom of the house: no Beam anywhere in it (not even inside a
    function), and nothing from the project but pipelines.io itself."""
    offenders = [
        f"{path.relative_to(ROOT).as_posix()}:{line} imports {module}"
        for path in _sources("pipelines/io")
        for line, module in _imports(path)
        if _is(module, "apache_beam")
        or (module.split(".")[0] in ("pipelines", "vocab", "labse_model") and not _is(module, "pipelines.io"))
    ]
    assert offenders == []


_SECOND_FLOOR = [
    (re.compile(r"^\s*SUCCESS_MARKER\s*=|^\s*\w+\s*=\s*[\"']_SUCCESS[\"']", re.M), "a _SUCCESS constant"),
    (re.compile(r"^\s*def require_complete\(", re.M), "a require_complete"),
    (re.compile(r"^\s*class \w*Lock\w*Error\b", re.M), "a lock error"),
    (re.compile(r"\bfcntl\.flock\(|ifGenerationMatch|O_EXCL|mode=[\"']create[\"']|\.lock[\"']", re.M),
     "a lock of its own"),
]


def test_no_module_outside_the_floor_defines_a_lock_a_marker_or_require_complete():
    offenders = [
        f"{path.relative_to(ROOT).as_posix()}: {what}"
        for path in _sources("pipelines", "vocab", "labse_model", "recipes", "benchmarks")
        if not path.relative_to(ROOT).as_posix().startswith("pipelines/io/")
        for pattern, what in _SECOND_FLOOR
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


PACKAGES = ("pipelines", "vocab", "labse_model", "recipes")
STAGES = ("clean", "main_content", "vectors", "index", "mine", "score", "tfrecords", "distill")
LAYERS = {"pipelines.io": 0, "pipelines.text": 1, "pipelines.accounting": 2, "pipelines.stage": 2, "pipelines.progress": 2,
          "pipelines.report": 5,
          "pipelines.stage_options": 2, "pipelines.beam_worker": 2,
          "pipelines.read": 3, "pipelines.embed": 4, **{f"pipelines.{stage}": 5 for stage in STAGES}, "vocab": 6,
          "labse_model": 7, "recipes": 8}


def _module_of(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path = ROOT) -> dict[str, Path]:
    return {_module_of(p, root): p for package in PACKAGES for p in (root / package).rglob("*.py")}


def _import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {project module it imports: line}. `from a.b import c` counts as importing `a.b.c`
    when that is a module (else `a.b`); imports inside functions count."""
    modules = _modules(root)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    source = ".".join(filter(None, [base, node.module]))
                else:
                    source = node.module or ""
                names = [f"{source}.{alias.name}" for alias in node.names] + [source]
            else:
                continue
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    edges.setdefault(name, node.lineno)
        graph[module] = edges
    return graph


def _layer(module: str) -> int | None:
    """The layer of the longest LAYERS prefix; None for a module no layer holds."""
    while module:
        if module in LAYERS:
            return LAYERS[module]
        module = module.rpartition(".")[0]
    return None


def _stage(module: str) -> str | None:
    if module == "vocab" or module.startswith("vocab."):
        return "vocab"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "pipelines" and parts[1] in STAGES else None


def _command_modules(root: Path = ROOT) -> set[str]:
    """The modules setup.py's console scripts point at, and every `cli` module."""
    scripts = set(re.findall(r"=\s*([\w.]+):\w+", (root / "setup.py").read_text(encoding="utf-8")))
    return scripts | {m for m in _modules(root) if m.rpartition(".")[2] == "cli"}


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def layering_violations(root: Path = ROOT) -> dict[str, list[str]]:
    """Every broken rule, by rule (empty lists when the tree follows them). A function of the
    tree's root, so a test can run it on a crafted tree or an older checkout."""
    graph = _import_graph(root)
    commands = _command_modules(root)
    located = {m: p.relative_to(root).as_posix() for m, p in _modules(root).items()}
    unplaced = [located[m] for m in graph if m.startswith("pipelines.") and _layer(m) is None]
    upward, stage_commands = [], []
    for module, edges in sorted(graph.items()):
        for target, line in sorted(edges.items()):
            where = f"{located[module]}:{line} imports {target}"
            low, high = _layer(module), _layer(target)
            if low is not None and high is not None and high > low:
                upward.append(where)
            if _stage(module) != _stage(target) and target in commands and not _is(module, "recipes"):
                stage_commands.append(where)
    package_graph: dict[str, dict[str, int]] = {}
    for module, edges in graph.items():
        for target in edges:
            if target.split(".")[0] != module.split(".")[0]:
                package_graph.setdefault(module.split(".")[0], {})[target.split(".")[0]] = 0
    return {
        "module without a layer": unplaced,
        "import up a layer": upward,
        "file import cycle": [" <-> ".join(cycle) for cycle in import_cycles(graph)],
        "package import cycle": [" <-> ".join(cycle) for cycle in import_cycles(package_graph)],
        "stage imports another stage's command": stage_commands,
    }


def test_text_functions_configs_and_io_import_no_beam():
    """pipelines/text and every stage's config.py never import Beam; pipelines/io only inside a
    function, for object stores (Beam's FileSystems), never when the module loads."""
    offenders = [
        f"{path.relative_to(ROOT).as_posix()}:{line} imports {module}"
        for path in _sources("pipelines")
        if path.relative_to(ROOT).parts[1] in ("text", "io") or path.name == "config.py"
        for line, module in _imports(path, module_level_only=path.relative_to(ROOT).parts[1] == "io")
        if _is(module, "apache_beam")
    ]
    assert offenders == []


@pytest.mark.parametrize("rule", ["module without a layer", "import up a layer", "file import cycle",
                                  "package import cycle", "stage imports another stage's command"])
def test_the_tree_follows_the_layering(rule, tree_violations):
    assert tree_violations[rule] == []


@pytest.fixture(scope="module")
def tree_violations():
    return layering_violations()


def _write(root: Path, files: dict[str, str]) -> Path:
    (root / "setup.py").write_text('entry_points = ["labse-x=pipelines.clean.cli:main"]\n', encoding="utf-8")
    for package in PACKAGES:
        (root / package).mkdir(exist_ok=True)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.mark.parametrize("files, rule", [
    ({"pipelines/text/a.py": "def f():\n    from pipelines.text import b\n",
      "pipelines/text/b.py": "from pipelines.text.a import f\n"}, "file import cycle"),
    ({"pipelines/text/a.py": "from . import b\n", "pipelines/text/b.py": "from . import c\n",
      "pipelines/text/c.py": "import pipelines.text.a\n"}, "file import cycle"),
    ({"pipelines/io/a.py": "from pipelines.accounting import Tally\n", "pipelines/accounting.py": ""},
     "import up a layer"),
    ({"pipelines/text/a.py": "from pipelines.read.warc import read\n", "pipelines/read/warc.py": ""},
     "import up a layer"),
    ({"pipelines/text/a.py": "def f():\n    from pipelines.clean.bundle import g\n",
      "pipelines/clean/bundle.py": ""}, "import up a layer"),
    ({"pipelines/clean/a.py": "import labse_model.loss\n", "labse_model/loss.py": ""}, "import up a layer"),
    ({"pipelines/embed/a.py": "def f():\n    from pipelines.mine.margin import m\n", "pipelines/mine/margin.py": ""},
     "import up a layer"),
    ({"labse_model/train.py": "from recipes.demo import DEMO_STEPS\n", "recipes/demo.py": ""}, "import up a layer"),
    ({"labse_model/demo.py": "from pipelines.score import cli\n", "pipelines/score/cli.py": ""},
     "stage imports another stage's command"),
    ({"pipelines/tfrecords/encode.py": "from vocab.tokenizer import T\n", "vocab/tokenizer.py": "",
      "vocab/count.py": "from pipelines.io.atomic import w\n", "pipelines/io/atomic.py": ""},
     "package import cycle"),
    ({"pipelines/mine/demo.py": "from pipelines.score import cli\n", "pipelines/score/cli.py": ""},
     "stage imports another stage's command"),
    ({"pipelines/score/bucc.py": "from pipelines.clean.cli import main\n", "pipelines/clean/cli.py": ""},
     "stage imports another stage's command"),
    ({"pipelines/mining/bucc.py": ""}, "module without a layer"),
])
def test_each_rule_catches_a_crafted_violation(tmp_path, files, rule):
    violations = layering_violations(_write(tmp_path, files))
    assert violations[rule], violations


def test_a_stage_may_use_another_stage_s_logic(tmp_path):
    root = _write(tmp_path, {"pipelines/score/bucc.py": "from pipelines.mine.margin import mine\n",
                             "pipelines/mine/margin.py": "", "pipelines/clean/cli.py": "from . import bundle\n",
                             "pipelines/clean/bundle.py": "from pipelines.main_content.model import f\n",
                             "pipelines/main_content/model.py": "from pipelines.text.html import h\n",
                             "pipelines/text/html.py": "", "recipes/demo.py": "from pipelines.clean.cli import m\n",
                             "pipelines/mine/cli.py": "from pipelines.embed.choice import c\n",
                             "pipelines/embed/choice.py": "from pipelines.io.config_options import o\n",
                             "pipelines/io/config_options.py": ""})
    assert all(not found for found in layering_violations(root).values())
