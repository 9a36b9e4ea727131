// Configs in the shape Hugging Face publishes them, end to end (issue 15): for Qwen3-0.6B,
// gemma-3-1b-it, gemma-3-4b-it (Gemma3ForConditionalGeneration, whose text_config leaves most
// keys to Gemma3TextConfig's defaults), Mistral-7B-v0.1 and Llama-3.2-1B, a checkpoint whose
// config.json has every key of the published file (small sizes, a sliding window of 8 tokens)
// and random bfloat16 weights. The engine parses that file itself; the float64 reference
// (tests/testing/reference_llama.h) gets the ModelConfig written out here by hand from what the
// published keys mean in transformers, and the same tensor values the file holds. The parsed
// config must equal the hand-written one, and the engine's greedy tokens and logprobs must equal
// the reference's (logprobs within kLogprobTolerance: the CPU computes in fp32 from the bf16
// values) for prompts shorter and longer than the window, each alone and all batched with
// prefill chunks that split prompts across the window boundary.
#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/command.h"
#include "tests/testing/hf_configs.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/reference_parity.h"
#include "worker/engine.h"
#include "worker/weights/model_config.h"

namespace carpool {
namespace {

using worker::Activation;
using worker::Completion;
using worker::DType;
using worker::Engine;
using worker::EngineOptions;
using worker::EngineRequest;
using worker::ModelConfig;
using worker::RopeScaling;

// fp32 kernels against float64 on a few tiny layers: a few 1e-6 in practice.
constexpr double kLogprobTolerance = 1e-4;

// ---- the published configs at small sizes ----------------------------------------------------

// What the published keys mean, written by hand for each text of tests/testing/hf_configs.cc
// (whose comments say how its sizes differ from the published file).

ModelConfig Qwen3Config() {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 192;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 40960;
  c.tie_word_embeddings = true;
  c.bos_token_id = 298;
  c.eos_token_ids = {299};
  c.qk_norm = true;
  return c;
}

ModelConfig Gemma3Config() {
  ModelConfig c;
  c.architecture = "Gemma3ForCausalLM";
  c.vocab_size = 300;
  c.hidden_size = 96;
  c.intermediate_size = 192;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.rope_local_theta = 1e4;
  c.max_position_embeddings = 32768;
  c.tie_word_embeddings = true;  // Gemma3TextConfig's default; the file does not say
  c.bos_token_id = 2;
  c.eos_token_ids = {1, 106};
  c.qk_norm = true;
  c.norm_weight_plus_one = true;
  c.sandwich_norms = true;
  // sqrt(96) = 9.798 cast to bfloat16 (steps of 1/16 between 8 and 16), as transformers does.
  c.embedding_multiplier = 9.8125f;
  c.hidden_activation = Activation::kGeluTanh;
  c.query_pre_attn_scalar = 256.0;
  c.sliding_window = 8;
  c.layer_sliding = {true, true, false, true};  // layer i is global when (i + 1) % 3 == 0
  return c;
}

// text_config leaves the rest to Gemma3TextConfig's defaults.
ModelConfig Gemma3MultimodalConfig() {
  ModelConfig c;
  c.architecture = "Gemma3ForCausalLM";
  c.vocab_size = 262208;
  c.hidden_size = 80;
  c.intermediate_size = 160;
  c.num_layers = 6;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 256;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.rope_scaling = {RopeScaling::Type::kLinear, 8.0};
  c.rope_local_theta = 1e4;
  c.max_position_embeddings = 131072;
  c.tie_word_embeddings = true;
  c.bos_token_id = 2;
  c.eos_token_ids = {1, 106};
  c.qk_norm = true;
  c.norm_weight_plus_one = true;
  c.sandwich_norms = true;
  // sqrt(80) = 8.944 cast to bfloat16: 8.9375.
  c.embedding_multiplier = 8.9375f;
  c.hidden_activation = Activation::kGeluTanh;
  c.query_pre_attn_scalar = 256.0;
  c.sliding_window = 8;
  c.layer_sliding = {true, true, true, true, true, false};
  return c;
}

ModelConfig MistralConfig() {
  ModelConfig c;
  c.architecture = "MistralForCausalLM";
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 224;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 1e4;
  c.max_position_embeddings = 32768;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.sliding_window = 8;  // every layer: layer_sliding stays empty
  return c;
}

ModelConfig Llama32Config() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 256;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = {RopeScaling::Type::kLlama3, 32.0, 1.0, 4.0, 64};
  c.max_position_embeddings = 131072;
  c.tie_word_embeddings = true;
  c.bos_token_id = 296;
  c.eos_token_ids = {297};
  return c;
}

struct Shape {
  const char* config_json;
  ModelConfig config;
  bool multimodal;  // a Gemma3ForConditionalGeneration checkpoint (language_model.* tensors)
};

Shape ShapeOf(const std::string& name) {
  if (name == "Qwen3_0_6B") return {testing::kHfQwen3Config, Qwen3Config(), false};
  if (name == "gemma_3_1b_it") return {testing::kHfGemma3Config, Gemma3Config(), false};
  if (name == "gemma_3_4b_it") {
    return {testing::kHfGemma3MultimodalConfig, Gemma3MultimodalConfig(), true};
  }
  if (name == "Mistral_7B_v0_1") return {testing::kHfMistralConfig, MistralConfig(), false};
  EXPECT_EQ(name, "Llama_3_2_1B");
  return {testing::kHfLlama32Config, Llama32Config(), false};
}

// Every field of ModelConfig.
void ExpectSameConfig(const ModelConfig& got, const ModelConfig& want) {
  EXPECT_EQ(got.architecture, want.architecture);
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.hidden_size, want.hidden_size);
  EXPECT_EQ(got.intermediate_size, want.intermediate_size);
  EXPECT_EQ(got.num_layers, want.num_layers);
  EXPECT_EQ(got.num_heads, want.num_heads);
  EXPECT_EQ(got.num_kv_heads, want.num_kv_heads);
  EXPECT_EQ(got.head_dim, want.head_dim);
  EXPECT_DOUBLE_EQ(got.rms_norm_eps, want.rms_norm_eps);
  EXPECT_DOUBLE_EQ(got.rope_theta, want.rope_theta);
  EXPECT_EQ(got.rope_scaling.type, want.rope_scaling.type);
  EXPECT_DOUBLE_EQ(got.rope_scaling.factor, want.rope_scaling.factor);
  if (want.rope_scaling.type == RopeScaling::Type::kLlama3) {
    EXPECT_DOUBLE_EQ(got.rope_scaling.low_freq_factor, want.rope_scaling.low_freq_factor);
    EXPECT_DOUBLE_EQ(got.rope_scaling.high_freq_factor, want.rope_scaling.high_freq_factor);
    EXPECT_EQ(got.rope_scaling.original_max_position_embeddings,
              want.rope_scaling.original_max_position_embeddings);
  }
  EXPECT_EQ(got.max_position_embeddings, want.max_position_embeddings);
  EXPECT_EQ(got.tie_word_embeddings, want.tie_word_embeddings);
  EXPECT_EQ(got.attention_bias, want.attention_bias);
  EXPECT_EQ(got.bos_token_id, want.bos_token_id);
  EXPECT_EQ(got.eos_token_ids, want.eos_token_ids);
  EXPECT_EQ(got.qk_norm, want.qk_norm);
  EXPECT_EQ(got.norm_weight_plus_one, want.norm_weight_plus_one);
  EXPECT_EQ(got.sandwich_norms, want.sandwich_norms);
  EXPECT_EQ(got.embedding_multiplier, want.embedding_multiplier);
  EXPECT_EQ(got.hidden_activation, want.hidden_activation);
  EXPECT_DOUBLE_EQ(got.query_pre_attn_scalar, want.query_pre_attn_scalar);
  EXPECT_DOUBLE_EQ(got.attn_logit_softcapping, want.attn_logit_softcapping);
  EXPECT_DOUBLE_EQ(got.final_logit_softcapping, want.final_logit_softcapping);
  EXPECT_EQ(got.sliding_window, want.sliding_window);
  EXPECT_EQ(got.layer_sliding, want.layer_sliding);
  EXPECT_DOUBLE_EQ(got.rope_local_theta, want.rope_local_theta);
}

// ---- the checkpoint, the reference and the requests ------------------------------------------

class HfConfigParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  HfConfigParityTest() : shape_(ShapeOf(GetParam())), dir_("carpool_hf_config_" + GetParam()) {}

  void SetUp() override {
    testing::CheckpointSpec spec;
    spec.config = shape_.config;
    spec.dtype = DType::kBF16;  // as published
    spec.seed = 23;
    spec.gemma3_multimodal = shape_.multimodal;
    spec.config_json = shape_.config_json;
    absl::StatusOr<testing::CheckpointTensors> tensors =
        testing::WriteCheckpoint(dir_.path().string(), spec);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    std::mt19937 rng(29);
    parity_ = std::make_unique<testing::ReferenceParity>(
        testing::ReferenceLlama(config(), testing::RawValues(*tensors)),
        testing::WindowPrompts(rng, config().vocab_size, window()), window(), kLogprobTolerance);
  }

  const ModelConfig& config() const { return shape_.config; }
  // What prompt lengths are measured against: the window, or 16 where no layer slides.
  int window() const { return config().sliding_window > 0 ? config().sliding_window : 16; }

  // Blocks of 4 tokens and prefill chunks of 6, so chunks split prompts across the window.
  EngineOptions Options() const {
    EngineOptions o;
    o.model = dir_.path().string();
    o.block_size = 4;
    o.scheduler.max_model_len = 128;
    o.scheduler.max_num_batched_tokens = 6;
    o.scheduler.max_num_seqs = 8;
    o.num_kv_blocks = 200;
    o.num_threads = 2;
    return o;
  }

  Shape shape_;
  testing::ScratchDir dir_;
  std::unique_ptr<testing::ReferenceParity> parity_;
};

TEST_P(HfConfigParityTest, ConfigParsesToWhatThePublishedKeysMean) {
  absl::StatusOr<ModelConfig> parsed = worker::ParseModelConfig(shape_.config_json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectSameConfig(*parsed, config());

  // The family's own fields, spelled out.
  const ModelConfig& c = *parsed;
  const std::string name = GetParam();
  if (name == "Qwen3_0_6B") {
    EXPECT_TRUE(c.qk_norm);
    EXPECT_NE(c.head_dim * c.num_heads, c.hidden_size);
    EXPECT_FALSE(c.sandwich_norms || c.norm_weight_plus_one);
    EXPECT_EQ(c.sliding_window, 0);
  } else if (name == "gemma_3_1b_it" || name == "gemma_3_4b_it") {
    EXPECT_TRUE(c.qk_norm && c.sandwich_norms && c.norm_weight_plus_one);
    EXPECT_EQ(c.hidden_activation, Activation::kGeluTanh);
    EXPECT_NE(c.embedding_multiplier, 1.0f);
    EXPECT_GT(c.sliding_window, 0);
    EXPECT_GT(c.rope_local_theta, 0.0);
    const int local =
        static_cast<int>(std::count(c.layer_sliding.begin(), c.layer_sliding.end(), true));
    EXPECT_GT(local, 0);
    EXPECT_LT(local, c.num_layers);
  } else if (name == "Mistral_7B_v0_1") {
    EXPECT_EQ(c.sliding_window, 8);
    EXPECT_TRUE(c.layer_sliding.empty());  // every layer slides
  } else {
    EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
    EXPECT_EQ(c.sliding_window, 0);
  }
  // The longest prompt reaches past the window.
  EXPECT_GT(parity_->prompts().back().size(), 3u * window());
}

TEST_P(HfConfigParityTest, AloneAndBatchedMatchTheReference) {
  std::unique_ptr<Engine> engine = testing::MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  // What the engine loaded from config.json is what the reference computes.
  ExpectSameConfig(engine->model_config(), config());
  std::vector<absl::StatusOr<Completion>> alone;
  for (EngineRequest& r : parity_->Requests()) {
    alone.push_back(std::move(engine->Generate({r})[0]));
  }
  parity_->ExpectMatches(alone, "alone");

  // All together on a fresh engine: decodes beside prefill chunks in every step.
  EngineOptions o = Options();
  o.enable_prefix_caching = false;
  std::unique_ptr<Engine> batched = testing::MakeEngine(o);
  ASSERT_NE(batched, nullptr);
  parity_->ExpectMatches(batched->Generate(parity_->Requests()), "batched");
}

INSTANTIATE_TEST_SUITE_P(Published, HfConfigParityTest,
                         ::testing::Values("Qwen3_0_6B", "gemma_3_1b_it", "gemma_3_4b_it",
                                           "Mistral_7B_v0_1", "Llama_3_2_1B"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace carpool
