"""transformers models: built from their config class with random init, or read from a local folder.

    model = hf(model_class="GPT2LMHeadModel", config={"n_layer": 2, "n_embd": 64})
    model = hf(model_class="AutoModelForCausalLM", path="models/my-gpt2")   # a save_pretrained folder

Nothing is downloaded: a config builds a fresh model (seeded by the run's `seed`), and a folder is
read with `local_files_only=True`; a folder that is not there is refused with its path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from torch import nn

from hookrun.config.build import BARS
from hookrun.errors import ConfigError


@contextmanager
def _quiet(transformers_logging: object) -> Iterator[None]:
    """transformers' progress bars off while a model loads, as they were afterwards."""
    if BARS.get() or not transformers_logging.is_progress_bar_enabled():
        yield
        return
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging.enable_progress_bar()


def hf(model_class: str = "GPT2LMHeadModel", config: Mapping | None = None, path: str | None = None,
       attn_implementation: str | None = "eager") -> nn.Module:
    """A transformers model: `model_class` (a class of `transformers`, e.g. GPT2LMHeadModel,
    BertModel, LlamaForCausalLM, AutoModelForCausalLM with `path`) from `config` (the config
    class's arguments) or from the local folder `path`."""
    try:
        import transformers
    except ImportError:
        raise ConfigError("model=hf needs transformers: pip install 'hookrun[hf]'") from None
    cls = getattr(transformers, str(model_class), None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise ConfigError(f"model.model_class: transformers has no model class {model_class!r} "
                          f"(e.g. GPT2LMHeadModel, BertModel, LlamaForCausalLM, T5ForConditionalGeneration)")
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if path:
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"model.path: no folder {str(folder)!r} (a folder written by save_pretrained, "
                              f"with config.json and the weights)")
        _check_model_type(cls, folder)
        try:
            with _quiet(transformers.utils.logging):
                return cls.from_pretrained(str(folder), local_files_only=True, **extra)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.path: {str(folder)!r} cannot be read as {model_class}: {str(exc).splitlines()[0]}") from None
    config_class = getattr(cls, "config_class", None)
    if config_class is None or config_class is transformers.PretrainedConfig:
        raise ConfigError(f"model.model_class={model_class} needs model.path=DIR (an Auto class has no config of its "
                          f"own); for a random-init model name a concrete class such as GPT2LMHeadModel")
    try:
        cfg = config_class(**dict(config or {}))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model.config: {config_class.__name__} refused it: {exc}") from None
    try:
        return cls._from_config(cfg, **extra)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model.config: building {model_class} failed: {str(exc).splitlines()[0]}") from None


def _check_model_type(cls: type, folder: Path) -> None:
    """A concrete class must be of the folder's model type: transformers built a gpt2 folder as a random-init
    BertModel of BERT's default size (or a 7B LLaMA) with a warning, and the run went on over random weights."""
    import json

    want = getattr(getattr(cls, "config_class", None), "model_type", "")
    try:
        saved = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return  # (from_pretrained says what is wrong with the folder)
    got = saved.get("model_type") if isinstance(saved, dict) else None
    if want and isinstance(got, str) and got and got != want:
        arch = [a for a in saved.get("architectures") or [] if isinstance(a, str)]
        raise ConfigError(f"model.path: {str(folder)!r} holds a {got} model (config.json model_type), and "
                          f"model.model_class={cls.__name__} builds {want}; give model.model_class="
                          f"{arch[0] if arch else 'AutoModel'} (or an Auto class such as AutoModelForCausalLM)")
