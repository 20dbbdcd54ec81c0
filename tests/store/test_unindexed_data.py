"""Data sets hookrun cannot read by index: a torch IterableDataset (a __len__ that lies, or none), a
generator. Each entry point refuses it in one line naming its class and what to give instead, before
any file. Before: an IterableDataset with a __len__ passed the map-style check and failed reading item 0
with torch's 'NotImplementedError: Subclasses of Dataset should implement __getitem__.' (a raw traceback
from probe.test_data and hookrun.attribute), and hookrun.attribute on a generator raised
"TypeError: object of type 'generator' has no len()"."""

from __future__ import annotations

import pytest
from conftest import ENV, run_cli
from odd_items import Items, Net, Streamed, StreamedLen

import hookrun
from hookrun.errors import ConfigError

NEED = ("hookrun needs a map-style dataset (with __len__ and __getitem__): give the items as a list "
        "(list(itertools.islice(data, N))) or a Dataset that reads item i")
STREAMED = ("a {}, a torch IterableDataset without its own __getitem__ (torch's raises NotImplementedError: "
            "items streamed, not read by index); " + NEED)


def test_an_iterable_dataset_with_a_len_is_refused_on_the_cli(tmp_path):
    proc = run_cli("hydra.run.dir=run", "model=custom", "model._target_=odd_items.Net", "data=custom",
                   "data.dataset._target_=odd_items.StreamedLen",
                   "hooks={h: {at: fc, type: forward}}", "progress=false", cwd=tmp_path, env=ENV)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hookrun: error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines == ["hookrun: error: data.dataset: 'odd_items.StreamedLen' built " + STREAMED.format("StreamedLen")]
    assert not (tmp_path / "run" / "captures.h5").exists()


@pytest.mark.parametrize("cls", [Streamed, StreamedLen])
def test_every_live_entry_refuses_an_iterable_dataset(tmp_path, cls):
    data = cls()
    calls = {"run(dataset=...): got": lambda: hookrun.run({"hooks": {"h": {"at": "fc", "type": "forward"}},
                                                          "output": {"path": str(tmp_path / "r.h5")}, "progress": False},
                                                         model=Net(), dataset=data),
             "probe.test_data: got": lambda: hookrun.probe(Net(), Items("labels"), at=["fc"], target="label",
                                                           batch_size=4, test_data=data),
             "attribute: got": lambda: hookrun.attribute(Net(), data, method="saliency", target_key="label")}
    for where, call in calls.items():
        with pytest.raises(ConfigError) as err:
            call()
        assert str(err.value) == f"{where} {STREAMED.format(cls.__name__)}"
    assert not (tmp_path / "r.h5").exists()


def test_attribute_refuses_a_generator_in_one_line():
    with pytest.raises(ConfigError) as err:
        hookrun.attribute(Net(), (Items("labels")[i] for i in range(8)), method="saliency", target_key="label")
    assert str(err.value) == f"attribute: got a generator; {NEED}"
