"""pipelines.stage_options: an abbreviated Beam option is refused, not guessed and not dropped.

Beam's own PipelineOptions parses with allow_abbrev=False and only logs "Discarding unparseable args"
for `--runn DataflowRunner`, so the job would run on the DirectRunner (its default) on the launcher."""
import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from pipelines.clean.cli import build_parser

REQUIRED = ["--input", "x.warc.gz", "--output", "o"]


def test_beam_itself_would_drop_an_abbreviated_option():
    """Why the refusal matters: what Beam makes of the abbreviations below on its own."""
    assert PipelineOptions(["--runn", "DataflowRunner"]).view_as(StandardOptions).runner is None
    assert PipelineOptions(["--direct_num_work", "2"]).view_as(DirectOptions).direct_num_workers == 1


@pytest.mark.parametrize("abbreviated,meant", [(["--runn", "DataflowRunner"], "--runner"),
                                               (["--runn=DataflowRunner"], "--runner"),
                                               (["--direct_num_work", "2"], "--direct_num_workers"),
                                               (["--temp_loc", "gs://b/tmp"], "--temp_location")])
def test_an_abbreviated_beam_option_is_refused_in_one_line_naming_the_option(capsys, abbreviated, meant):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_known_args(REQUIRED + abbreviated)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("labse-clean: error: unrecognized arguments: ")
    assert f"did you mean {abbreviated[0].split('=')[0]} -> {meant}?" in err


def test_the_full_beam_option_goes_to_beam_unchanged():
    beam = ["--runner", "DataflowRunner", "--direct_num_workers", "2", "--temp_location=gs://b/tmp"]
    _, beam_args = build_parser().parse_known_args(REQUIRED + beam)
    assert beam_args == beam


def test_a_stage_option_cannot_be_abbreviated(tmp_path, capsys):
    """`--over` must not be taken for `--overwrite` (which deletes an output): it is refused."""
    from pipelines.stage_options import stage_parser

    parser = stage_parser("labse-x", "test", output="OUT")
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_known_args(["--output", str(tmp_path / "o"), "--over"])
    assert exit_info.value.code == 2 and "--over" in capsys.readouterr().err
