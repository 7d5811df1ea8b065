"""pipelines.io.overlap: the overwrite rule and the overlap rule (issue 38)."""
import pytest

from pipelines.io.completion import IncompleteOutputError, mark_complete, read_output_stats, require_complete
from pipelines.io.completion import finish_output
from pipelines.io.overlap import OUTPUT_REFUSED, OutputExistsError, fresh_output, prepare_output
from tests.object_store import ObjectStoreOnDisk


def test_prepare_output_refuses_existing_output_unless_overwrite(tmp_path):
    out = tmp_path / "out"
    prepare_output(out, overwrite=False)  # missing: created
    assert out.is_dir()
    prepare_output(out, overwrite=False)  # empty: fine
    (out / "part-0.parquet").write_text("x")
    mark_complete(out, {"rows": 1})
    with pytest.raises(OutputExistsError, match="--overwrite"):
        prepare_output(out, overwrite=False)
    prepare_output(out, overwrite=True)
    assert out.is_dir() and list(out.iterdir()) == []
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match="existing file"):
            prepare_output(a_file, overwrite=overwrite)
    assert a_file.read_text() == "keep me"


def test_object_store_output_rule_and_marker(tmp_path):
    out = ObjectStoreOnDisk.PREFIX + str(tmp_path / "remote")
    prepare_output(out, overwrite=False)  # nothing there
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "part-0.parquet").write_text("x")
    with pytest.raises(IncompleteOutputError):
        require_complete(out, "--pairs")
    mark_complete(out, {"n": 1})
    assert require_complete(out, "--pairs")["stats"] == {"n": 1}
    with pytest.raises(OutputExistsError, match="part-0.parquet"):
        prepare_output(out, overwrite=False)
    prepare_output(out, overwrite=True)
    assert not (tmp_path / "remote" / "part-0.parquet").exists()
    assert not (tmp_path / "remote" / "_SUCCESS").exists()


def test_fresh_output_locks_then_refuses_what_exists_and_shard_stats_round_trip(tmp_path):
    out = tmp_path / "out"
    with fresh_output(out, overwrite=False):
        assert out.is_dir() and (tmp_path / "out.lock").is_file()
        finish_output(out, {"pairs": 3}, stage="test", shards_in_root=True)
    assert not (tmp_path / "out.lock").exists()
    assert read_output_stats(out) == {"pairs": 3}
    assert require_complete(out, "out")["stage"] == "test"
    with pytest.raises(OUTPUT_REFUSED):
        with fresh_output(out, overwrite=False):
            pass
    with fresh_output(out, overwrite=True):
        assert not list(out.iterdir())


# ------------------------------------------------------------------ the overlap rule (issue 38)
from pipelines.io.overlap import OutputOverlapsInputError, check_output_apart  # noqa: E402

BESIDE = [  # (output, input): an output beside the files a glob reads, in the glob's folder
    ("{root}/crawl/clean", "{root}/crawl/*.warc.gz"),
    ("{root}/run/scored", "{root}/run/part-*.parquet"),
    ("{root}/text/vocab/vocab.txt", "{root}/text/*.txt"),
    ("{root}/data/clean", "{root}/data/lang=*/part-?.parquet"),
    ("{root}/crawl/clean", "{root}/crawl/[a-b]*.warc.gz"),
]
OVERLAPS = [  # (output, input, the relation the message names)
    ("{root}/crawl/clean", "{root}/crawl/**", "could hold files that match"),  # ** matches at any depth
    ("{root}/crawl/clean", "{root}/crawl/**/*.warc.gz", "could hold files that match"),
    ("{root}/crawl/clean", "{root}/crawl/*", "could hold files that match"),  # matches the output itself
    ("{root}/crawl/clean", "{root}/crawl/cl*/part-*.parquet", "could hold files that match"),  # its own files
    ("{root}/crawl/clean/sub", "{root}/crawl/c*", "could hold files that match"),  # a folder above it
    ("{root}/crawl/clean", "{root}/crawl/clean/*.parquet", "is"),  # the glob's folder is the output
    ("{root}/crawl", "{root}/crawl/sub/*.warc.gz", "contains"),  # the input lies inside the output
    ("{root}/crawl/clean", "{root}/crawl", "lies inside"),  # a directory input
    ("{root}/crawl/x.warc.gz", "{root}/crawl/x.warc.gz", "is"),  # a file input
    ("{root}/crawl/x.warc.gz/out", "{root}/crawl/x.warc.gz", "lies inside"),
]


@pytest.mark.parametrize("root", ["LOCAL", "gs://bucket"])
@pytest.mark.parametrize("output, source", BESIDE)
def test_an_output_beside_what_a_glob_reads_is_accepted(tmp_path, root, output, source):
    root = str(tmp_path) if root == "LOCAL" else root
    check_output_apart(output.format(root=root), [source.format(root=root)])


@pytest.mark.parametrize("root", ["LOCAL", "gs://bucket"])
@pytest.mark.parametrize("output, source, relation", OVERLAPS)
def test_every_real_overlap_is_still_refused(tmp_path, root, output, source, relation):
    root = str(tmp_path) if root == "LOCAL" else root
    with pytest.raises(OutputOverlapsInputError, match=f"{root}/crawl\\S* {relation} the input") as caught:
        check_output_apart(output.format(root=root), [source.format(root=root)])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("root", ["LOCAL", "gs://bucket"])
def test_a_file_named_and_the_same_file_globbed_get_the_same_verdict(tmp_path, root):
    root = str(tmp_path) if root == "LOCAL" else root
    crawl = f"{root}/crawl"
    for named, globbed in ((f"{crawl}/x.warc.gz", f"{crawl}/*.warc.gz"), (f"{crawl}/x.warc.gz", f"{crawl}/x.warc.g?"),
                           (f"{crawl}/clean/x.warc.gz", f"{crawl}/clean/*.warc.gz"),
                           (f"{crawl}/clean/x.warc.gz", f"{crawl}/c*/x.warc.gz")):
        verdicts = []
        for source in (named, globbed):
            try:
                check_output_apart(f"{crawl}/clean", [source])
                verdicts.append("accepted")
            except OutputOverlapsInputError:
                verdicts.append("refused")
        assert verdicts[0] == verdicts[1], (named, globbed, verdicts)


def test_a_symlinked_output_inside_a_globs_folder_is_judged_by_its_real_path(tmp_path):
    (tmp_path / "crawl").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "clean").symlink_to(tmp_path / "crawl")  # really crawl/ itself
    with pytest.raises(OutputOverlapsInputError, match="is the input"):
        check_output_apart(tmp_path / "elsewhere" / "clean", [f"{tmp_path}/crawl/*.warc.gz"])
    (tmp_path / "crawl" / "clean").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "crawl" / "clean")
    check_output_apart(tmp_path / "link", [f"{tmp_path}/crawl/*.warc.gz"])  # beside, under another name


def test_a_run_marked_started_is_unfinished_until_complete_and_alone_blocks_no_retry(tmp_path):
    """`_STARTED` is a trace of an unfinished output until `mark_complete` removes it; an output
    holding nothing else (a run that failed before writing) is prepared again without --overwrite,
    one holding a shard beside it is refused."""
    from pipelines.io.completion import mark_started, unfinished_traces

    out = tmp_path / "out"
    out.mkdir()
    mark_started(out, stage="labse-embed")
    assert unfinished_traces(out) == [f"{out}/_STARTED"]
    prepare_output(out, overwrite=False)  # only the marker: nothing to keep
    mark_started(out, stage="labse-embed")
    (out / "de-00000-of-00001.npy").write_bytes(b"partial")
    with pytest.raises(OutputExistsError, match="_STARTED"):
        prepare_output(out, overwrite=False)
    mark_complete(out, {}, stage="labse-embed")
    assert not (out / "_STARTED").exists() and unfinished_traces(out) == []
