"""model=tiny_lm: the trained GPT-2 shipped in the package. It loads offline through the config,
its weights are the safetensors file's, its next-byte loss on held-out pydoc text (computed here
with plain torch) is far below uniform, greedy generation reads as text, the training script runs,
and a wheel carries the weights."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from shipped_configs import composed

from hookrun.errors import ConfigError

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")

FOLDER = ROOT / "hookrun" / "models" / "tiny_lm"
SCRIPT = ROOT / "examples" / "train_tiny_lm.py"
# the shipped run measured 1.1159 nats/byte on this held-out text (training.json); uniform is ln 259 = 5.56
MAX_HELD_OUT_LOSS = 1.4


def composed_model():
    from hookrun.config.build import build_model

    return build_model(composed("model=tiny_lm", "data=text").model, torch.device("cpu"))


@pytest.fixture(scope="module")
def model():
    return composed_model()


def held_out_ids() -> list[int]:
    """The last 5% of pydoc's reference prose (values in sorted-key order) as byte ids, b -> b + 3."""
    from pydoc_data.topics import topics

    data = "".join(topics[k] for k in sorted(topics)).encode("utf-8")
    return [b + 3 for b in data[int(len(data) * 0.95):]]


def test_config_loads_the_shipped_weights_offline_in_float32_with_eager_attention(model):
    want = safetensors.load_file(FOLDER / "model.safetensors")
    got = model.state_dict()
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32
        torch.testing.assert_close(got[name], tensor.float(), rtol=0, atol=0)
    assert isinstance(model, transformers.GPT2LMHeadModel) and not model.training
    cfg = model.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_positions, cfg.vocab_size) == (4, 4, 128, 128, 259)
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 1, 2)
    assert cfg._attn_implementation == "eager"
    assert (FOLDER / "model.safetensors").stat().st_size < 4_500_000


def test_held_out_next_byte_loss_is_far_below_uniform(model):
    ids = held_out_ids()
    step = 127  # bos + 127 bytes = n_positions
    rows = [[1] + ids[i:i + step] for i in range(0, len(ids), step)]
    x = torch.zeros(len(rows), step + 1, dtype=torch.long)  # pad 0, right: the last row is short
    mask = torch.zeros_like(x)
    for r, row in enumerate(rows):
        x[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), 1
    with torch.no_grad():
        logits = model(input_ids=x, attention_mask=mask).logits
    target = x[:, 1:].masked_fill(mask[:, 1:] == 0, -100)  # padding excluded
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, 259), target.reshape(-1), ignore_index=-100).item()
    assert loss < MAX_HELD_OUT_LOSS < torch.log(torch.tensor(259.0)).item()
    recorded = json.loads((FOLDER / "training.json").read_text())
    assert abs(recorded["held_out_loss"] - loss) < 0.05  # the figure the training script printed


def test_greedy_generation_is_mostly_printable_text(model):
    prompt = torch.tensor([[1] + [b + 3 for b in b"The "]])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=60,
                             do_sample=False, pad_token_id=0, eos_token_id=2)
    new = [t - 3 for t in out[0, prompt.shape[1]:].tolist() if t >= 3]
    printable = [b for b in new if 32 <= b < 127 or b == 10]
    assert len(new) >= 40 and len(printable) >= 0.9 * len(new)
    text = bytes(new).decode("ascii", errors="replace")
    assert " " in text and sum(c.isalpha() for c in text) >= len(text) / 2, text


def test_missing_weights_are_refused_with_the_folder_and_the_fix(monkeypatch, tmp_path):
    tiny_module = importlib.import_module("hookrun.models.tiny_lm")  # the module; the package's attribute is the function
    monkeypatch.setattr(tiny_module, "FOLDER", tmp_path / "tiny_lm")
    with pytest.raises(ConfigError, match="no weights at .*train_tiny_lm.py"):
        tiny_module.tiny_lm()


def load_script():
    spec = importlib.util.spec_from_file_location("train_tiny_lm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_is_reproducible_bit_for_bit(tmp_path):
    script, threads = load_script(), torch.get_num_threads()
    small = ["--steps", "2", "--n-layer", "1", "--n-embd", "32", "--batch-size", "4", "--eval-every", "1"]
    try:
        first = script.train(script.parse([*small, "--out", str(tmp_path / "a")]))
        second = script.train(script.parse([*small, "--out", str(tmp_path / "b")]))
        third = script.train(script.parse([*small, "--seed", "1", "--out", str(tmp_path / "c")]))
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)
    a, b, c = (safetensors.load_file(tmp_path / n / "model.safetensors") for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [e["held_out_loss"] for e in first["log"]] == [e["held_out_loss"] for e in second["log"]]
    assert not all(torch.equal(a[k], c[k]) for k in a) and third["arguments"]["seed"] == 1


@pytest.mark.slow
def test_training_script_runs_end_to_end_in_quick_mode(tmp_path):
    out = tmp_path / "lm"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "3", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((out / "training.json").read_text())
    losses = [record["held_out_loss_initial"], *(e["held_out_loss"] for e in record["log"])]
    assert len(losses) == 2 and losses[1] < losses[0]  # before training, after step 3
    assert f"held-out loss {record['held_out_loss']:.4f}" in proc.stdout
    assert record["arguments"]["steps"] == 3 and record["versions"]["torch"] == torch.__version__
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out)
    assert loaded.config.n_embd == 128 and loaded.config.vocab_size == 259


@pytest.mark.slow
def test_a_wheel_carries_the_weights_and_loads_them_outside_the_checkout(tmp_path, wheel_site):
    names, site = wheel_site
    for name in ("config.json", "model.safetensors", "training.json"):
        assert f"hookrun/models/tiny_lm/{name}" in names
    assert "hookrun/conf/model/tiny_lm.yaml" in names
    work = tmp_path / "work"
    work.mkdir()
    probe = ("import hookrun.models as m; x = m.tiny_lm(); "
             "print(m.tiny_lm.__module__, sys.modules[m.tiny_lm.__module__].FOLDER, x.config.n_embd)")
    proc = subprocess.run([sys.executable, "-c", "import sys; " + probe], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, folder, width = proc.stdout.split()
    assert folder == str(site / "hookrun" / "models" / "tiny_lm") and width == "128"
