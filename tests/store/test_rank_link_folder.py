"""RankLink where rank 0 does not see the folder a rank handed its part over in (ranks on two machines
with node-local folders: an object-store output staged in a folder of each node's own): gather is one
RunError line naming the path and the folder that must be shared, before any merge, instead of an
OSError from the reader. Two links over one torch.distributed.HashStore, each with a folder of its own."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from hookrun.errors import RunError
from hookrun.output.process import Ranks
from hookrun.output.rank_link import RankLink


def test_a_part_rank_0_cannot_see_is_one_line_and_nothing_is_merged(tmp_path):
    store = dist.HashStore()
    l0 = RankLink(store, Ranks(rank=0, world=2), tmp_path / "node0", "job-key")
    l1 = RankLink(store, Ranks(rank=1, world=2), tmp_path / "node1", "job-key")
    (tmp_path / "node1").mkdir()
    l0.want("probe")
    assert l1.hand_over("probe", lambda path: path.write_text("rows of rank 1"))
    theirs = l1.path("probe", 1)
    theirs.rename(tmp_path / "elsewhere")  # (the file is on the other machine: rank 0 cannot open it)
    merged = []
    with pytest.raises(RunError, match=r"^probe: rank 1 handed over .*\.rank-00001, which rank 0 does not see: .*"
                                       r"output\.staging for an object-store output.* one folder every rank sees"):
        l0.gather("probe", merged.append)
    assert merged == []
