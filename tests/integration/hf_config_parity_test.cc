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
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/command.h"
#include "tests/testing/reference_llama.h"
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

// Qwen3-0.6B: head_dim 128 with 16 heads of a 1024 hidden size; here 4 heads of 32 over 64.
constexpr char kQwen3[] = R"({
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

// gemma-3-1b-it: 4 heads of 256 over one key/value head, hidden 1152, a local:global pattern
// of 6 over 26 layers. Here hidden 96 (its sqrt rounds in bfloat16), heads of 32, a pattern of
// 3 over 4 layers (local, local, global, local) and a window of 8. query_pre_attn_scalar keeps
// the published 256, so it differs from head_dim.
constexpr char kGemma3[] = R"({
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

// gemma-3-4b-it: text_config gives only hidden_size, intermediate_size, num_hidden_layers,
// rope_scaling and sliding_window, the rest is Gemma3TextConfig's defaults: vocabulary 262208,
// 8 heads of 256 over 4 key/value heads, query_pre_attn_scalar 256, a pattern of 6, RoPE bases
// 1e6 and 1e4, tied. Here hidden 80 and 6 layers (5 local, then a global one), a window of 8.
constexpr char kGemma3Multimodal[] = R"({
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

// Mistral-7B-v0.1: no head_dim key (hidden / heads), every layer slides (4096 published).
constexpr char kMistral[] = R"({
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

// Llama-3.2-1B: llama3 RoPE scaling. Its original_max_position_embeddings is 8192; here 64, so
// that the rule's three bands (kept, smoothed, divided by the factor) all fall among head_dim
// 16's frequencies at theta 500000 and change positions the prompts reach.
constexpr char kLlama32[] = R"({
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
  if (name == "Qwen3_0_6B") return {kQwen3, Qwen3Config(), false};
  if (name == "gemma_3_1b_it") return {kGemma3, Gemma3Config(), false};
  if (name == "gemma_3_4b_it") return {kGemma3Multimodal, Gemma3MultimodalConfig(), true};
  if (name == "Mistral_7B_v0_1") return {kMistral, MistralConfig(), false};
  EXPECT_EQ(name, "Llama_3_2_1B");
  return {kLlama32, Llama32Config(), false};
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
    std::map<std::string, std::vector<float>> values;
    for (auto& [name, t] : *tensors) values[name] = std::move(t.values);
    reference_ = std::make_unique<testing::ReferenceLlama>(shape_.config, std::move(values));
  }

  const ModelConfig& config() const { return shape_.config; }
  // What prompt lengths are measured against: the window, or 16 where no layer slides.
  int window() const { return config().sliding_window > 0 ? config().sliding_window : 16; }

  std::vector<std::vector<int32_t>> Prompts() const {
    const int w = window();
    std::mt19937 rng(29);
    std::uniform_int_distribution<int32_t> token(3, config().vocab_size - 1);
    std::vector<std::vector<int32_t>> prompts;
    for (int n : {1, w - 1, w, w + 1, 3 * w + 5}) {
      std::vector<int32_t> p(n);
      for (int32_t& t : p) t = token(rng);
      prompts.push_back(std::move(p));
    }
    return prompts;
  }
  // Generations run past the window too.
  int MaxTokens(size_t prompt) const { return prompt % 2 == 0 ? 2 * window() + 3 : 6; }

  std::vector<EngineRequest> Requests() const {
    std::vector<EngineRequest> requests;
    const std::vector<std::vector<int32_t>> prompts = Prompts();
    for (size_t i = 0; i < prompts.size(); ++i) {
      EngineRequest r;
      r.prompt_tokens = prompts[i];
      r.sampling.temperature = 0;
      r.sampling.max_tokens = MaxTokens(i);
      r.sampling.ignore_eos = true;
      r.sampling.logprobs = 1;
      requests.push_back(std::move(r));
    }
    return requests;
  }

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

  // The reference's greedy continuation of prompt i (computed once).
  const testing::ReferenceLlama::Greedy& Expected(size_t i) {
    auto it = expected_.find(i);
    if (it == expected_.end()) {
      it = expected_
               .emplace(i, reference_->Generate(Prompts()[i], MaxTokens(i), /*ignore_eos=*/true))
               .first;
    }
    return it->second;
  }

  // Each completion against the reference: same tokens, logprobs within kLogprobTolerance.
  void ExpectReference(const std::vector<absl::StatusOr<Completion>>& got, const char* what) {
    ASSERT_EQ(got.size(), Prompts().size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << what << ", request " << i << ": " << got[i].status();
      const testing::ReferenceLlama::Greedy& want = Expected(i);
      EXPECT_EQ(got[i]->tokens, want.tokens) << what << ", request " << i;
      ASSERT_EQ(got[i]->logprobs.size(), want.logprobs.size()) << what << ", request " << i;
      for (size_t j = 0; j < want.logprobs.size(); ++j) {
        EXPECT_NEAR(got[i]->logprobs[j].logprob, want.logprobs[j], kLogprobTolerance)
            << what << ", request " << i << ", token " << j;
      }
    }
  }

  std::unique_ptr<Engine> MakeEngine(const EngineOptions& o) {
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  Shape shape_;
  testing::ScratchDir dir_;
  std::unique_ptr<testing::ReferenceLlama> reference_;
  std::map<size_t, testing::ReferenceLlama::Greedy> expected_;
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
  EXPECT_GT(Prompts().back().size(), 3u * window());
}

TEST_P(HfConfigParityTest, AloneAndBatchedMatchTheReference) {
  std::unique_ptr<Engine> engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  // What the engine loaded from config.json is what the reference computes.
  ExpectSameConfig(engine->model_config(), config());
  std::vector<absl::StatusOr<Completion>> alone;
  for (EngineRequest& r : Requests()) alone.push_back(std::move(engine->Generate({r})[0]));
  ExpectReference(alone, "alone");

  // All together on a fresh engine: decodes beside prefill chunks in every step.
  EngineOptions o = Options();
  o.enable_prefix_caching = false;
  std::unique_ptr<Engine> batched = MakeEngine(o);
  ASSERT_NE(batched, nullptr);
  ExpectReference(batched->Generate(Requests()), "batched");
}

INSTANTIATE_TEST_SUITE_P(Published, HfConfigParityTest,
                         ::testing::Values("Qwen3_0_6B", "gemma_3_1b_it", "gemma_3_4b_it",
                                           "Mistral_7B_v0_1", "Llama_3_2_1B"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace carpool
