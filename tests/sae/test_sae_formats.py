"""load_sae reads SAELens, sparsify and dictionary_learning folders: latents and reconstructions equal
those the peer library itself computed (tests/data/sae/*/reference.safetensors, written by
tests/data/sae/make_fixtures.py in each peer's own venv: sae-lens 6.54.12, eai-sparsify 1.3.3,
dictionary-learning 0.1.0; the peers are not needed here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from hookrun.errors import ConfigError
from hookrun.sae import load_module, load_sae

DATA = Path(__file__).resolve().parents[1] / "data" / "sae"
RESID = "blocks.1.hook_resid_post"
# folder: (source, architecture, hook_name)
FIXTURES = {
    "saelens_standard": ("saelens", "standard", RESID),
    "saelens_standard_no_b_dec_in": ("saelens", "standard", RESID),
    "saelens_topk": ("saelens", "topk", RESID),
    "saelens_topk_rescaled": ("saelens", "topk", RESID),
    "saelens_jumprelu": ("saelens", "jumprelu", RESID),
    "saelens_gated": ("saelens", "gated", RESID),
    "saelens_constant_norm": ("saelens", "standard", RESID),
    "saelens_layer_norm": ("saelens", "jumprelu", RESID),
    "saelens_expected_average": ("saelens", "topk", RESID),
    "saelens_float64": ("saelens", "standard", RESID),
    "saelens_hook_z": ("saelens", "standard", "blocks.0.attn.hook_z"),
    "saelens_pre6": ("saelens", "standard", "blocks.2.hook_resid_pre"),
    "saelens_pre6_topk": ("saelens", "topk", "blocks.2.hook_resid_pre"),
    "hookrun_trained": ("saelens", "standard", "transformer.h.1"),
    "sparsify_topk": ("sparsify", "topk", None),
    "sparsify_groupmax": ("sparsify", "groupmax", None),
    "sparsify_checkpoint/h.0": ("sparsify", "topk", "h.0"),
    "sparsify_checkpoint/h.1": ("sparsify", "topk", "h.1"),
}


def reference(name: str) -> dict[str, torch.Tensor]:
    return load_file(str(DATA / name / "reference.safetensors"))


def test_every_fixture_folder_is_tested():
    on_disk = {str(p.parent.relative_to(DATA)) for p in DATA.rglob("reference.safetensors")}
    assert on_disk == set(FIXTURES) | set(DICTLEARN)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_latents_and_reconstruction_equal_the_peers(name):
    source, architecture, hook = FIXTURES[name]
    ref = reference(name)
    sae = load_sae(DATA / name)
    assert (sae.source, sae.architecture, sae.hook_name) == (source, architecture, hook)
    assert (sae.d_in, sae.d_sae) == (8, 16) and sae.W_dec.shape == (16, 8)
    assert not any(p.requires_grad for p in sae.parameters()) and not sae.training
    with torch.no_grad():
        f = sae.encode(ref["x"])
        recon = sae.decode(f)
        out = sae(ref["x"])
    assert f.dtype == ref["latents"].dtype and recon.shape == ref["recon"].shape
    torch.testing.assert_close(f, ref["latents"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(recon, ref["recon"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, ref["recon"], atol=1e-5, rtol=1e-5)
    assert ((ref["latents"] != 0).sum(-1) > 0).all()  # the fixtures exercise the latents


def test_dtype_and_device_are_chosen_by_the_caller():
    ref = reference("saelens_jumprelu")
    sae = load_sae(DATA / "saelens_jumprelu" / "sae_weights.safetensors", dtype="float64", device="cpu")
    assert sae.dtype == torch.float64 and sae.encode(ref["x"]).dtype == torch.float64
    torch.testing.assert_close(sae(ref["x"]).float(), ref["recon"], atol=1e-5, rtol=1e-5)
    assert load_sae(DATA / "saelens_float64").dtype == torch.float64  # cfg dtype
    with pytest.raises(ConfigError, match="dtype 'int3' for the SAE in .*: choose one of float32"):
        load_sae(DATA / "saelens_jumprelu", dtype="int3")


def test_steering_decode_after_encode_uses_the_same_rows_normalization():
    """layer_norm: decode(f) undoes the normalization of the rows encode() saw (as SAELens does);
    adding a latent adds its W_dec row, in normalized units, times those rows' std."""
    ref = reference("saelens_layer_norm")
    sae = load_sae(DATA / "saelens_layer_norm")
    x = ref["x"]
    f = sae.encode(x)
    bumped = f.clone()
    bumped[..., 3] += 1.0
    std = (x - x.mean(-1, keepdim=True)).std(-1, keepdim=True)
    torch.testing.assert_close(sae.decode(bumped) - sae.decode(f), std * sae.W_dec[3], atol=1e-5, rtol=1e-5)
    fresh = load_sae(DATA / "saelens_layer_norm")
    with pytest.raises(RuntimeError, match="call encode"):
        fresh.decode(f)


def test_sparsify_checkpoint_asks_for_one_hookpoint():
    with pytest.raises(ConfigError) as exc:
        load_sae(DATA / "sparsify_checkpoint")
    msg = str(exc.value)
    assert "\n" not in msg and "one SAE per hook point" in msg
    assert str(DATA / "sparsify_checkpoint" / "h.0") in msg and str(DATA / "sparsify_checkpoint" / "h.1") in msg


def test_check_fits_names_both_sizes():
    sae = load_sae(DATA / "saelens_standard")
    sae.check_fits(8, "transformer.h.1's output")
    sae.check_fits((2, 5, 8), "transformer.h.1's output")
    with pytest.raises(ConfigError) as exc:
        sae.check_fits(128, "transformer.h.1's output")
    assert str(exc.value) == (f"op splice: the SAE in {DATA / 'saelens_standard'} reads d_in=8 but transformer.h.1's "
                              f"output has 128 features (it was trained on {RESID})")
    load_sae(DATA / "saelens_hook_z").check_fits((3, 2, 4), "blocks.0.attn.hook_z")  # heads x d_head


# -- bad folders: one line each, naming the folder and what would be right -------------------
def one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    return msg


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / name))


def edit_cfg(folder: Path, file: str = "cfg.json", **changes) -> None:
    cfg = json.loads((folder / file).read_text())
    cfg.update(changes)
    (folder / file).write_text(json.dumps(cfg))


def test_empty_missing_and_foreign_folders(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_sae(tmp_path, where="op splice")
    assert one_line(exc) == (f"op splice: {tmp_path} is no SAE folder I know: found []; expected cfg.json + "
                             f"sae_weights.safetensors (SAELens), cfg.json + sae.safetensors (sparsify) or ae.pt + "
                             f"config.json (dictionary_learning)")
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.bin").write_bytes(b"x")
    (tmp_path / "cfg.json").write_text("{}")
    with pytest.raises(ConfigError) as exc:
        load_sae(tmp_path)
    assert f"{tmp_path} is no SAE folder I know: found [a.txt, b.bin, cfg.json]; expected" in one_line(exc)
    with pytest.raises(ConfigError) as exc:
        load_sae(tmp_path / "nope")
    assert f"no SAE folder {tmp_path / 'nope'}" in one_line(exc)


@pytest.mark.parametrize("change, expect", [
    ({"architecture": "transcoder"}, "architecture 'transcoder' is not one hookrun reads; SAELens folders: standard, topk, jumprelu, gated"),
    ({"normalize_activations": "whatever"}, "normalize_activations 'whatever' is not one hookrun reads; it reads none, "
                                            "expected_average_only_in, constant_norm_rescale, layer_norm"),
    ({"normalize_activations": "covariance_whitening"}, "the whitening is not folded into these weights"),
    ({"d_in": 9}, "says d_in=9 but W_enc in sae_weights.safetensors has shape (8, 16)"),
    ({"dtype": "float8"}, "dtype 'float8' is not one of"),
    ({"architecture": "jumprelu"}, "a SAELens jumprelu SAE needs tensors threshold; the file has W_dec, W_enc, b_dec, b_enc"),
    ({"architecture": "topk", "k": 0}, "a topk SAE needs k between 1 and d_sae=16, got 0"),
])
def test_bad_saelens_cfg(tmp_path, change, expect):
    folder = copy("saelens_standard", tmp_path)
    edit_cfg(folder, **change)
    with pytest.raises(ConfigError) as exc:
        load_sae(folder)
    msg = one_line(exc)
    assert expect in msg and str(folder) in msg


def test_tensors_that_disagree(tmp_path):
    folder = copy("saelens_standard", tmp_path)
    w = load_file(str(folder / "sae_weights.safetensors"))
    save_file({**w, "W_dec": torch.zeros(16, 9)}, str(folder / "sae_weights.safetensors"))
    with pytest.raises(ConfigError) as exc:
        load_sae(folder)
    assert f"{folder}: W_dec has shape (16, 9) but W_enc (8, 16) says (16, 8)" in one_line(exc)
    save_file({**w, "log_threshold": torch.zeros(16)}, str(folder / "sae_weights.safetensors"))
    with pytest.raises(ConfigError) as exc:
        load_sae(folder)
    assert "tensors log_threshold are not part of a SAELens standard SAE" in one_line(exc)
    save_file({**w, "scaling_factor": torch.full((16,), 2.0)}, str(folder / "sae_weights.safetensors"))
    with pytest.raises(ConfigError) as exc:
        load_sae(folder)
    assert "scaling_factor other than 1" in one_line(exc)
    save_file({**w, "scaling_factor": torch.ones(16)}, str(folder / "sae_weights.safetensors"))
    load_sae(folder)  # all ones: dropped, as SAELens does
    (folder / "sae_weights.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ConfigError) as exc:
        load_sae(folder)
    assert "sae_weights.safetensors is not a readable safetensors file" in one_line(exc)
    (folder / "cfg.json").write_text("{not json")
    with pytest.raises(ConfigError) as exc:
        load_sae(folder)
    assert "cfg.json is not a readable JSON file" in one_line(exc)


@pytest.mark.parametrize("change, expect", [
    ({"transcode": True}, "transcode: true is a transcoder"),
    ({"skip_connection": True}, "skip_connection: true is a sparse coder with a skip connection"),
    ({"num_latents": 32}, "num_latents=32"),
    ({"activation": "relu"}, "activation 'relu' is not one hookrun reads; sparsify's: topk, groupmax"),
])
def test_bad_sparsify_cfg(tmp_path, change, expect):
    folder = copy("sparsify_topk", tmp_path)
    edit_cfg(folder, **change)
    with pytest.raises(ConfigError) as exc:
        load_sae(folder)
    assert expect in one_line(exc)


# -- dictionary_learning ---------------------------------------------------------------------
DICTLEARN = {"dictlearn_AutoEncoder": "standard", "dictlearn_AutoEncoderNew": "standard",
             "dictlearn_GatedAutoEncoder": "gated", "dictlearn_JumpReluAutoEncoder": "jumprelu",
             "dictlearn_AutoEncoderTopK": "topk", "dictlearn_BatchTopKSAE": "jumprelu",
             "dictlearn_MatryoshkaBatchTopKSAE": "jumprelu"}


@pytest.mark.parametrize("name", sorted(DICTLEARN))
def test_dictionary_learning_equals_the_peer(name):
    ref = reference(name)
    sae = load_sae(DATA / name)
    assert (sae.source, sae.architecture, sae.hook_name) == ("dictionary_learning", DICTLEARN[name], "resid_post_layer_3")
    with torch.no_grad():
        torch.testing.assert_close(sae.encode(ref["x"]), ref["latents"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sae(ref["x"]), ref["recon"], atol=1e-5, rtol=1e-5)


def test_bad_dictionary_learning(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"trainer": {"dict_class": "IdentityDict"}}))
    torch.save({}, tmp_path / "ae.pt")
    with pytest.raises(ConfigError) as exc:
        load_sae(tmp_path)
    assert "trainer.dict_class 'IdentityDict' is not one hookrun reads; it reads AutoEncoder," in one_line(exc)
    (tmp_path / "config.json").write_text(json.dumps({"trainer": {"dict_class": "AutoEncoder"}}))
    torch.save({"encoder.weight": torch.zeros(16, 8)}, tmp_path / "ae.pt")
    with pytest.raises(ConfigError) as exc:
        load_sae(tmp_path)
    assert "a AutoEncoder needs tensors encoder.bias, decoder.weight, bias" in one_line(exc)
    torch.save(nn.Linear(2, 2), tmp_path / "ae.pt")  # a pickled module: refused by weights_only=True
    with pytest.raises(ConfigError) as exc:
        load_sae(tmp_path)
    assert "ae.pt is not a plain state dict (it holds a Python object (torch.nn.modules.linear.Linear), which hookrun " \
        "never unpickles)" in one_line(exc)


# -- any module ------------------------------------------------------------------------------
class TiedSAE(nn.Module):
    """A module of the user's own: returns (x_hat, latents) like a hand-written ReLU SAE."""

    def __init__(self, d: int, n: int) -> None:
        super().__init__()
        self.W = nn.Parameter(torch.randn(d, n))
        self.b = nn.Parameter(torch.randn(n))

    def encode(self, x):
        return torch.relu(x @ self.W + self.b)

    def decode(self, f):
        return f @ self.W.T

    def forward(self, x):
        f = self.encode(x)
        return self.decode(f), f


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_load_module_builds_loads_and_wraps(tmp_path, suffix):
    torch.manual_seed(0)
    W, b = torch.randn(8, 16), torch.randn(16)
    file = tmp_path / f"w{suffix}"
    (torch.save if suffix == ".pt" else lambda s, f: save_file(s, str(f)))({"W": W, "b": b}, file)
    coder = load_module("test_sae_formats.TiedSAE", str(file), d=8, n=16)
    x = torch.randn(5, 8)
    want = torch.relu(x @ W + b) @ W.T  # the formula, from the saved tensors
    torch.testing.assert_close(coder(x), want)
    torch.testing.assert_close(coder.decode(coder.encode(x)), want)
    assert coder.has_encode and coder.architecture == "TiedSAE" and coder.source == "module"
    node = load_module({"_target_": "test_sae_formats.TiedSAE", "d": 8, "n": 16}, str(file))
    torch.testing.assert_close(node(x), want)


def test_load_module_errors(tmp_path):
    torch.save({"W": torch.zeros(8, 16)}, tmp_path / "w.pt")
    with pytest.raises(ConfigError) as exc:
        load_module("test_sae_formats.TiedSAE", str(tmp_path / "w.pt"), d=8, n=16)
    assert "op splice.state_dict:" in one_line(exc) and "missing ['b']" in str(exc.value)
    torch.save({"W": torch.zeros(8, 4), "b": torch.zeros(16)}, tmp_path / "w.pt")
    with pytest.raises(ConfigError) as exc:
        load_module("test_sae_formats.TiedSAE", str(tmp_path / "w.pt"), d=8, n=16)
    assert "does not fit TiedSAE" in one_line(exc)
    with pytest.raises(ConfigError) as exc:
        load_module("test_sae_formats.NoSuch", None)
    assert "cannot import 'test_sae_formats.NoSuch'" in one_line(exc)
    with pytest.raises(ConfigError) as exc:
        load_module("test_sae_formats.TiedSAE", str(tmp_path / "missing.pt"), d=8, n=16)
    assert "no file" in one_line(exc)


@pytest.mark.parametrize("folder, rescaled", [("saelens_standard", False), ("saelens_topk_rescaled", True)])
def test_directions_are_the_decoder_rows_in_the_units_of_one_latent(folder, rescaled):
    """docs/sae.md: `sae.directions` is what one unit of f[..., i] adds; W_dec's rows, normalised to
    unit length where the cfg rescales the latents by the decoder norm (read from the files directly)."""
    cfg = json.loads((DATA / folder / "cfg.json").read_text())
    assert bool(cfg.get("rescale_acts_by_decoder_norm")) is rescaled
    w_dec = load_file(DATA / folder / "sae_weights.safetensors")["W_dec"].double()
    want = w_dec / w_dec.norm(dim=-1, keepdim=True) if rescaled else w_dec
    sae = load_sae(DATA / folder, dtype=torch.float64)
    assert sae.directions.shape == (cfg["d_sae"], cfg["d_in"])
    torch.testing.assert_close(sae.directions, want)
    if rescaled:
        assert not torch.allclose(sae.directions, w_dec)  # the fixture's rows are not unit already
