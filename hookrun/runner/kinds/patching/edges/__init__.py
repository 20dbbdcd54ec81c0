"""Edges of the residual graph: EAP, EAP-IG, atp_ig's gradients and faithfulness (docs/edges.md).

| module           | what                                                                            |
|------------------|---------------------------------------------------------------------------------|
| graph.py         | Graph: writers, readers, which feeds which (a value object); find_graph          |
| wiring.py        | taps on a model: writers' contributions, readers' inputs, the token embedding     |
| hf_layout.py     | where an HF Llama / Mistral / Qwen2 / Gemma 2 keeps its graph's modules, or refused |
| spec.py          | the block's graph / ig_steps / faithfulness keys, checked                       |
| eap.py           | one batched gradient pass over m interpolated runs: edge scores, atp_ig's grads  |
| mib.py           | MIB's circuits at fractions of the edges (top-n, pruned), CPR and CMD areas      |
| formats.py       | EAP-IG's graph JSON and MIB's submission folder, written and read               |
| command.py       | `python -m hookrun.circuits export|score`: those files from a run, a circuit scored |
| run.py           | an edges run: the checks before any forward, the scores, its meta; faithfulness: top-k circuits, every other edge ablated exactly, several k in one forward |
"""
