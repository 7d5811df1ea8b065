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
