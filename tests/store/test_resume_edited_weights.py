"""resume=true into a cache whose model was edited in the middle of a tensor (one channel of a conv
zeroed, as an ablated neuron is saved): model_fingerprint read only each tensor's first and last four
values, so the edited checkpoint had the old fingerprint and resume went on, one file holding batch 0
of network A and the rest of network B. The reference: torch.equal on the two state dicts, and the
head's outputs in plain PyTorch."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from test_crash_resume import _cut_short, _net_cfg

import hookrun
from hookrun.config.build import weights_digest
from hookrun.errors import ConfigError


def _ablated(state: dict) -> dict:
    out = {k: v.clone() for k, v in state.items()}
    out["features.2.weight"][3] = 0  # output channel 3 of 8: the tensor's first and last values unchanged
    return out


def test_resume_refuses_a_checkpoint_edited_in_the_middle_of_a_tensor(tmp_path):
    import my_pkg

    torch.manual_seed(0)
    net, ckpt = my_pkg.Net(4).eval(), tmp_path / "ck.pt"
    edited = _ablated(net.state_dict())
    w, e = net.state_dict()["features.2.weight"].reshape(-1), edited["features.2.weight"].reshape(-1)
    assert not torch.equal(w, e) and torch.equal(w[:4], e[:4]) and torch.equal(w[-4:], e[-4:])
    torch.save(net.state_dict(), ckpt)
    cfg = _net_cfg(tmp_path, ckpt)
    path = hookrun.run(cfg).path
    _cut_short(path)
    torch.save(edited, ckpt)
    before = open(path, "rb").read()
    with pytest.raises(ConfigError, match=r"^resume: the model's weights differ from those '.*captures\.h5' was written "
                                          r"with \(model_fingerprint [0-9a-f]{32}, now [0-9a-f]{32}\)"):
        hookrun.run({**cfg, "resume": True})
    assert open(path, "rb").read() == before
    other = my_pkg.Net(4).eval()
    other.load_state_dict(edited)
    assert weights_digest(other) != weights_digest(net)
    torch.save(net.state_dict(), ckpt)  # the same weights again: resumed, every row network A's
    assert hookrun.run({**cfg, "resume": True}).status == "complete"
    with torch.no_grad():
        want = net(torch.stack([my_pkg.MyData(12)[i][0] for i in range(12)])).numpy()
    with h5py.File(path) as f:
        np.testing.assert_allclose(f["captures/h/head/output"][:], want, rtol=1e-5, atol=1e-6)


def _sixteen_digits(model: torch.nn.Module) -> str:
    """model_fingerprint as files written before 2026-12 hold it: sha256 over each tensor's name, dtype,
    shape and first and last four values (float64), 16 hex digits."""
    import hashlib

    h = hashlib.sha256()
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        flat = t.detach().reshape(-1)
        h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        h.update((torch.cat([flat[:4], flat[-4:]]) if flat.numel() > 8 else flat).double().numpy().tobytes())
    return h.hexdigest()[:16]


def test_a_file_with_the_older_sixteen_digit_fingerprint_still_resumes_and_a_retrained_model_is_still_refused(tmp_path):
    import my_pkg

    torch.manual_seed(0)
    net, ckpt = my_pkg.Net(4).eval(), tmp_path / "ck.pt"
    torch.save(net.state_dict(), ckpt)
    cfg = _net_cfg(tmp_path, ckpt)
    path = hookrun.run(cfg).path
    _cut_short(path)
    with h5py.File(path, "r+") as f:  # as an older hookrun wrote it
        f.attrs["model_fingerprint"] = _sixteen_digits(net)
    torch.manual_seed(1)
    torch.save(my_pkg.Net(4).state_dict(), ckpt)  # another network
    with pytest.raises(ConfigError, match=r"^resume: the model's weights differ .*model_fingerprint [0-9a-f]{16}, now"):
        hookrun.run({**cfg, "resume": True})
    torch.save(net.state_dict(), ckpt)
    assert hookrun.run({**cfg, "resume": True}).status == "complete"
    with torch.no_grad():
        want = net(torch.stack([my_pkg.MyData(12)[i][0] for i in range(12)])).numpy()
    with h5py.File(path) as f:
        np.testing.assert_allclose(f["captures/h/head/output"][:], want, rtol=1e-5, atol=1e-6)
