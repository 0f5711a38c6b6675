"""A Llama-family config.json (Hugging Face's keys, model_type "llama") as a LlamaShape, every
value checked before anything is planned; nothing is downloaded.

    hidden_size, intermediate_size, num_attention_heads, num_key_value_heads (default: the
    heads, plain multi-head attention), num_hidden_layers, vocab_size, max_position_embeddings
    (the sequence planned), tie_word_embeddings (default false), hidden_act (silu: SwiGLU)

What the step models do not depend on (rope_theta, rope_scaling, rms_norm_eps, the token ids)
is read by no one. A layer the models do not know (a mixture of experts, a sliding window, an
activation other than SiLU, biases) is refused in one line.
"""

from __future__ import annotations

from ckptlab.cli.report import UsageError
from ckptlab.cluster.llama_layer import LlamaShape

KNOWN = ("gpt2", "llama")  # the layers modeled: GPT-2's and Llama's


def _int(cfg: dict, key: str, path, default=None) -> int:
    x = cfg.get(key, default)
    if x is None:
        raise UsageError(f"--hf-config: no {key!r} in {path}")
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise UsageError(f"--hf-config {path}: {key} must be a positive integer, got {x!r}")
    return x


def refuse_unknown(cfg: dict) -> None:
    """UsageError for a model_type whose layer is not modeled."""
    kind = cfg.get("model_type")
    if kind not in (None, *KNOWN):
        raise UsageError(f"--hf-config: model_type {kind!r}: only GPT-2's layer (4h GeLU MLP, "
                         "LayerNorm) and Llama's (grouped-query attention, RoPE, SwiGLU, "
                         "RMSNorm) are modeled")


def llama_config(cfg: dict, path) -> LlamaShape:
    """The LlamaShape of a config.json's settings (module docstring)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UsageError(f"--hf-config {path}: hidden_act {act!r}: only SwiGLU (silu) is "
                         "modeled in a Llama layer")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise UsageError(f"--hf-config {path}: {key} is true: biases in a Llama layer are "
                             "not modeled")
    for key in ("num_local_experts", "num_experts", "sliding_window"):
        if cfg.get(key):
            raise UsageError(f"--hf-config {path}: {key} = {cfg[key]!r}: not a Llama layer "
                             "the planner models")
    L, h = _int(cfg, "num_hidden_layers", path), _int(cfg, "hidden_size", path)
    a, f = _int(cfg, "num_attention_heads", path), _int(cfg, "intermediate_size", path)
    kv = _int(cfg, "num_key_value_heads", path, a)
    s, V = _int(cfg, "max_position_embeddings", path), _int(cfg, "vocab_size", path)
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise UsageError(f"--hf-config {path}: tie_word_embeddings must be true or false, got "
                         f"{tied!r}")
    if h % a:
        raise UsageError(f"--hf-config {path}: num_attention_heads = {a} must divide "
                         f"hidden_size = {h}")
    if a % kv:
        raise UsageError(f"--hf-config {path}: num_key_value_heads = {kv} must divide "
                         f"num_attention_heads = {a}")
    return LlamaShape(L, h, a, kv, f, s, V, tied=tied)
