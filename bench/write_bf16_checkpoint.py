"""A random Llama of synthetic:small's shapes (vocab 32000, hidden 768, 12 layers, 12 heads,
4 KV heads, intermediate 2048, tied head: ~100M parameters) as a Hugging Face folder with a BF16
model.safetensors, for issue 17's dtype benchmark (bench/dtype_bench.py): the checkpoint dtype
people serve, so the fp32 run converts at load and the bf16 run uses the file in place.

    /usr/bin/python3 bench/write_bf16_checkpoint.py FOLDER [--seed N]

The scale follows carpool's synthetic presets (embedding std 1, every [out, in] matrix std
1/sqrt(in), norms 1 + U(-0.1, 0.1)); values are rounded to bf16 to nearest even.
"""

import argparse
import json
import os
import struct

import numpy as np

VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV_HEADS = 32000, 768, 2048, 12, 12, 4
HEAD_DIM = HIDDEN // HEADS


def to_bf16(a):
    """float32 array -> uint16 bf16 bits, round to nearest even (no NaNs here)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def tensors(seed):
    rng = np.random.default_rng(seed)

    def uniform(shape, std):
        half = np.float32(np.sqrt(3.0) * std)
        return rng.uniform(-half, half, size=shape).astype(np.float32)

    def norm():
        return (1.0 + rng.uniform(-0.1, 0.1, size=HIDDEN)).astype(np.float32)

    yield "model.embed_tokens.weight", uniform((VOCAB, HIDDEN), 1.0)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", norm()
        yield p + "self_attn.q_proj.weight", uniform((HEADS * HEAD_DIM, HIDDEN), HIDDEN ** -0.5)
        yield p + "self_attn.k_proj.weight", uniform((KV_HEADS * HEAD_DIM, HIDDEN), HIDDEN ** -0.5)
        yield p + "self_attn.v_proj.weight", uniform((KV_HEADS * HEAD_DIM, HIDDEN), HIDDEN ** -0.5)
        yield p + "self_attn.o_proj.weight", uniform((HIDDEN, HEADS * HEAD_DIM), HIDDEN ** -0.5)
        yield p + "post_attention_layernorm.weight", norm()
        yield p + "mlp.gate_proj.weight", uniform((INTER, HIDDEN), HIDDEN ** -0.5)
        yield p + "mlp.up_proj.weight", uniform((INTER, HIDDEN), HIDDEN ** -0.5)
        yield p + "mlp.down_proj.weight", uniform((HIDDEN, INTER), INTER ** -0.5)
    yield "model.norm.weight", norm()


def write(folder, seed):
    os.makedirs(folder, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "bfloat16", "hidden_act": "silu",
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    header, blobs, offset = {}, [], 0
    for name, values in tensors(seed):
        blob = to_bf16(values).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(values.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    write(args.folder, args.seed)


if __name__ == "__main__":
    main()
