"""pipelines.mine.config: labse-mine's counts are bounded in MineConfig, so a huge --src-blocks is one
line (exit 2) before any cell is planned."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("field", ["src_blocks", "tgt_shards", "k", "batch_size"])
def test_mine_config_bounds_its_counts(field):
    from pipelines.mine.config import MAX_COUNTS, MineConfig

    MineConfig(src_lang="de", tgt_lang="en", **{field: MAX_COUNTS[field]})
    with pytest.raises(ValueError, match=f"{field} .*between 1 and"):
        MineConfig(src_lang="de", tgt_lang="en", **{field: 10 ** 15})


def test_labse_mine_refuses_huge_src_blocks_in_one_line(tmp_path, capsys):
    from pipelines.mine import cli as mine_cli

    (tmp_path / "de.txt").write_text("Ein Hund.\n", encoding="utf-8")  # sides with sentences: the count is
    (tmp_path / "en.txt").write_text("A dog.\n", encoding="utf-8")  # what is refused, not an empty side
    assert mine_cli.main(["--src", str(tmp_path / "de.txt"), "--tgt", str(tmp_path / "en.txt"), "--src-lang", "de",
                          "--tgt-lang", "en", "--output", str(tmp_path / "pairs"),
                          "--src-blocks", str(10 ** 15)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--src-blocks" in err[0] and not (tmp_path / "pairs").exists(), err
