"""Tiny eager-attention transformers and the tests' own op-site reference, for the op-site tests.

    model, batch = gpt2(), padded_batch()        # GPT-2, LLaMA and BERT: eager attention, a padded sample
    with torch.no_grad(), OwnCalls(model) as ref:
        model(**batch)
    ref.first["transformer.h.0.attn/softmax.0"]  # what that call returned (a copy)

OwnCalls is written here, independently of hookrun: a TorchFunctionMode over the whole forward,
global module hooks keeping the stack of running modules, each call attributed to the innermost
one and numbered per FN within each call of that module.
"""

from __future__ import annotations

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from toy_lm import tiny_gpt2

VOCAB, BATCH, TOKENS = 50, 3, 8
OPERATORS = {"__add__": "add", "__radd__": "add", "__iadd__": "add_", "__mul__": "mul", "__rmul__": "mul",
             "__matmul__": "matmul", "__truediv__": "div", "__sub__": "sub"}


def _eager(cls, cfg):
    torch.manual_seed(0)
    return cls._from_config(cfg, attn_implementation="eager").eval()


def gpt2(n_layer: int = 2, vocab: int = VOCAB):
    return tiny_gpt2(0, "eager", n_layer=n_layer, n_embd=32, n_head=4, n_positions=16, vocab_size=vocab,
                     bos_token_id=0, eos_token_id=0, pad_token_id=None)


def llama():
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return _eager(transformers.LlamaForCausalLM, cfg)


def bert():
    import transformers

    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=32, pad_token_id=0)
    return _eager(transformers.BertModel, cfg)


def padded_batch(side: str = "right") -> dict[str, torch.Tensor]:
    """BATCH samples of TOKENS ids; sample 0 has 3 padding positions, sample 1 one (on `side`)."""
    ids = torch.randint(3, VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(BATCH, TOKENS, dtype=torch.long)
    for i, pad in ((0, 3), (1, 1)):
        if side == "right":
            mask[i, TOKENS - pad:] = 0
        else:
            mask[i, :pad] = 0
        ids[i][mask[i] == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


class OwnCalls(TorchFunctionMode):
    """Every torch call of the forwards run inside the block, as (MODULE/FN.k, result copy) in call order."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.names = {m: n for n, m in model.named_modules()}
        self.stack: list[tuple[str, dict]] = []  # (module name, FN -> calls so far in this call of it)
        self.calls: list[tuple[str, object]] = []
        self.handles: list = []

    @property
    def first(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for name, value in self.calls:
            out.setdefault(name, value)
        return out

    def __enter__(self):
        def push(module, args):
            if module in self.names:
                self.stack.append((self.names[module], {}))

        def pop(module, args, output):
            if module in self.names:
                self.stack.pop()

        self.handles = [register_module_forward_pre_hook(push), register_module_forward_hook(pop)]
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if self.stack and name and name != "__get__":
            module, counts = self.stack[-1]
            fn = OPERATORS.get(name, name)
            k = counts.get(fn, 0)
            counts[fn] = k + 1
            self.calls.append((f"{module}/{fn}.{k}", out.detach().clone() if isinstance(out, torch.Tensor) else out))
        return out
