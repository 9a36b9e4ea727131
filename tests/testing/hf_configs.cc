#include "tests/testing/hf_configs.h"

namespace carpool::testing {

// Qwen3-0.6B: head_dim 128 with 16 heads of a 1024 hidden size; here 4 heads of 32 over 64.
const char kHfQwen3Config[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 298,
  "eos_token_id": 299,
  "head_dim": 32,
  "hidden_act": "silu",
  "hidden_size": 64,
  "initializer_range": 0.02,
  "intermediate_size": 192,
  "max_position_embeddings": 40960,
  "max_window_layers": 3,
  "model_type": "qwen3",
  "num_attention_heads": 4,
  "num_hidden_layers": 3,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 300
})";

// gemma-3-1b-it: 4 heads of 256 over one key/value head, hidden 1152, a local:global pattern
// of 6 over 26 layers. Here hidden 96 (its sqrt rounds in bfloat16), heads of 32, a pattern of
// 3 over 4 layers (local, local, global, local) and a window of 8. query_pre_attn_scalar keeps
// the published 256, so it differs from head_dim.
const char kHfGemma3Config[] = R"({
  "architectures": ["Gemma3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": null,
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "eos_token_id": [1, 106],
  "final_logit_softcapping": null,
  "head_dim": 32,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 96,
  "initializer_range": 0.02,
  "intermediate_size": 192,
  "max_position_embeddings": 32768,
  "model_type": "gemma3_text",
  "num_attention_heads": 4,
  "num_hidden_layers": 4,
  "num_key_value_heads": 1,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": 8,
  "sliding_window_pattern": 3,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0",
  "use_cache": true,
  "vocab_size": 300
})";

// gemma-3-4b-it: text_config gives only hidden_size, intermediate_size, num_hidden_layers,
// rope_scaling and sliding_window, the rest is Gemma3TextConfig's defaults: vocabulary 262208,
// 8 heads of 256 over 4 key/value heads, query_pre_attn_scalar 256, a pattern of 6, RoPE bases
// 1e6 and 1e4, tied. Here hidden 80 and 6 layers (5 local, then a global one), a window of 8.
const char kHfGemma3MultimodalConfig[] = R"({
  "architectures": ["Gemma3ForConditionalGeneration"],
  "boi_token_index": 255999,
  "eoi_token_index": 256000,
  "eos_token_id": [1, 106],
  "image_token_index": 262144,
  "initializer_range": 0.02,
  "mm_tokens_per_image": 256,
  "model_type": "gemma3",
  "text_config": {
    "hidden_size": 80,
    "intermediate_size": 160,
    "model_type": "gemma3_text",
    "num_hidden_layers": 6,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 8
  },
  "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0",
  "vision_config": {
    "hidden_size": 1152,
    "image_size": 896,
    "intermediate_size": 4304,
    "model_type": "siglip_vision_model",
    "num_attention_heads": 16,
    "num_hidden_layers": 27,
    "patch_size": 14,
    "vision_use_head": false
  }
})";

// Mistral-7B-v0.1: no head_dim key (hidden / heads), every layer slides (4096 published).
const char kHfMistralConfig[] = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 64,
  "initializer_range": 0.02,
  "intermediate_size": 224,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 4,
  "num_hidden_layers": 3,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 8,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 300
})";

// Llama-3.2-1B: llama3 RoPE scaling. Its original_max_position_embeddings is 8192; here 64, so
// that the rule's three bands (kept, smoothed, divided by the factor) all fall among head_dim
// 16's frequencies at theta 500000 and change positions the parity test's prompts reach.
const char kHfLlama32Config[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 296,
  "eos_token_id": 297,
  "head_dim": 16,
  "hidden_act": "silu",
  "hidden_size": 64,
  "initializer_range": 0.02,
  "intermediate_size": 256,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 64,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 300
})";

}  // namespace carpool::testing
