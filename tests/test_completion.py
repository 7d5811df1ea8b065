"""pipelines.io.completion: the completion marker, the stats file, strict JSON."""
import json

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipelines.io.completion import (
    STATS_BESIDE_SHARDS,
    IncompleteOutputError,
    finish_output,
    mark_complete,
    read_output_stats,
    require_complete,
    strict_json,
    write_stats_json,
)
from pipelines.io.locks import output_lock


def _strict_loads(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_completion_marker_is_required_and_carries_the_stats(tmp_path):
    out = tmp_path / "pairs"
    out.mkdir()
    with pytest.raises(IncompleteOutputError, match="interrupted or is still running: rerun the stage"):
        require_complete(out, "--pairs")
    mark_complete(out, {"pairs": 3, "threshold": float("inf")}, stage="labse-mine")
    marker = require_complete(out, "--pairs")
    assert marker["stage"] == "labse-mine" and marker["stats"] == {"pairs": 3, "threshold": None}
    _strict_loads((out / "_SUCCESS").read_text())
    (out / "_SUCCESS").write_text("")  # an empty Hadoop/Spark marker counts too
    assert require_complete(out, "--pairs") == {}


def test_marker_lock_and_stats_leave_the_documented_pyarrow_reads_working(tmp_path):
    table = pa.table({"text": ["a", "b"], "score": [0.5, 0.7]})
    flat = tmp_path / "scored"
    flat.mkdir()
    pq.write_table(table, flat / "part-00000-of-00001.parquet")
    write_stats_json(flat / "_stats.json", {"kept": 2})
    mark_complete(flat, {"kept": 2})
    hive = tmp_path / "clean"
    (hive / "sentences" / "lang=de").mkdir(parents=True)
    pq.write_table(table, hive / "sentences" / "lang=de" / "part-00000-of-00001.parquet")
    write_stats_json(hive / "stats.json", {"kept": 2})
    mark_complete(hive, {"kept": 2})
    with output_lock(flat), output_lock(hive):
        assert ds.dataset(str(flat), format="parquet").to_table().num_rows == 2
        sentences = ds.dataset(str(hive / "sentences"), partitioning="hive").to_table()
        assert sentences.num_rows == 2 and set(sentences.column("lang").to_pylist()) == {"de"}
    # what issue 13 reported: a plain stats.json beside the shards breaks the same call
    (flat / "stats.json").write_text("{}")
    with pytest.raises(pa.ArrowInvalid):
        ds.dataset(str(flat), format="parquet").to_table()


def test_strict_json_writes_non_finite_numbers_as_null(tmp_path, caplog):
    import numpy as np

    text = strict_json({"a": float("nan"), "b": [1.0, float("-inf")], "c": np.float32("inf"), "d": 2})
    assert _strict_loads(text) == {"a": None, "b": [1.0, None], "c": None, "d": 2}
    assert "a=nan" in caplog.text and "b[1]=-inf" in caplog.text
    write_stats_json(tmp_path / "stats.json", {"x": float("nan")})
    assert _strict_loads((tmp_path / "stats.json").read_text()) == {"x": None}


def test_one_stats_reader_for_either_name(tmp_path):
    plain, shards = tmp_path / "clean", tmp_path / "pairs"
    finish_output(plain, {"kept": 1}, stage="labse-clean")
    finish_output(shards, {"pairs": 2}, stage="labse-mine", shards_in_root=True)
    assert (plain / "stats.json").is_file() and (shards / STATS_BESIDE_SHARDS).is_file()
    assert read_output_stats(plain) == {"kept": 1} and read_output_stats(shards) == {"pairs": 2}
    assert require_complete(shards, "--pairs")["stats"] == {"pairs": 2}
