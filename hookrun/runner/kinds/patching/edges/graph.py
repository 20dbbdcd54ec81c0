"""The residual graph of a transformer: its writers, its readers and which writer feeds which reader.

    graph, wiring = find_graph(model)           # HookedTransformer, HF GPT-2 / NeoX / Llama / Gemma 2...; else one ConfigError
    graph.writers[:3], graph.readers[-1]        # ('embed', 'L0.H0', 'L0.H1'), 'logits'
    graph.mask.sum()                            # the edge count: writer upstream of reader

Nodes as TransformerLens 4.3 names them: writers `embed` (token + position embedding), each head's
own contribution to the residual stream `L{l}.H{h}`, each MLP's output `L{l}.MLP`; readers each
head's query, key and value input `L{l}.H{h}.q|k|v` (before the norm), each MLP's input `L{l}.MLP`
and `logits` (the final norm's input). An edge joins a writer to every reader downstream of it; in a
parallel block (GPT-NeoX) an MLP reads no head of its own layer. With grouped-query attention the
heads are the query heads, each with its own k and v reader (ungrouped, as MIB and TransformerLens'
`ungroup_grouped_query_attention`): the graph is that of the same model without grouping.
Writers and readers come in groups that one hook sees at once (`("attn", l)`: a layer's heads; `("q", l)`: its heads' query inputs):
the wiring (edges/wiring.py) hands each group's tensor `[batch, position, k, d_model]` over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Group = tuple  # ("embed",) | ("attn", l) | ("mlp", l) for writers; ("q"|"k"|"v"|"mlp", l) | ("logits",) for readers


@dataclass(frozen=True)
class Graph:
    n_layers: int
    n_heads: int
    parallel: bool = False
    writers: tuple[str, ...] = field(init=False)
    readers: tuple[str, ...] = field(init=False)
    writer_groups: dict = field(init=False)  # group -> slice of writers
    reader_groups: dict = field(init=False)  # group -> slice of readers
    mask: np.ndarray = field(init=False)  # [writers, readers]: True where the writer feeds the reader

    def __post_init__(self) -> None:
        L, H = self.n_layers, self.n_heads
        writers, wgroups, readers, rgroups = ["embed"], {("embed",): slice(0, 1)}, [], {}
        for layer in range(L):
            for kind in ("q", "k", "v"):
                rgroups[(kind, layer)] = slice(len(readers), len(readers) + H)
                readers += [f"L{layer}.H{h}.{kind}" for h in range(H)]
            rgroups[("mlp", layer)] = slice(len(readers), len(readers) + 1)
            readers.append(f"L{layer}.MLP")
            wgroups[("attn", layer)] = slice(len(writers), len(writers) + H)
            writers += [f"L{layer}.H{h}" for h in range(H)]
            wgroups[("mlp", layer)] = slice(len(writers), len(writers) + 1)
            writers.append(f"L{layer}.MLP")
        rgroups[("logits",)] = slice(len(readers), len(readers) + 1)
        readers.append("logits")
        mask = np.zeros((len(writers), len(readers)), dtype=bool)
        for wg, ws in wgroups.items():
            for rg, rs in rgroups.items():
                mask[ws, rs] = self.feeds(wg, rg)
        for name, value in (("writers", tuple(writers)), ("readers", tuple(readers)), ("writer_groups", wgroups),
                            ("reader_groups", rgroups), ("mask", mask)):
            object.__setattr__(self, name, value)

    def feeds(self, writer: Group, reader: Group) -> bool:
        """Whether a writer group's output reaches a reader group's input through the residual stream."""
        if writer[0] == "embed" or reader[0] == "logits":
            return True
        wl, rl = writer[1], reader[1]
        if writer[0] == "attn" and reader[0] == "mlp" and wl == rl:
            return not self.parallel
        return wl < rl

    @property
    def edges(self) -> int:
        return int(self.mask.sum())

    def layer_of(self, label: str) -> int:
        """The layer a node sits in: embed -1, logits n_layers."""
        if label == "embed":
            return -1
        if label == "logits":
            return self.n_layers
        return int(label.split(".")[0][1:])

    def describe(self) -> dict:
        return {"writers": list(self.writers), "readers": list(self.readers), "n_layers": self.n_layers,
                "n_heads": self.n_heads, "parallel": self.parallel, "edges": self.edges}


def unscored(mask: np.ndarray, scores: np.ndarray, writers, readers, of: str = "its edges") -> str | None:
    """'N of its edges have no finite score, the first W -> R (nan)' for the edges of `mask` whose score in
    `scores` ([writers, readers]) is not a finite number; None where every edge has one. The run's own scores,
    `circuits export` and `faithfulness.from` say it alike."""
    lost = np.argwhere(np.asarray(mask, dtype=bool) & ~np.isfinite(scores))
    if not len(lost):
        return None
    i, j = lost[0]
    return f"{len(lost)} of {of} have no finite score, the first {writers[i]} -> {readers[j]} ({scores[i, j]})"


def find_graph(model, where: str = "patching.graph=auto"):
    """The model's Graph and the Wiring that taps it (edges/wiring.py); a ConfigError naming what is missing."""
    from hookrun.runner.kinds.patching.edges.wiring import find_wiring

    wiring = find_wiring(model, where)
    return Graph(wiring.n_layers, wiring.n_heads, wiring.parallel), wiring
