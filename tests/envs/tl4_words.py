"""The word-level tokenizer the TL 4.3 bridge scripts save beside their random-init models (run in the TL 4.3
venv: this folder is the scripts' own, first on their path).

    save_word_tokenizer(folder, 40)   # w0 .. w38 and <unk>; pad w0, eos w1
"""

import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers


def save_word_tokenizer(folder: str, vocab: int) -> None:
    """`vocab` words, w0 .. w{vocab-2} and <unk>, split on whitespace (pad w0, eos w1), saved in `folder`."""
    words = [f"w{i}" for i in range(vocab - 1)] + ["<unk>"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tf.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="w0", eos_token="w1").save_pretrained(folder)
