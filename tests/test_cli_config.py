"""labse-train and labse-pretrain build their options from TrainConfig and PretrainConfig: one option
per field (or a field marked not an option), the dataclass defaults when nothing is given, and every
option sets its own field and no other. Parsing only: no data, no model."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from labse_model import pretrain, train
from labse_model.config import PretrainConfig, TrainConfig
from labse_model.stacking import default_stage_layers
from pipelines.io.config_options import config_from_args, config_options, option, option_flag, resumable_fields

TRAIN_REQUIRED = ["--data", "shards/*.tfrecord", "--vocab", "vocab.txt", "--output", "run"]
PRETRAIN_REQUIRED = ["--mono", "sentences", "--vocab", "vocab.txt", "--output", "pt"]
COMMANDS = {
    "labse-train": (TrainConfig, train.build_parser, TRAIN_REQUIRED),
    "labse-pretrain": (PretrainConfig, pretrain.build_parser, PRETRAIN_REQUIRED),
}


def _config(command: str, argv: list[str]):
    """The config dataclass the command builds from `argv` (after its required options)."""
    cls, build_parser, required = COMMANDS[command]
    args = build_parser().parse_args([*required, *argv])
    if cls is PretrainConfig:
        return pretrain.pretrain_settings(args, num_layers=12, max_positions=512)  # the base preset
    return config_from_args(cls, args)


def _pretrain_defaults() -> PretrainConfig:
    """PretrainConfig's defaults with the values labse-pretrain derives for the base preset without --pairs."""
    return dataclasses.replace(PretrainConfig(), stage_layers=default_stage_layers(12), max_seq_length=512,
                               tlm_fraction=0.0)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_field_has_exactly_one_option_or_is_marked_not_one(command):
    cls, build_parser, _ = COMMANDS[command]
    parser = build_parser()
    by_dest: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        by_dest.setdefault(action.dest, []).append(action)
    for field, spec in config_options(cls):
        actions = by_dest.get(field.name, [])
        if spec is None:
            assert actions == [], f"{field.name} is marked not an option but has {actions}"
            continue
        assert len(actions) == 1, f"{cls.__name__}.{field.name}: {len(actions)} options"
        assert option_flag(field, spec) in actions[0].option_strings
        assert actions[0].help, f"{field.name} has no help text"
    # No two fields claim one flag (argparse would refuse it, but say it plainly).
    flags = [option_flag(f, s) for f, s in config_options(cls) if s is not None]
    assert len(flags) == len(set(flags))


def test_a_field_without_metadata_is_refused():
    @dataclasses.dataclass
    class Settings:
        steps: int = option(1, "steps")
        forgotten: int = 3

    with pytest.raises(TypeError, match="Settings.forgotten has no command-line metadata"):
        config_options(Settings)


def test_train_defaults_are_the_dataclass_defaults():
    assert _config("labse-train", []) == TrainConfig()


def test_pretrain_defaults_are_the_dataclass_defaults_or_derived():
    assert _config("labse-pretrain", []) == _pretrain_defaults()
    args = pretrain.build_parser().parse_args([*PRETRAIN_REQUIRED, "--pairs", "shards/*"])
    settings = pretrain.pretrain_settings(args, num_layers=4, max_positions=128)  # mini
    assert (settings.stage_layers, settings.max_seq_length, settings.tlm_fraction) == ((1, 2, 4), 128, 0.5)


@pytest.mark.parametrize("command", COMMANDS)
def test_option_defaults_on_the_command_line(command):
    """An option's parsed default is the field's, except None for the resumable and derived ones
    (so a resume can tell an option given from one left out)."""
    cls, build_parser, required = COMMANDS[command]
    args = build_parser().parse_args(required)
    for field, spec in config_options(cls):
        if spec is None:
            assert not hasattr(args, field.name)
        elif spec.resumable or spec.derived:
            assert getattr(args, field.name) is None, field.name
        else:
            assert getattr(args, field.name) == field.default, field.name


def _other_value(field: dataclasses.Field, current):
    """A valid value other than `current` for the field, as the command line spells it."""
    if isinstance(current, bool):
        return not current
    if isinstance(current, tuple):
        return (1, 1) if field.name == "stage_fractions" else (2, 4)  # stage_layers of a 12-layer model
    if isinstance(current, int):
        return current + 1
    return current / 2 if current else 0.25


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_sets_its_own_field_and_no_other(command):
    cls = COMMANDS[command][0]
    defaults = TrainConfig() if cls is TrainConfig else _pretrain_defaults()
    for field, spec in config_options(cls):
        if spec is None:
            continue
        value = _other_value(field, getattr(defaults, field.name))
        flag = option_flag(field, spec)
        if isinstance(value, bool):
            argv = [flag if value else "--no-" + flag[2:]]
        elif isinstance(value, tuple):
            argv = [flag, ",".join(str(v) for v in value)]
        else:
            argv = [flag, str(value)]
        assert _config(command, argv) == dataclasses.replace(defaults, **{field.name: value}), argv


def test_existing_spellings_still_work():
    config = _config("labse-train", ["--lr", "0.003", "--no-bf16", "--no-gather-negatives", "--max-steps", "7"])
    assert (config.learning_rate, config.bf16, config.gather_negatives, config.max_steps) == (0.003, False, False, 7)
    settings = _config("labse-pretrain", ["--lr", "0.002", "--no-bf16", "--stage-layers", "3,12",
                                          "--stage-fractions", "1,2.5"])
    assert (settings.learning_rate, settings.bf16) == (0.002, False)
    assert (settings.stage_layers, settings.stage_fractions) == ((3, 12), (1.0, 2.5))


def test_resumable_fields_are_the_resume_overrides():
    assert set(resumable_fields(TrainConfig)) == {"max_steps", "eval_every", "save_every", "log_every",
                                                  "num_workers", "keep_checkpoints"}
    assert set(resumable_fields(PretrainConfig)) == {"eval_every", "save_every", "log_every", "keep_checkpoints"}


def test_a_list_option_that_is_not_numbers_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        pretrain.build_parser().parse_args([*PRETRAIN_REQUIRED, "--stage-layers", "3,x"])
    assert exit_info.value.code == 2
    assert "expected comma-separated integers, got '3,x'" in capsys.readouterr().err


def test_help_shows_every_default():
    text = " ".join(train.build_parser().format_help().split())
    for shown in ("--lr LR peak AdamW learning rate (default: 0.0001)", "total optimizer steps (default 50000)",
                  "--bf16, --no-bf16", "--gather-negatives, --no-gather-negatives", "(default: 4096)",
                  "labse-train: dev retrieval; labse-pretrain: held-out masked tokens) (default 1000)", "--grad-cache-chunk C", "(default: 42)"):
        assert shown in text, shown
    text = " ".join(pretrain.build_parser().format_help().split())
    for shown in ("relative length of each stage (LaBSE: 2,4,9) (default: 2,4,9)",
                  "(default L/4,L/2,L of the config's depth; mini: 1,2,4)",
                  "tokens per sequence (default 512, or the config's positions if fewer)",
                  "(default 0.5 with --pairs, else 0)", "steps between evaluations"):
        assert shown in text, shown


def test_labse_clean_builds_its_options_and_config_from_clean_config():
    """labse-clean takes its CleanConfig settings the same way: one option per field, the
    dataclass defaults when nothing is given, each option setting its own field."""
    from pipelines.clean.cli import build_parser
    from pipelines.clean.config import CleanConfig

    parser = build_parser()
    required = ["--input", "x.warc.gz", "--output", "out"]
    flags = {flag for action in parser._actions for flag in action.option_strings}
    for field, spec in config_options(CleanConfig):
        assert spec is not None and option_flag(field, spec) in flags, field.name
    assert config_from_args(CleanConfig, parser.parse_args(required)) == CleanConfig()
    given = config_from_args(CleanConfig, parser.parse_args([
        *required, "--main-content-model", "m.bin", "--langid-threshold", "0.7", "--min-chars", "5",
        "--max-chars", "900", "--max-line-chars", "1000", "--rows-per-file", "7",
        "--main-content-threshold", "0.25"]))
    assert given == CleanConfig(langid_threshold=0.7, main_content_model="m.bin", main_content_threshold=0.25,
                                min_chars=5, max_chars=900, max_line_chars=1000, rows_per_file=7)


# ------------------------------------------------------------------------------------------------
# Every command: options from its config dataclasses, checks in the dataclasses, one UsageError.

import ast
import logging
from pathlib import Path

from pipelines.io.config_options import UsageError

REPO = Path(__file__).resolve().parent.parent


def _console_scripts() -> set[str]:
    """The command names setup.py installs (its entry_points' console_scripts)."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "console_scripts":
                    return {ast.literal_eval(entry).split("=")[0] for entry in value.elts}
    raise AssertionError("setup.py declares no console_scripts")


def _parsers():
    """(command, sub-command or None) -> (its parser builder, the config dataclasses it is built from)."""
    from labse_model.config import PretrainConfig as Pretrain, TrainConfig as Train
    from pipelines.clean import cli as clean_cli
    from pipelines.clean.config import CleanConfig
    from pipelines.distill import cli as distill_cli
    from pipelines.distill.config import DistillConfig
    from pipelines.index import cli as index_cli
    from pipelines.index.config import IndexConfig
    from pipelines.vectors import cli as embed_cli
    from pipelines.vectors.config import EmbedConfig
    from pipelines.main_content import cli as main_content_cli
    from pipelines.main_content.config import BuildConfig, MainContentEvaluateConfig, MainContentTrainConfig
    from pipelines.mine import cli as mine_cli
    from pipelines.mine.config import MineConfig
    from pipelines.score import cli as score_cli
    from pipelines.score.config import ScoreConfig
    from pipelines.score.scorer import ScorerConfig
    from pipelines.tfrecords import cli as tfrecords_cli
    from pipelines.tfrecords.config import TFRecordsConfig
    from vocab import cli as vocab_cli
    from vocab.config import VocabConfig
    from pipelines.report import cli as report_cli
    from pipelines.report.config import ReportConfig

    return {
        ("labse-clean", None): (clean_cli.build_parser, [CleanConfig]),
        ("labse-main-content", "build-data"): (main_content_cli.build_data_parser, [BuildConfig]),
        ("labse-main-content", "train"): (main_content_cli.train_parser, [MainContentTrainConfig]),
        ("labse-main-content", "evaluate"): (main_content_cli.evaluate_parser, [MainContentEvaluateConfig]),
        ("labse-vocab", None): (vocab_cli.build_parser, [VocabConfig]),
        ("labse-mine", None): (mine_cli.build_parser, [MineConfig]),
        ("labse-score", None): (score_cli.build_parser, [ScoreConfig]),
        ("labse-score", "train"): (score_cli.train_parser, [ScorerConfig]),
        ("labse-tfrecords", None): (tfrecords_cli.build_parser, [TFRecordsConfig]),
        ("labse-distill", None): (distill_cli.build_parser, [DistillConfig]),
        ("labse-index", None): (index_cli.build_parser, [IndexConfig]),
        ("labse-embed", None): (embed_cli.build_parser, [EmbedConfig]),
        ("labse-report", None): (report_cli.build_parser, [ReportConfig]),
        ("labse-pretrain", None): (pretrain.build_parser, [Pretrain]),
        ("labse-train", None): (train.build_parser, [Train]),
    }


# Commands whose options are all inputs, outputs and run settings, with no config dataclass: each says why.
WITHOUT_CONFIG = {
    ("labse-main-content", "learning-curve"): "a WARC pattern, training sizes and optional human main text",
    ("labse-export", None): "a run, a step and an output directory",
    ("labse-eval", None): "a model, a data set and a device (tatoeba, multi30k, mining)",
}


def test_every_command_and_sub_command_is_listed():
    from pipelines.main_content.cli import COMMANDS as MAIN_CONTENT_COMMANDS

    listed = set(_parsers()) | set(WITHOUT_CONFIG)
    assert {command for command, _ in listed} == _console_scripts()
    assert {sub for command, sub in listed if command == "labse-main-content"} == set(MAIN_CONTENT_COMMANDS)
    assert ("labse-score", "train") in listed


@pytest.mark.parametrize("command", sorted(_parsers(), key=str), ids=lambda c: " ".join(filter(None, c)))
def test_every_command_is_built_from_its_config_dataclass(command):
    """Every field that is an option appears once, under its flag, with the field's default
    (None for the resumable and derived ones), its help text and its choices."""
    build_parser, classes = _parsers()[command]
    parser = build_parser()
    for cls in classes:
        for field, spec in config_options(cls):
            actions = [a for a in parser._actions if a.dest == field.name]
            if spec is None:
                assert actions == [], f"{cls.__name__}.{field.name} is marked not an option but has one"
                continue
            assert len(actions) == 1, f"{cls.__name__}.{field.name}: {len(actions)} options"
            action = actions[0]
            assert option_flag(field, spec) in action.option_strings, field.name
            assert spec.help and spec.help in action.help, field.name
            if field.default is dataclasses.MISSING:
                assert action.required, field.name
            elif spec.resumable or spec.derived:
                assert action.default is None, field.name
            else:
                assert action.default == field.default, field.name
            assert action.choices == spec.choices, field.name


@pytest.mark.parametrize("build, fault", [
    ("pipelines.clean.config:CleanConfig(main_content_threshold=7)", "main_content_threshold"),
    ("pipelines.main_content.config:BuildConfig(dev_fraction=0.6, test_fraction=0.5)", "--dev-fraction"),
    ("pipelines.main_content.config:MainContentTrainConfig(epoch=0)", "epoch"),
    ("pipelines.main_content.config:MainContentEvaluateConfig(threshold=1.5)", "--threshold"),
    ("vocab.config:VocabConfig(vocab_size=0)", "--vocab-size"),
    ("pipelines.mine.config:MineConfig(src_lang='de', tgt_lang='en', k=0)", "--k"),
    ("pipelines.mine.config:MineConfig(src_lang='de', tgt_lang='en', search='faiss')", "--search"),
    ("pipelines.score.config:ScoreConfig(keep_fraction=0.5, keep_best_f1=True)", "exclude one another"),
    ("pipelines.score.config:ScoreConfig(keep_precision=0)", "--keep-precision"),
    ("pipelines.score.scorer:ScorerConfig(k=0)", "--k"),
    ("pipelines.tfrecords.config:TFRecordsConfig(num_shards=0)", "--num-shards"),
    ("pipelines.distill.config:DistillConfig(dims=0)", "--dims"),
    ("labse_model.config:TrainConfig(max_steps=0)", "max_steps"),
])
def test_a_config_check_fires_in_library_use(build, fault):
    import importlib

    module, expression = build.split(":")
    namespace = vars(importlib.import_module(module))
    with pytest.raises(ValueError, match=fault):
        eval(expression, dict(namespace))


def test_the_keep_options_still_exclude_one_another_on_the_command_line(capsys):
    from pipelines.score import cli as score_cli

    with pytest.raises(SystemExit) as exit_info:
        score_cli.build_parser().parse_known_args(["--pairs", "p", "--output", "o", "--model", "m",
                                                   "--keep-fraction", "0.5", "--keep-best-f1"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def _bug(*_args, **_kwargs):
    raise ValueError("a shape bug deep inside")


def _user_error(*_args, **_kwargs):
    raise UsageError("--input x: something the user can fix")


# command main, the inner function a run reaches once the options are checked, and the argv.
INNER = {
    "labse-mine": ("pipelines.mine.cli", "check_inputs",
                   ["--src", "a", "--tgt", "b", "--src-lang", "de", "--tgt-lang", "en", "--output", "OUT"]),
    "labse-tfrecords": ("pipelines.tfrecords.cli", "find_parquet_files",
                        ["--pairs", "p", "--vocab", "v.txt", "--output", "OUT"]),
    "labse-vocab": ("vocab.cli", "stage_plan", ["--input-text", "de=x.txt", "--output", "OUT/vocab.txt"]),
    "labse-score": ("pipelines.score.cli", "require_stage_output",
                    ["--pairs", "p", "--output", "OUT", "--model", "m"]),
    "labse-clean": ("pipelines.clean.cli", "infer_format", ["--input", "x.warc.gz", "--output", "OUT"]),
    "labse-main-content train": ("pipelines.main_content.train", "train", ["--data", "d", "--output", "OUT/m.bin"]),
    "labse-main-content build-data": ("pipelines.read.readers", "check_pattern_matches",
                                     ["--input", "x.warc.gz", "--output", "OUT"]),
    "labse-train": ("labse_model.train", "train", TRAIN_REQUIRED[:-1] + ["OUT", "--device", "cpu"]),
    "labse-eval mining": ("pipelines.score.bucc", "read_side", ["mining", "--src", "s", "--tgt", "t", "--gold", "g"]),
    "labse-distill": ("pipelines.distill.corpus", "sentence_sources", ["--vocab", "v.txt", "--text", "de=x.txt",
                                                                    "--output", "OUT"]),
}


def _main_of(command: str):
    from labse_model import evaluate as evaluate_module, train as train_module
    from pipelines.clean import cli as clean_cli
    from pipelines.distill import cli as distill_cli
    from pipelines.main_content import cli as main_content_cli
    from pipelines.mine import cli as mine_cli
    from pipelines.score import cli as score_cli
    from pipelines.tfrecords import cli as tfrecords_cli
    from vocab import cli as vocab_cli

    return {"labse-mine": mine_cli.main, "labse-distill": distill_cli.main, "labse-tfrecords": tfrecords_cli.main, "labse-vocab": vocab_cli.main,
            "labse-score": score_cli.main, "labse-clean": clean_cli.main,
            "labse-main-content train": main_content_cli.train_main,
            "labse-main-content build-data": main_content_cli.build_data_main,
            "labse-eval mining": evaluate_module.main,
            "labse-train": lambda argv: train_module.main(argv)}[command]


def _run_with_inner(command: str, replacement, monkeypatch, tmp_path):
    """Run `command` with its inner function (INNER) replaced; outputs go under tmp_path."""
    import importlib

    module, name, argv = INNER[command]
    monkeypatch.setattr(importlib.import_module(module), name, replacement)
    if command == "labse-score":  # the scorer is loaded before the inner check
        from pipelines.score.scorer import QualityScorer

        monkeypatch.setattr(QualityScorer, "load", staticmethod(lambda path: None))
    argv = [str(tmp_path / a[4:]) if a.startswith("OUT/") else str(tmp_path / "out") if a == "OUT" else a
            for a in argv]
    return _main_of(command)(argv)


@pytest.mark.parametrize("command", INNER)
def test_a_bug_inside_a_command_keeps_its_traceback(command, monkeypatch, tmp_path):
    """A ValueError that is not a UsageError is a bug: it propagates (traceback), never exit 2."""
    with pytest.raises(ValueError, match="a shape bug deep inside") as raised:
        _run_with_inner(command, _bug, monkeypatch, tmp_path)
    assert not isinstance(raised.value, UsageError)


@pytest.mark.parametrize("command", INNER)
def test_a_usage_error_inside_a_command_is_one_line_and_exit_2(command, monkeypatch, tmp_path, capsys, caplog):
    if command == "labse-clean":  # its input format is a parser error (usage and exit 2)
        with pytest.raises(SystemExit) as exit_info:
            _run_with_inner(command, _user_error, monkeypatch, tmp_path)
        code = exit_info.value.code
    else:
        with caplog.at_level(logging.ERROR):
            code = _run_with_inner(command, _user_error, monkeypatch, tmp_path)
    assert code == 2
    shown = capsys.readouterr().err + caplog.text
    assert "something the user can fix" in shown and "Traceback" not in shown
