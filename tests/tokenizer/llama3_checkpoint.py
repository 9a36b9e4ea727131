"""A tiny random Llama with Llama 3's vocabulary, as a Hugging Face folder, for the cluster text
test (cluster_text.py): config.json, model.safetensors (F32) and the real Llama 3 tokenizer.json
and tokenizer_config.json copied beside them.

The weights follow the scale of carpool's synthetic presets (worker/weights/synthetic.cc, an
untied head): the embedding has std 1 and every [out, in] matrix std 1/sqrt(in), so greedy
decoding wanders over the vocabulary instead of repeating one token. One planted row makes a
special token reachable: lm_head[special_id] is a multiple of embed[trigger_id], so right after
the token `trigger_id` greedy decoding emits `special_id` (the residual stream still carries the
current token's embedding), which gives skip_special_tokens something to act on.
"""

import json
import os
import shutil
import struct

import numpy as np

VOCAB_SIZE = 128256  # Llama 3: 128,000 BPE tokens and 256 special ones
HIDDEN = 64
INTERMEDIATE = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
MAX_POSITIONS = 2048
BOS_ID = 128000  # <|begin_of_text|>
EOS_IDS = [128001, 128009]  # <|end_of_text|>, <|eot_id|>


def _uniform(rng, shape, std):
    half = np.float32(np.sqrt(3.0) * std)
    return rng.uniform(-half, half, size=shape).astype(np.float32)


def _norm(rng, size):
    return (1.0 + rng.uniform(-0.1, 0.1, size=size)).astype(np.float32)


def tensors(seed, trigger_id, special_id, boost=0.2):
    """Hugging Face tensor name -> float32 array, in file order."""
    rng = np.random.default_rng(seed)
    out = {}
    embed = _uniform(rng, (VOCAB_SIZE, HIDDEN), 1.0)
    out["model.embed_tokens.weight"] = embed
    q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        out[p + "input_layernorm.weight"] = _norm(rng, HIDDEN)
        out[p + "self_attn.q_proj.weight"] = _uniform(rng, (q_dim, HIDDEN), HIDDEN ** -0.5)
        out[p + "self_attn.k_proj.weight"] = _uniform(rng, (kv_dim, HIDDEN), HIDDEN ** -0.5)
        out[p + "self_attn.v_proj.weight"] = _uniform(rng, (kv_dim, HIDDEN), HIDDEN ** -0.5)
        out[p + "self_attn.o_proj.weight"] = _uniform(rng, (HIDDEN, q_dim), q_dim ** -0.5)
        out[p + "post_attention_layernorm.weight"] = _norm(rng, HIDDEN)
        out[p + "mlp.gate_proj.weight"] = _uniform(rng, (INTERMEDIATE, HIDDEN), HIDDEN ** -0.5)
        out[p + "mlp.up_proj.weight"] = _uniform(rng, (INTERMEDIATE, HIDDEN), HIDDEN ** -0.5)
        out[p + "mlp.down_proj.weight"] = _uniform(rng, (HIDDEN, INTERMEDIATE),
                                                   INTERMEDIATE ** -0.5)
    out["model.norm.weight"] = _norm(rng, HIDDEN)
    head = _uniform(rng, (VOCAB_SIZE, HIDDEN), HIDDEN ** -0.5)
    head[special_id] = boost * embed[trigger_id]
    out["lm_head.weight"] = head
    return out


def config_json():
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": None,
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_IDS,
        "torch_dtype": "float32",
    }


def write_safetensors(path, named):
    """A safetensors file of float32 arrays, the header padded with spaces to 8 bytes."""
    header, offset = {}, 0
    for name, array in named.items():
        size = array.size * 4
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for array in named.values():
            f.write(np.ascontiguousarray(array, dtype="<f4").tobytes())


def write(folder, tokenizer_dir, trigger_id, special_id, seed=13):
    """Writes the checkpoint into `folder` (created), with tokenizer.json and
    tokenizer_config.json copied from `tokenizer_dir`."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config_json(), f, indent=2)
    write_safetensors(os.path.join(folder, "model.safetensors"),
                      tensors(seed, trigger_id, special_id))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(folder, name))
    return folder
