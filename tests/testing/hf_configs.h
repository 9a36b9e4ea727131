// config.json texts in the shape Hugging Face publishes them for Qwen3-0.6B, gemma-3-1b-it,
// gemma-3-4b-it, Mistral-7B-v0.1 and Llama-3.2-1B: every key of the published file, at small
// sizes (issue 15). worker/weights/model_config_test parses them, and
// tests/integration/hf_config_parity_test runs checkpoints with them against the float64
// reference; hf_configs.cc says where a value differs from the published file and why.
#ifndef CARPOOL_TESTS_TESTING_HF_CONFIGS_H_
#define CARPOOL_TESTS_TESTING_HF_CONFIGS_H_

namespace carpool::testing {

extern const char kHfQwen3Config[];             // Qwen3ForCausalLM
extern const char kHfGemma3Config[];            // Gemma3ForCausalLM
extern const char kHfGemma3MultimodalConfig[];  // Gemma3ForConditionalGeneration
extern const char kHfMistralConfig[];           // MistralForCausalLM
extern const char kHfLlama32Config[];           // LlamaForCausalLM, llama3 RoPE scaling

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_HF_CONFIGS_H_
