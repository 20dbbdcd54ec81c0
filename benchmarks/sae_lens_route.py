"""SAELens' side of benchmarks/cache_peers.py, run in a venv of its own (sae-lens pins TransformerLens 3):
its own CacheActivationsRunner, over a TransformerLens 3 HookedTransformer that holds the weights of
the benchmark's GPT-2 (converted by TransformerLens' own `convert_gpt2_weights`, not processed), and
the benchmark's token ids as a pre-tokenized `datasets.Dataset` (`override_dataset`). The runner
loads its model by name; here `load_model` hands it that HookedTransformer instead (nothing is
downloaded), which is the only change to SAELens' code path.
"""

from __future__ import annotations

from pathlib import Path

import torch


def hooked_gpt2(hf_model: torch.nn.Module, seq: int):
    """A HookedTransformer with the HF GPT-2's shape and weights (no LayerNorm folding, no centering)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    c = hf_model.config
    device = next(hf_model.parameters()).device
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head, d_mlp=4 * c.n_embd,
        n_ctx=seq, d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN", eps=c.layer_norm_epsilon,
        positional_embedding_type="standard", default_prepend_bos=False, device=str(device),
        original_architecture="GPT2LMHeadModel")
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(convert_gpt2_weights(hf_model, cfg), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=False)
    import sae_lens.cache_activations_runner as runner_module

    runner_module.load_model = lambda **kwargs: model  # the runner's only way in for a model built here
    return model.eval()


def token_dataset(ids: torch.Tensor):
    """The token ids as the pre-tokenized dataset SAELens reads (an `input_ids` column)."""
    import datasets

    datasets.disable_progress_bars()
    return datasets.Dataset.from_dict({"input_ids": ids.numpy()})


def cache_with_runner(ds, n_seq: int, seq: int, hook_name: str, d_in: int, batch: int, shard_batches: int, device: str,
                      out: Path) -> None:
    """SAELens' CacheActivationsRunner over `ds`, one Arrow shard per `shard_batches` batches, in order."""
    from sae_lens.cache_activations_runner import CacheActivationsRunner
    from sae_lens.config import CacheActivationsRunnerConfig

    tokens_per_shard = shard_batches * batch * seq
    cfg = CacheActivationsRunnerConfig(
        dataset_path="hookrun-bench/tokens", model_name="gpt2-random-init", model_batch_size=batch, hook_name=hook_name,
        d_in=d_in, training_tokens=n_seq * seq, context_size=seq, new_cached_activations_path=str(out), shuffle=False,
        dtype="float32", device=device, buffer_size_gb=(tokens_per_shard * d_in * 4 + 512) / 1e9, prepend_bos=False,
        streaming=False)
    if cfg.n_batches_in_buffer != shard_batches or cfg.n_buffers * shard_batches * batch != n_seq:
        raise RuntimeError(f"SAELens would run {cfg.n_buffers} x {cfg.n_batches_in_buffer} batches, not {n_seq // batch}")
    CacheActivationsRunner(cfg, override_dataset=ds).run()


def read_first(out: Path, hook_name: str, batch: int) -> torch.Tensor:
    """The first `batch` sequences' activations from the runner's Arrow folder: (batch, seq, d_in)."""
    import datasets

    return datasets.load_from_disk(str(out)).with_format("torch")[:batch][hook_name]
