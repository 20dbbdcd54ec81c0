"""RankLink's handover in one process: three links (ranks 0, 1, 2) over one torch.distributed.HashStore
and one folder. hand_over writes under a temporary name and sends the final one; gather merges every
rank's file (or folder) in rank order, whatever order they came in, and removes them; a rank that ended
without handing over, or a stop, is one RunError line; require is the kinds' one ConfigError line. A rank
hands over only once rank 0 wants its part (want), and writes nothing where rank 0 ended without."""

from __future__ import annotations

import os
import threading

import pytest
import torch.distributed as dist

from hookrun.errors import ConfigError, RunError
from hookrun.output.process import Ranks
from hookrun.output.rank_link import RankLink


def links(folder, world=3):
    store = dist.HashStore()
    return [RankLink(store, Ranks(rank=r, world=world), folder, "job-key") for r in range(world)]


def test_hand_over_then_gather_merges_in_rank_order_and_removes_every_file(tmp_path):
    l0, l1, l2 = links(tmp_path)
    seen = []

    def save_as(text):
        def save(path):
            assert path.name.endswith(".tmp") and not path.exists()
            assert not path.with_name(path.name[:-4]).exists()  # the final name only once the file is whole
            path.write_text(text)
        return save

    l0.want("probe")
    l2.hand_over("probe", save_as("rows of rank 2"))  # rank 2 is done first
    l1.hand_over("probe", save_as("rows of rank 1"))
    assert sorted(os.listdir(tmp_path)) == [l1.path("probe", 1).name, l2.path("probe", 2).name]  # no temporary left
    merged = l0.gather("probe", lambda path: seen.append((path.name, path.read_text())))
    assert merged == 2
    assert seen == [(l1.path("probe", 1).name, "rows of rank 1"), (l2.path("probe", 2).name, "rows of rank 2")]
    assert os.listdir(tmp_path) == []


def test_a_folder_payload_is_removed_after_its_merge(tmp_path):
    l0, l1 = links(tmp_path, world=2)

    def save(path):
        path.mkdir()
        (path / "0.rows").write_bytes(b"\x01\x02")

    l0.want("similarity")
    l1.hand_over("similarity", save)
    seen = []
    l0.gather("similarity", lambda path: seen.append((path / "0.rows").read_bytes()))
    assert seen == [b"\x01\x02"] and os.listdir(tmp_path) == []


def test_a_rank_that_ended_without_handing_over_is_one_line_and_discard_cleans_up(tmp_path):
    l0, l1, l2 = links(tmp_path)
    l0.want("probe")
    l1.hand_over("probe", lambda path: path.write_text("rows of rank 1"))
    l0.store.set("done/2", "failed")  # (ShardRun's status of a rank that ended)
    (tmp_path / (l2.path("probe", 2).name + ".tmp")).write_text("half")  # what its save left
    seen = []
    with pytest.raises(RunError) as err:
        l0.gather("probe", seen.append)
    assert str(err.value) == ("probe: rank 2 ended (failed) without handing over its rows; the result needs every "
                              "rank's: run the same command again")
    assert seen == []  # nothing merged before every rank's part is there
    l0.discard("probe")
    assert os.listdir(tmp_path) == []


def test_a_stop_while_waiting_is_one_line(tmp_path):
    l0, _ = links(tmp_path, world=2)
    with pytest.raises(RunError, match=r"^similarity: stopped while waiting for the other ranks' rows$"):
        l0.gather("similarity", lambda path: None, should_stop=lambda: True)


def test_require_names_the_run_where_many_ranks_have_no_channel():
    RankLink.require(None, 1, "probe")  # one process: no channel needed
    RankLink.require(object(), 2, "probe")  # linked (resume=true or not)
    with pytest.raises(ConfigError) as err:
        RankLink.require(None, 2, "probe")
    assert str(err.value) == "probe over 2 ranks: no channel between the ranks; run it as one process"


def both_require(l0, l1, kind="probe"):
    """rank 1's require in a thread beside rank 0's (each waits for the other): the errors of each."""
    errors = {}

    def one(link, rank):
        try:
            RankLink.require(link, 2, kind, rank=rank)
        except ConfigError as exc:
            errors[rank] = exc

    thread = threading.Thread(target=one, args=(l1, 1))
    thread.start()
    one(l0, 0)
    thread.join(30)
    return errors


def test_require_has_rank_0_of_many_say_it_gathers_and_rejoin_rebuilds_only_where_it_does(tmp_path):
    l0, l1 = links(tmp_path, world=2)
    assert both_require(l0, l1) == {}
    assert l0.store.check(["kind/probe/want"]) and l0.store.get("kind/probe/sees/1") == b""  # rank 1 saw the mark
    rebuilt = []
    assert l1.rejoin("probe", lambda: rebuilt.append(1), lambda path: path.write_text("rows of rank 1"))
    assert rebuilt == [1] and l0.gather("probe", lambda path: rebuilt.append(path.read_text())) == 1
    assert rebuilt == [1, "rows of rank 1"]
    l0.store.set("done/0", "complete")  # (a resumed rank 0 whose result was written: it never wants)
    assert not l1.rejoin("similarity", lambda: rebuilt.append(2), lambda path: None)
    assert rebuilt == [1, "rows of rank 1"]  # nothing rebuilt, nothing handed over
    l0.discard("probe")
    assert os.listdir(tmp_path) == []  # the mark gone with the parts


def test_a_rank_that_does_not_see_rank_0s_folder_stops_both_before_any_batch(tmp_path):
    (tmp_path / "node0").mkdir()
    (tmp_path / "node1").mkdir()
    store = dist.HashStore()  # (node-local staging folders: each rank's own)
    l0, l1 = (RankLink(store, Ranks(rank=r, world=2), tmp_path / f"node{r}", "job-key") for r in (0, 1))
    errors = both_require(l0, l1, "similarity")
    mark = next((tmp_path / "node0").iterdir())
    text = (f"similarity: rank 1 does not see {tmp_path / 'node1' / mark.name}, which rank 0 wrote before any batch: "
            f"the ranks hand their rows over in {tmp_path / 'node1'} (output.staging for an object-store output), "
            f"which must be one folder every rank sees (a shared file system)")
    assert {r: str(e) for r, e in errors.items()} == {0: text, 1: text}
    assert all(e.every_rank for e in errors.values())  # (the command prints it once, on rank 0)
    l0.discard("similarity")
    assert os.listdir(tmp_path / "node0") == [] and os.listdir(tmp_path / "node1") == []


def test_a_rank_waits_for_rank_0_and_hands_nothing_over_where_it_ended_without_gathering(tmp_path):
    l0, l1 = links(tmp_path, world=2)
    l0.store.set("done/0", "complete")  # a resumed rank 0 whose shard was complete: its result is written
    assert l1.hand_over("probe", lambda path: path.write_text("rows")) is False
    assert os.listdir(tmp_path) == [] and not l0.store.check(["kind/probe/1"])
    l0.want("probe")  # (a rank 0 that wanted the parts, then failed: its close discarded what had come)
    assert l1.hand_over("probe", lambda path: path.write_text("rows")) is False and os.listdir(tmp_path) == []

    l0, l1 = links(tmp_path, world=2)  # a fresh store: rank 1 is done before rank 0 says it gathers
    timer = threading.Timer(0.3, l0.want, ("similarity",))
    timer.start()
    assert l1.hand_over("similarity", lambda path: path.write_text("rows")) is True
    timer.join()
    assert l0.gather("similarity", lambda path: None) == 1 and os.listdir(tmp_path) == []
    with pytest.raises(RunError, match=r"^probe: stopped while waiting for rank 0$"):
        l1.wanted("probe", should_stop=lambda: True)


def test_a_rank_waiting_for_a_silent_rank_0_takes_it_for_dead(tmp_path, monkeypatch):
    from hookrun.output import rank_link

    monkeypatch.setattr(rank_link, "SILENT_SECONDS", 0.2)
    _, l1 = links(tmp_path, world=2)  # rank 0's heartbeat (beat/0) never moves
    with pytest.raises(RunError, match=r"^probe: rank 0 has been silent for 0 s before gathering the ranks' rows: "
                                       r"taken for dead$"):
        l1.wanted("probe")
