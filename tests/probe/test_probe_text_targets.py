"""Text targets. hookrun's own (is_space, after_space) read data=text's byte tokens (byte b is id b + 3): on
another tokenizer's ids they are one line before any batch. They compared the ids with 35, the byte
tokenizer's space, which in GPT-2's vocabulary is 'D': a probe of "starts a word" fitted "follows a
D" and reported its accuracy without a word. Labels that are strings are one line saying to map them to
classes."""

from __future__ import annotations

import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["after_space", "is_space"])
def test_ids_of_another_tokenizer_are_one_line_before_any_batch(name) -> None:
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(vocab_size=600, n_embd=8, n_layer=1, n_head=2, n_positions=8,
                                                           bos_token_id=0, eos_token_id=0)).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 600, (16, 6), generator=g)
    ids[:, 1] = 35  # (GPT-2's 'D': the byte tokenizer's space)
    items = [{"input_ids": i, "attention_mask": torch.ones(6, dtype=torch.long)} for i in ids]
    with pytest.raises(ConfigError) as err:
        hookrun.probe(model, items, at=["h.0"], target={"_target_": f"hookrun.runner.kinds.probe.targets.{name}"},
                      pool="every", control=False)
    top = int(ids[:8].max())  # (the first batch's)
    assert str(err.value) == (f"probe.target: {name} reads data=text's byte tokens (data.dataset.tokenizer: byte, whose "
                              f"ids are below 259), and this batch's ids reach {top}: another tokenizer's, whose id 35 is "
                              f"not a space; use tokenizer: byte, or a target function that knows your tokenizer")


def test_byte_ids_are_the_characters() -> None:
    """The byte tokenizer's ids still give the targets the characters say (a two-byte character too)."""
    from hookrun.data.text import ByteTokenizer
    from hookrun.runner.kinds.probe.targets import after_space, is_space

    batch = ByteTokenizer()(["a b", "\xff c"], max_length=8)
    text = ["\x00" + "a b", "\x00" + "\xff c".encode().decode("latin-1")]  # (position 0: bos)
    for row, t in enumerate(text):
        for j, ch in enumerate(t):
            assert int(is_space(batch)[row, j]) == (ch == " ")
            assert int(after_space(batch)[row, j]) == (j > 0 and t[j - 1] == " ")


def test_string_labels_are_one_line_saying_to_map_them_to_classes() -> None:
    """A text data set's labels as strings (a Hugging Face dataset's 'pos' / 'neg'), collated to a list of
    str, were refused as 'gives list ()': no word of strings or of what to give instead."""
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(vocab_size=30, n_embd=8, n_layer=1, n_head=2, n_positions=8,
                                                           bos_token_id=0, eos_token_id=0)).eval()
    items = [{"input_ids": torch.randint(0, 30, (6,)), "attention_mask": torch.ones(6, dtype=torch.long),
              "sentiment": ["pos", "neg"][i % 2]} for i in range(16)]
    with pytest.raises(ConfigError) as err:
        hookrun.probe(model, items, at=["h.0"], target="sentiment", batch_size=8)
    assert str(err.value) == ("probe.target='sentiment' gives 8 strings ('pos', ...): a probe needs integer classes (or "
                              "float values); map the labels to 0, 1, ... in the data set")
