"""Sparse autoencoders, read from disk: SAELens, sparsify and dictionary_learning folders into one
`SparseCoder`, any other module as a `ModuleCoder`, and the statistics of a splice (L0, MSE,
explained variance, dead latents). No torch hooks here: `op: splice` (hooks/splice.py) puts a
coder into the forward.

    from hookrun.sae import load_sae
    sae = load_sae("saes/h3")                 # sae.encode(x), sae.decode(f), sae.directions
"""

from hookrun.sae.coder import SparseCoder
from hookrun.sae.module_coder import ModuleCoder, load_module
from hookrun.sae.readers import load_sae

__all__ = ["ModuleCoder", "SparseCoder", "load_module", "load_sae"]
