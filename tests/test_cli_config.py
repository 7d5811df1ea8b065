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
