"""The SAE readers' former place, kept so that code written against it (and docs/sae.md before
the move) still imports; they live in hookrun.sae.

    from hookrun.hooks.sae import load_sae    # the same function as hookrun.sae.load_sae
"""

from hookrun.sae import ModuleCoder, SparseCoder, load_module, load_sae
from hookrun.sae.readers import check_finite_weights

__all__ = ["ModuleCoder", "SparseCoder", "check_finite_weights", "load_module", "load_sae"]
