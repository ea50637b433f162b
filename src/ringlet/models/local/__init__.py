"""`local:<name-or-path.gguf>`: a GGUF model in process through llama.cpp (`llama-cpp-python`), one module per
part: `model` (`LocalModel`, the provider), `prompt` (the prompt and its GBNF grammars), `examples` (the worked
turns and routing contexts), `route` (the noisy-channel router between answering and each tool) and `decode`
(sampling under a grammar, the KV-cache snapshots, the repeat guard).
"""

from ringlet.models.local.model import LocalModel, model_path, schema_grammar

__all__ = ["LocalModel", "model_path", "schema_grammar"]
