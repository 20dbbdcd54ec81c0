"""Modules reachable by two names, and modules that run more than once in a forward.

A tied parameter reached by two of its names was hooked twice: modify_grad scale 0.5 scaled its
gradient by 0.25 and record wrote it twice. A module registered under a second name (`nn.ModuleList([block]
* 3)`: layers.1 is layers.0) was "no module 'layers.1'". top_examples at a module called twice per forward
kept its first call's activations and said nothing. References: torch.autograd.grad and the block called
by hand on the same weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hookrun
from hookrun.errors import ConfigError, RunError


class Tied(nn.Module):
    """An embedding whose weight is also the head's (GPT-2's wte and lm_head)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.mid, self.head = nn.Embedding(7, 4), nn.Linear(4, 4), nn.Linear(4, 7, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.emb(ids))))


@pytest.mark.parametrize("at", ["*.weight", ["emb.weight", "head.weight"]])
def test_a_tied_parameter_under_two_names_is_hooked_once(at, caplog):
    model, ids = Tied(), torch.randint(0, 7, (3, 5), generator=torch.Generator().manual_seed(1))
    want = torch.autograd.grad(model(ids).logsumexp(-1).sum(), model.emb.weight)[0]
    edit = {"at": at, "type": "param", "actions": [{"name": "modify_grad", "op": "scale", "factor": 0.5}]}
    with hookrun.capture(model, {"p": edit}):
        model(ids).logsumexp(-1).sum().backward()
    torch.testing.assert_close(model.emb.weight.grad, 0.5 * want)  # was 0.25 * want: scaled by each name's hook
    assert "hooks.p.at: head.weight is emb.weight: one tensor under two names (tied), hooked once" in caplog.text
    with hookrun.capture(model, {"r": {"at": at, "type": "param", "actions": ["record"]}}) as cap:
        model(ids).logsumexp(-1).sum().backward()
    assert [k[1] for k in cap if k[1] != "mid.weight"] == ["emb.weight"]
    torch.testing.assert_close(cap["emb.weight", "grad"][0], want)


def test_one_name_of_a_tied_parameter_keeps_that_name():
    model, ids = Tied(), torch.randint(0, 7, (3, 5), generator=torch.Generator().manual_seed(1))
    want = torch.autograd.grad(model(ids).sum(), model.emb.weight)[0]
    with hookrun.capture(model, {"r": {"at": "head.weight", "type": "param", "actions": ["record"]}}) as cap:
        model(ids).sum().backward()
    torch.testing.assert_close(cap["head.weight", "grad"][0], want)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class Reused(nn.Module):
    """One block applied three times (ALBERT-style): layers.0, layers.1, layers.2 are one object."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([Block()] * 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_second_name_of_a_reused_block_says_which_module_it_is():
    with pytest.raises(ConfigError) as err:
        hookrun.capture(Reused(), {"f": {"at": "layers.1", "type": "forward"}}).__enter__()
    assert str(err.value) == ("hooks.f.at: 'layers.1' is the module 'layers.0' under a second name (one object, "
                              "registered twice: a shared or reused block); hook 'layers.0': each of its calls in a "
                              "forward is captured apart (output, output@1, ...; python -m hookrun.modules shows its calls)")
    model, x = Reused(), torch.randn(2, 4)
    with torch.no_grad(), hookrun.capture(model, {"f": {"at": "layers.0", "type": "forward", "actions": [
            {"name": "record", "what": "output"}]}}) as cap:
        model(x)
        h = [x]
        for _ in range(3):
            h.append(torch.tanh(model.layers[0].lin(h[-1])))
    for call in range(3):
        torch.testing.assert_close(cap["layers.0", "output" + (f"@{call}" if call else "")], h[call + 1])


def test_top_examples_at_a_module_called_twice_is_one_line(tmp_path):
    model, x = Reused(), torch.randn(2, 4)
    hooks = {"t": {"at": "layers.0", "type": "forward", "actions": [{"name": "top_examples", "k": 1}]}}
    with pytest.raises(RunError) as err, torch.no_grad(), hookrun.capture(model, hooks):
        model(x)
    assert str(err.value) == ("hooks.t.actions.0: top_examples: layers.0 runs more than once in one forward (this is "
                              "call 2: a shared module, or one called in a loop), and its features' top examples would "
                              "be one call's; hook a module that runs once per forward (python -m hookrun.modules shows "
                              "the calls)")


class TwoTanh(nn.Module):
    """torch.tanh called twice in the model's own forward: op sites /tanh.0 and /tanh.1."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.b(torch.tanh(self.a(x)) * 3))


def test_top_examples_at_an_op_site_of_every_call_is_one_line_and_one_call_is_exact():
    """`/tanh` (every call of tanh) merged both calls into one top-k: feature 0's was call 1's 0.827 and
    call 0's 0.746. Reference: torch.topk over the second call's output computed by hand."""
    model, x = TwoTanh().eval(), torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    top = {"name": "top_examples", "k": 2}
    with pytest.raises(RunError) as err, torch.no_grad(), hookrun.capture(model, {"t": {"at": "/tanh", "type": "forward",
                                                                                          "actions": [top]}}):
        model(x)
    assert str(err.value) == ("hooks.t.actions.0: top_examples: /tanh is called more than once in one forward (/tanh.1 "
                              "is one more call), and one top-k per feature would mix the calls; name one call "
                              "(/tanh.0, /tanh.1): each gets its own top examples")
    with torch.no_grad(), hookrun.capture(model, {"t": {"at": "/tanh.1", "type": "forward", "actions": [top]}}) as cap:
        model(x)
        want = torch.tanh(model.b(torch.tanh(model.a(x)) * 3)).T.topk(2, dim=1)
    torch.testing.assert_close(cap["/tanh.1", "top.values"], want.values)
    assert cap["/tanh.1", "top.samples"].tolist() == want.indices.tolist()



class FrozenEmbedLoop(nn.Module):
    """A frozen embedding, then one block applied three times (a looped head on frozen features)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.block = nn.Embedding(9, 4).requires_grad_(False), Block()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for _ in range(3):
            h = self.block(h)
        return h.sum(-1)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # (PyTorch's, at call 0: no input needs a gradient)
def test_grad_input_of_a_looped_block_whose_first_call_needs_no_gradient(tmp_path, caplog):
    """The first call's input comes from a frozen embedding (no gradient): its grad_input is None, and the run
    stopped in 'no input of it needs a gradient' although calls 1 and 2 have one. Now call 0 gets no row (one
    warning) and the others equal torch.autograd.grad of the loss by each call's input (the previous output)."""
    model = FrozenEmbedLoop().eval()
    ids = torch.randint(0, 9, (6, 3), generator=torch.Generator().manual_seed(3))
    cfg = {"data": {"batch_size": 3}, "progress": False, "mode": "grad", "output": {"path": str(tmp_path / "g.h5")},
           "loss": {"_target_": "hookrun.runner.losses.sum_output", "_partial_": True},
           "hooks": {"g": {"at": "block", "type": "backward", "actions": [{"name": "record", "what": "grad_input"}]}}}
    result = hookrun.run(cfg, model=model, dataset=torch.utils.data.TensorDataset(ids))
    want: dict[int, list] = {1: [], 2: []}
    for rows in (ids[:3], ids[3:]):
        outs, h = [], model.emb(rows)
        for _ in range(3):
            h = model.block(h)
            outs.append(h)
        for call, g in zip((1, 2), torch.autograd.grad(h.sum(), outs[:2]), strict=True):
            want[call].append(g)
    with hookrun.open_run(result.path) as run:
        assert run.status == "complete"
        assert sorted((c.role, c.call) for c in run.list_captures()) == [("grad_input", 1), ("grad_input", 2)]
        for call in (1, 2):
            torch.testing.assert_close(torch.as_tensor(run["block", f"grad_input@{call}"][:]), torch.cat(want[call]))
    assert "call 0 gets no row, the module's other calls are recorded" in caplog.text


def test_a_second_name_at_sae_at_and_attribution_at_says_which_module_it_is(tmp_path):
    """sae.at and attribution.at said "no module 'layers.1'" of the reused block's second name; they take
    a module that runs once per forward, so the line names the module and what to name instead."""
    tail = ("is the module 'layers.0' under a second name (one object, registered twice: a shared or reused "
            "block); it runs once for each of its names, and {w} takes a module that runs once per forward: name "
            "one outside it, or give each use a block of its own")
    with pytest.raises(ConfigError) as err:
        hookrun.attribute(Reused(), [(torch.randn(4), 0) for _ in range(4)], batch_size=4, method="grad_cam",
                          at="layers.1")
    assert str(err.value) == "attribution.at: 'layers.1' " + tail.format(w="attribution.at")
    cfg = {"progress": False, "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "s.h5")},
           "sae": {"at": "layers.1", "d_sae": 8, "rows": 64, "batch_rows": 8}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg, model=Reused(), dataset=[torch.randn(4) for _ in range(8)])
    assert str(err.value) == "sae.at: 'layers.1' " + tail.format(w="sae.at")
    assert not (tmp_path / "s.h5").exists()
