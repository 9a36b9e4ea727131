// ParseModelConfig on configs in the shape Hugging Face publishes them (every key of
// Qwen3-0.6B, gemma-3-1b-it, gemma-3-4b-it, Mistral-7B-v0.1 and Llama-3.2-1B at small sizes,
// the texts tests/testing/hf_configs.h shares with the parity test), transformers' newer
// rope_parameters, and the keys carpool refuses.
#include "worker/weights/model_config.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/hf_configs.h"

namespace carpool::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The published shapes (tests/testing/hf_configs.cc), under short names.
constexpr const char* kQwen3 = testing::kHfQwen3Config;
constexpr const char* kGemma3 = testing::kHfGemma3Config;
constexpr const char* kGemma3Multimodal = testing::kHfGemma3MultimodalConfig;
constexpr const char* kMistral = testing::kHfMistralConfig;
constexpr const char* kLlama32 = testing::kHfLlama32Config;

ModelConfig Parse(const std::string& json) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(json);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ModelConfig{};
}

// `json` with the top-level `key` set to `value` (JSON text), added where it is not there.
std::string With(const std::string& json, const std::string& key, const std::string& value) {
  nlohmann::json patched = nlohmann::json::parse(json);
  patched[key] = nlohmann::json::parse(value);
  return patched.dump();
}

// `json` without the top-level `key`.
std::string Without(const std::string& json, const std::string& key) {
  nlohmann::json patched = nlohmann::json::parse(json);
  EXPECT_EQ(patched.erase(key), 1u) << key;
  return patched.dump();
}

TEST(PublishedConfigsTest, Qwen3) {
  const ModelConfig c = Parse(kQwen3);
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 32);  // not hidden_size / heads = 16
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.norm_weight_plus_one);
  EXPECT_FALSE(c.sandwich_norms);
  EXPECT_EQ(c.hidden_activation, Activation::kSilu);
  EXPECT_EQ(c.embedding_multiplier, 1.0f);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 298);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(299));
  EXPECT_EQ(c.query_pre_attn_scalar, 0.0);
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_EQ(c.final_logit_softcapping, 0.0);
  // Qwen3Config's head_dim default is 128, not hidden_size / heads.
  std::string no_head_dim = With(kQwen3, "head_dim", "null");
  EXPECT_EQ(Parse(no_head_dim).head_dim, 128);
  EXPECT_EQ(Parse(With(kQwen3, "model_type", "\"qwen3\"")).architecture, "Qwen3ForCausalLM");
}

TEST(PublishedConfigsTest, Gemma3) {
  const ModelConfig c = Parse(kGemma3);
  EXPECT_EQ(c.architecture, "Gemma3ForCausalLM");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.norm_weight_plus_one);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_EQ(c.hidden_activation, Activation::kGeluTanh);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_DOUBLE_EQ(c.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_EQ(c.final_logit_softcapping, 0.0);
  EXPECT_EQ(c.sliding_window, 8);
  // Layer i is global when (i + 1) % 3 == 0.
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, true, false, true}));
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rope_local_theta, 1e4);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);  // Gemma3TextConfig's default
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(1, 106));
  // sqrt(96) = 9.798...: a float32, cast to bfloat16 (8 significant bits, steps of 1/16
  // between 8 and 16) gives 9.8125, to float16 (steps of 1/128) 9.796875.
  EXPECT_EQ(c.embedding_multiplier, 9.8125f);
  EXPECT_EQ(Parse(With(kGemma3, "torch_dtype", "\"float16\"")).embedding_multiplier, 9.796875f);
  EXPECT_EQ(Parse(With(kGemma3, "torch_dtype", "\"float32\"")).embedding_multiplier,
            static_cast<float>(std::sqrt(96.0)));
  // transformers >= 4.56 writes "dtype".
  const std::string dtype = With(Without(kGemma3, "torch_dtype"), "dtype", "\"float16\"");
  EXPECT_EQ(Parse(dtype).embedding_multiplier, 9.796875f);
  // Softcapping when set.
  const ModelConfig capped = Parse(
      With(With(kGemma3, "attn_logit_softcapping", "50.0"), "final_logit_softcapping", "30.0"));
  EXPECT_DOUBLE_EQ(capped.attn_logit_softcapping, 50.0);
  EXPECT_DOUBLE_EQ(capped.final_logit_softcapping, 30.0);
  EXPECT_EQ(Parse(With(kGemma3, "model_type", "\"gemma3_text\"")).architecture,
            "Gemma3ForCausalLM");
}

TEST(PublishedConfigsTest, Gemma3LayerTypesOverrideThePattern) {
  const ModelConfig c = Parse(With(kGemma3, "layer_types",
                                   R"(["full_attention", "sliding_attention", "sliding_attention",
                                       "full_attention"])"));
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(Parse(With(kGemma3, "sliding_window_pattern", "2")).layer_sliding,
            (std::vector<bool>{true, false, true, false}));
}

TEST(PublishedConfigsTest, Gemma3ForConditionalGenerationUsesTextConfigAndItsDefaults) {
  const ModelConfig c = Parse(kGemma3Multimodal);
  EXPECT_EQ(c.architecture, "Gemma3ForCausalLM");  // the language model is what carpool runs
  EXPECT_EQ(c.hidden_size, 80);
  EXPECT_EQ(c.intermediate_size, 160);
  EXPECT_EQ(c.num_layers, 6);
  // Gemma3TextConfig's defaults for what text_config leaves out.
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_DOUBLE_EQ(c.query_pre_attn_scalar, 256.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rope_local_theta, 1e4);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(1, 106));  // from the outer config
  EXPECT_EQ(c.sliding_window, 8);
  ASSERT_EQ(c.layer_sliding.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.layer_sliding[i], (i + 1) % 6 != 0) << i;
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  // sqrt(80) = 8.944...; bfloat16 from the outer torch_dtype: 8.9375.
  EXPECT_EQ(c.embedding_multiplier, 8.9375f);
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_EQ(c.final_logit_softcapping, 0.0);
}

TEST(PublishedConfigsTest, Mistral) {
  const ModelConfig c = Parse(kMistral);
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_TRUE(c.layer_sliding.empty());  // every layer
  EXPECT_TRUE(LayerSlides(c, 0) && LayerSlides(c, 1) && LayerSlides(c, 2));
  EXPECT_FALSE(c.qk_norm || c.norm_weight_plus_one || c.sandwich_norms);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  // v0.2+ publish null: no window. Absent: MistralConfig's default, 4096.
  EXPECT_EQ(Parse(With(kMistral, "sliding_window", "null")).sliding_window, 0);
  EXPECT_EQ(Parse(Without(kMistral, "sliding_window")).sliding_window, 4096);
}

TEST(PublishedConfigsTest, Llama32) {
  const ModelConfig c = Parse(kLlama32);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.qk_norm || c.norm_weight_plus_one || c.sandwich_norms);
  EXPECT_EQ(c.embedding_multiplier, 1.0f);
}

// --- transformers' rope_parameters ----------------------------------------------------------

TEST(RopeParametersTest, FlatObjectReplacesRopeThetaAndRopeScaling) {
  std::string json = With(kLlama32, "rope_scaling", "null");
  json = With(json, "rope_theta", "10.0");
  json = With(json, "rope_parameters", R"({"factor": 32.0, "high_freq_factor": 4.0,
      "low_freq_factor": 1.0, "original_max_position_embeddings": 64,
      "rope_theta": 500000.0, "rope_type": "llama3"})");
  const ModelConfig newer = Parse(json);
  const ModelConfig older = Parse(kLlama32);
  EXPECT_DOUBLE_EQ(newer.rope_theta, 500000.0);
  EXPECT_EQ(newer.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(RopeInvFreq(newer), RopeInvFreq(older));
  const ModelConfig plain =
      Parse(With(kQwen3, "rope_parameters", R"({"rope_theta": 5000.0, "rope_type": "default"})"));
  EXPECT_DOUBLE_EQ(plain.rope_theta, 5000.0);
  EXPECT_EQ(plain.rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(RopeParametersTest, Gemma3PerLayerType) {
  std::string json = kGemma3;
  for (const char* key : {"rope_local_base_freq", "rope_scaling", "rope_theta"}) {
    json = Without(json, key);
  }
  json = With(json, "rope_parameters", R"({
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
      "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}})");
  const ModelConfig c = Parse(json);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_local_theta, 20000.0);

  // The older keys describe the same model.
  const ModelConfig older = Parse(With(With(kGemma3, "rope_local_base_freq", "20000"),
                                       "rope_scaling", R"({"rope_type": "linear", "factor": 8})"));
  EXPECT_EQ(RopeInvFreq(c), RopeInvFreq(older));
  EXPECT_EQ(LocalRopeInvFreq(c), LocalRopeInvFreq(older));
}

TEST(RopeParametersTest, LocalRopeIsUnscaledAtTheLocalBase) {
  const ModelConfig gemma =
      Parse(With(kGemma3, "rope_scaling", R"({"rope_type": "linear", "factor": 8})"));
  const std::vector<float> local = LocalRopeInvFreq(gemma);
  const std::vector<float> global = RopeInvFreq(gemma);
  ASSERT_EQ(local.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(local[i], static_cast<float>(1.0 / std::pow(1e4, 2.0 * i / 32))) << i;
    EXPECT_EQ(global[i], static_cast<float>(1.0 / std::pow(1e6, 2.0 * i / 32) / 8.0)) << i;
  }
  // Families without a local base use the global RoPE everywhere.
  const ModelConfig mistral = Parse(kMistral);
  EXPECT_EQ(LocalRopeInvFreq(mistral), RopeInvFreq(mistral));
}

// --- Refusals -------------------------------------------------------------------------------

struct Refusal {
  const char* base;
  const char* key;
  const char* value;
  const char* named;  // what the message must contain
};

TEST(RefusedKeysTest, EachRefusalNamesItsKey) {
  const Refusal cases[] = {
      {kLlama32, "rope_scaling", R"({"rope_type": "yarn", "factor": 4.0})", "'rope_scaling'"},
      {kLlama32, "rope_scaling", R"({"type": "dynamic", "factor": 2.0})", "dynamic"},
      {kQwen3, "rope_parameters", R"({"rope_type": "longrope", "factor": 2.0})",
       "'rope_parameters'"},
      {kLlama32, "rope_parameters", R"({"full_attention": {"rope_type": "default"}})",
       "'rope_parameters'"},
      {kGemma3, "rope_parameters", R"({"full_attention": {"rope_type": "yarn", "factor": 2.0}})",
       "'rope_parameters.full_attention'"},
      {kGemma3, "rope_parameters",
       R"({"sliding_attention": {"rope_type": "linear", "factor": 2.0}})",
       "'rope_parameters.sliding_attention'"},
      {kGemma3, "rope_parameters", R"({"chunked_attention": {"rope_type": "default"}})",
       "chunked_attention"},
      {kLlama32, "attn_logit_softcapping", "50.0", "'attn_logit_softcapping'"},
      {kQwen3, "final_logit_softcapping", "30.0", "'final_logit_softcapping'"},
      {kMistral, "final_logit_softcapping", "30.0", "'final_logit_softcapping'"},
      {kGemma3, "use_bidirectional_attention", "true", "'use_bidirectional_attention'"},
      {kLlama32, "use_bidirectional_attention", "true", "'use_bidirectional_attention'"},
      {kQwen3, "num_experts", "8", "'num_experts'"},
      {kMistral, "num_local_experts", "8", "'num_local_experts'"},
      {kQwen3, "num_experts_per_tok", "2", "'num_experts_per_tok'"},
      {kQwen3, "moe_intermediate_size", "64", "'moe_intermediate_size'"},
      {kLlama32, "n_routed_experts", "64", "'n_routed_experts'"},
      {kQwen3, "use_sliding_window", "true", "'use_sliding_window'"},
      {kQwen3, "layer_types", R"(["full_attention", "sliding_attention", "full_attention"])",
       "'layer_types'"},
      {kQwen3, "attention_bias", "true", "'attention_bias'"},
      {kGemma3, "attention_bias", "true", "'attention_bias'"},
      {kLlama32, "partial_rotary_factor", "0.5", "'partial_rotary_factor'"},
      {kLlama32, "mlp_bias", "true", "'mlp_bias'"},
      {kLlama32, "hidden_act", "\"gelu\"", "'hidden_act'"},
      {kGemma3, "hidden_activation", "\"gelu\"", "'hidden_activation'"},
      {kGemma3, "torch_dtype", "\"float8_e4m3fn\"", "'torch_dtype'"},
      {kGemma3, "sliding_window", "null", "'sliding_window'"},
      {kGemma3, "layer_types", R"(["sliding_attention"])", "'layer_types'"},
      {kGemma3, "layer_types",
       R"(["sliding_attention", "chunked_attention", "full_attention", "sliding_attention"])",
       "'layer_types'"},
      {kGemma3, "sliding_window_pattern", "0", "'sliding_window_pattern'"},
      {kGemma3, "query_pre_attn_scalar", "0", "'query_pre_attn_scalar'"},
      {kGemma3, "final_logit_softcapping", "-1.0", "'final_logit_softcapping'"},
      {kMistral, "sliding_window", "0", "'sliding_window'"},
      {kGemma3Multimodal, "text_config", "null", "'text_config'"},
      {kGemma3Multimodal, "text_config", R"({"hidden_activation": "relu"})",
       "text_config: key 'hidden_activation'"},
  };
  for (const Refusal& r : cases) {
    const std::string json = With(r.base, r.key, r.value);
    SCOPED_TRACE(std::string(r.key) + ": " + r.value);
    absl::StatusOr<ModelConfig> config = ParseModelConfig(json);
    ASSERT_FALSE(config.ok());
    EXPECT_THAT(config.status().message(), HasSubstr(r.named));
  }
}

TEST(RefusedKeysTest, QwenSlidingWindowIsRefusedForQwen2Too) {
  std::string qwen2 = With(kQwen3, "architectures", R"(["Qwen2ForCausalLM"])");
  EXPECT_TRUE(ParseModelConfig(qwen2).ok());
  absl::StatusOr<ModelConfig> config = ParseModelConfig(With(qwen2, "use_sliding_window", "true"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(config.status().message(), HasSubstr("'use_sliding_window'"));
}

TEST(RefusedKeysTest, NeutralValuesAreAccepted) {
  // Keys that are present but say "off" change nothing.
  EXPECT_TRUE(ParseModelConfig(With(kQwen3, "num_experts", "0")).ok());
  EXPECT_TRUE(ParseModelConfig(With(kQwen3, "num_experts", "null")).ok());
  EXPECT_TRUE(ParseModelConfig(With(kGemma3, "use_bidirectional_attention", "false")).ok());
  EXPECT_TRUE(ParseModelConfig(With(kLlama32, "attn_logit_softcapping", "null")).ok());
  EXPECT_TRUE(ParseModelConfig(With(kLlama32, "partial_rotary_factor", "1.0")).ok());
  EXPECT_TRUE(ParseModelConfig(With(kQwen3, "layer_types",
                                    R"(["full_attention", "full_attention", "full_attention"])"))
                  .ok());
  EXPECT_TRUE(ParseModelConfig(With(kLlama32, "rope_scaling", R"({"rope_type": "default"})")).ok());
}

}  // namespace
}  // namespace carpool::worker
