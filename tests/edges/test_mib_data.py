"""MIB's task rows as patching items (hookrun/data/mib.py): the IOI rows' prompts, counterfactuals and
answer tokens against the byte tokenizer's definition (BOS, then byte + 3) computed here, MIB's filter of
rows by their names' token counts (tests/edges/test_mib_filter.py checks it against MIB's own dataset class), a column mapping for other names, and the items run through
patching with each item's own position."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from hookrun.data.mib import ioi_rows, mib_task, value
from hookrun.data.mib_ioi import NAMES
from hookrun.data.text import ByteTokenizer
from hookrun.errors import ConfigError


def byte_ids(text):
    return [1] + [b + 3 for b in text.encode()]


def test_ioi_rows_read_as_mib_reads_them(tmp_path):
    rows = ioi_rows(n=12, seed=0, names=[n for n in NAMES if len(n) in (4, 5)])
    (tmp_path / "ioi.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    ds = mib_task(tmp_path / "ioi.jsonl", ByteTokenizer(), task="ioi", answer_space=False)
    # MIB's filter: the indirect object, subject and random_c of one token count (bytes here)
    kept = [r for r in rows if len({len(r["metadata"][k]) for k in ("indirect_object", "subject", "random_c")}) == 1]
    assert len(ds) == len(kept) > 0 and ds.dropped == len(rows) - len(kept)
    width = max(len(byte_ids(r["prompt"])) for r in kept)
    for item, r in zip(ds, kept, strict=True):
        io, s = r["metadata"]["indirect_object"], r["metadata"]["subject"]
        clean, cf = byte_ids(r["prompt"]), byte_ids(r["s2_io_flip_counterfactual"]["prompt"])
        assert item["clean"].tolist() == clean + [0] * (width - len(clean))
        assert item["corrupt"].tolist() == cf + [0] * (width - len(cf))
        assert int(item["position"]) == len(clean) - 1
        assert int(item["answer"]) == ord(io[0]) + 3 and int(item["wrong"]) == ord(s[0]) + 3
        assert r["prompt"].count(s) == 2 and r["s2_io_flip_counterfactual"]["prompt"].count(io) == 2


def test_other_names_through_a_column_mapping():
    rows = [{"text": "ab c", "cf": {"text": "ab d"}, "good": "x", "bad": "y"}]
    ds = mib_task(rows, ByteTokenizer(), columns={"clean": "text", "corrupt": "cf.text", "answer": "good", "wrong": "bad"},
                  answer_space=False)
    assert ds[0]["clean"].tolist() == byte_ids("ab c") and ds[0]["corrupt"].tolist() == byte_ids("ab d")
    assert (int(ds[0]["answer"]), int(ds[0]["wrong"])) == (ord("x") + 3, ord("y") + 3)
    mcqa = {"choices": {"label": ["A", "B"]}, "answerKey": 1}
    assert value(mcqa, "choices.label[answerKey]") == "B"


def test_bad_paths_and_tasks_are_one_line():
    with pytest.raises(ConfigError, match=r"columns.answer='meta.io': row 0 has no 'meta'") as err:
        mib_task([{"prompt": "a", "s2_io_flip_counterfactual": {"prompt": "b"}}], ByteTokenizer(),
                 columns={"answer": "meta.io", "wrong": "meta.s"})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="task='sst2'; choose from: ioi, arithmetic, mcqa, arc"):
        mib_task([], ByteTokenizer(), task="sst2")


def test_items_run_through_patching_at_their_own_positions():
    import hookrun
    from hookrun.models.tiny_lm import tiny_lm

    ds = mib_task(ioi_rows(n=6, seed=1), ByteTokenizer(), answer_space=False)
    model = tiny_lm().eval()
    grid = hookrun.patch_grid(model, ds, method="eap", metric={"name": "logit_diff", "position": "position"},
                              faithfulness={"fractions": [0.1, 1.0]})["edges"]
    with torch.no_grad():
        want = sum(float(model(it["clean"][None]).logits[0, int(it["position"]), int(it["answer"])]
                         - model(it["clean"][None]).logits[0, int(it["position"]), int(it["wrong"])]) for it in ds) / len(ds)
    assert grid.attrs["metric_clean"] == pytest.approx(want, abs=1e-4)
    assert grid.attrs["faithfulness_cpr_curve"][-1] == pytest.approx(1.0, abs=1e-5)


def test_a_tokenizer_without_bos_gets_the_eos_first_as_mibs_transformer_lens_gives_it(tmp_path):
    """Qwen2.5's tokenizer has no BOS token. MIB tokenizes with EAP-IG's tokenize_plus, TransformerLens'
    `model.to_tokens(prompts, prepend_bos=True, padding_side="right")`, on a tokenizer that set_tokenizer gave
    bos_token = eos_token: every prompt starts with the EOS token. The reference is that call on TransformerLens
    3.9 (MIB's evaluation runs a HookedTransformer); mib_task prepended nothing there."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformers import PreTrainedTokenizerFast

    rows = ioi_rows(n=4, seed=1)
    texts = [t for r in rows for t in (r["prompt"], r["s2_io_flip_counterfactual"]["prompt"])]
    words = sorted({w for t in texts for w in t.split()} | {r["metadata"][k] for r in rows for k in ("indirect_object", "subject")})
    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=word_level, eos_token="<|endoftext|>", unk_token="[UNK]").save_pretrained(tmp_path)
    load = lambda: PreTrainedTokenizerFast.from_pretrained(tmp_path)  # noqa: E731  (TransformerLens changes the one it gets)
    tok = load()
    assert tok.bos_token_id is None and tok.eos_token_id == 0  # Qwen2.5's shape: EOS, no BOS
    ds = mib_task(rows, tok, task="ioi")
    cfg = HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=64, d_head=4, n_heads=2, d_vocab=len(vocab), act_fn="gelu",
                                  original_architecture="Qwen2ForCausalLM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (TransformerLens 3.9's deprecation of HookedTransformer)
        tl = HookedTransformer(cfg, tokenizer=load())
    assert len(ds) == len(rows) and ds.dropped == 0
    for item, r in zip(ds, rows, strict=True):
        for key, prompt in (("clean", r["prompt"]), ("corrupt", r["s2_io_flip_counterfactual"]["prompt"])):
            want = tl.to_tokens([prompt], prepend_bos=True, padding_side="right")[0].tolist()
            assert item[key].tolist()[: len(want)] == want, key
        assert int(item["position"]) == len(want) - 1
