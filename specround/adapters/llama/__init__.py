"""A compact Llama-family decoder in torch, loaded from GGUF, as a target model with per-request K/V.

Modules, one job each: :mod:`.config` (hyper-parameters), :mod:`.weights` (tensors, random and
reduced-precision copies), :mod:`.gguf_loader` (GGUF parsing and dequantisation), :mod:`.store` (start-up
cache), :mod:`.tokenizer` and :mod:`.chat` (text), :mod:`.model` (the forward), :mod:`.kv_cache` and
:mod:`.packed` (per-request rows and packed attention), :mod:`.target` (the target-model port),
:mod:`.loader` (putting it together).
"""

from specround.adapters.llama.chat import ChatTemplate
from specround.adapters.llama.config import LlamaConfig
from specround.adapters.llama.gguf_loader import default_gguf_path, read_gguf
from specround.adapters.llama.loader import LlamaBundle, load_llama, tiny_llama
from specround.adapters.llama.model import LlamaModel
from specround.adapters.llama.target import LlamaTarget
from specround.adapters.llama.tokenizer import LlamaTokenizer
from specround.adapters.llama.weights import LlamaWeights, random_weights

__all__ = [
    "ChatTemplate",
    "LlamaBundle",
    "LlamaConfig",
    "LlamaModel",
    "LlamaTarget",
    "LlamaTokenizer",
    "LlamaWeights",
    "default_gguf_path",
    "load_llama",
    "random_weights",
    "read_gguf",
    "tiny_llama",
]
