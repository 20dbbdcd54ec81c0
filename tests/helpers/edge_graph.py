"""The edge tests' set-up, written from the definitions (no hookrun code): prompt pairs whose corruption
changes one token, and the graph of a transformer with split q/k/v readers: its writers and readers in
hookrun's order, and which writer feeds which reader (the residual stream's layer rules).

    items = prompt_pairs(40, 6, seed=1, at=2, shift=7)   # 3 x {"clean", "corrupt", "answer", "wrong"}
    writers, readers = graph_labels(n_layers=2, n_heads=4)
    feeds("L0.H1", "L1.H2.q"), feeds("L0.H1", "L0.MLP"), feeds("L0.MLP", "L0.MLP")   # True, True, False
"""

from __future__ import annotations

import torch


def prompt_pairs(vocab: int, length: int, *, seed: int, at: int, shift: int, n: int = 3,
                 clean: str = "clean") -> list[dict]:
    """n random prompts (a torch.Generator seeded `seed`) and their corruptions, whose token `at` moves
    `shift` places round the vocabulary; the answer and the wrong answer are that token, clean and corrupt."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        c = torch.randint(0, vocab, (length,), generator=g)
        k = c.clone()
        k[at] = (k[at] + shift) % vocab
        out.append({clean: c, "corrupt": k, "answer": int(c[at]), "wrong": int(k[at])})
    return out


def graph_labels(n_layers: int, n_heads: int) -> tuple[list[str], list[str]]:
    """(writers, readers): the embedding, each layer's heads and MLP; each head's q, k and v inputs, each
    MLP's input, and the logits."""
    writers, readers = ["embed"], []
    for layer in range(n_layers):
        readers += [f"L{layer}.H{h}.{k}" for k in "qkv" for h in range(n_heads)] + [f"L{layer}.MLP"]
        writers += [f"L{layer}.H{h}" for h in range(n_heads)] + [f"L{layer}.MLP"]
    return writers, readers + ["logits"]


def feeds(w: str, r: str) -> bool:
    """Whether writer w's output reaches reader r's input: the embedding feeds every reader and every
    writer the logits; otherwise an earlier layer feeds a later one, and a layer's heads its own MLP."""
    if w == "embed" or r == "logits":
        return True
    wl, rl = int(w.split(".")[0][1:]), int(r.split(".")[0][1:])
    return wl < rl or (wl == rl and not w.endswith(".MLP") and r.endswith(".MLP"))


def as_mib_model(monkeypatch, run_path, model: str = "gpt2") -> None:
    """Let `circuits export --format mib --model MODEL` take this (tiny) run as that model: MIB_SHAPES[model] set to
    the run's own graph shape, for tests of the folder's names and contents, not of the shape check."""
    import json

    import hookrun
    from hookrun.runner.kinds.patching.edges import formats

    with hookrun.open_run(run_path) as run:
        meta = json.loads(run.attrs["patching"])
    g = meta["graph"]
    monkeypatch.setitem(formats.MIB_SHAPES, model, (int(g["n_layers"]), int(g["n_heads"]), meta.get("d_model")))
