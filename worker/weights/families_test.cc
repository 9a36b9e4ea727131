// The newer families' presets, checkpoints and the float64 reference's features: Qwen 3,
// Gemma 3 (also as a Gemma3ForConditionalGeneration checkpoint) and Mistral's sliding window.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_test.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/reference_llama.h"
#include "worker/weights/model_config.h"
#include "worker/weights/safetensors.h"
#include "worker/weights/weights.h"

namespace carpool::worker {
namespace {

namespace fs = std::filesystem;
using ::carpool::testing::CheckpointSpec;
using ::carpool::testing::CheckpointTensors;
using ::carpool::testing::RawValues;
using ::carpool::testing::ReferenceLlama;
using ::testing::HasSubstr;

constexpr const char* kTinyPresets[] = {"qwen3-tiny", "gemma3-tiny", "mistral-tiny"};
constexpr const char* kSmallPresets[] = {"qwen3-small", "gemma3-small", "mistral-small"};

std::vector<float> Values(const Tensor& tensor) {
  return std::vector<float>(tensor.data(), tensor.data() + tensor.numel());
}

class FamiliesTest : public testing::CheckpointTest {
 protected:
  FamiliesTest() : CheckpointTest("carpool_families_") {}
};

// --- Presets --------------------------------------------------------------------------------

TEST(FamilyPresetsTest, TinyPresetsExerciseTheirFamily) {
  const ModelConfig qwen3 = SyntheticConfig("qwen3-tiny").value();
  EXPECT_EQ(qwen3.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_NE(qwen3.head_dim, qwen3.hidden_size / qwen3.num_heads);
  EXPECT_FALSE(qwen3.norm_weight_plus_one);

  const ModelConfig gemma3 = SyntheticConfig("gemma3-tiny").value();
  EXPECT_EQ(gemma3.architecture, "Gemma3ForCausalLM");
  EXPECT_TRUE(gemma3.qk_norm && gemma3.norm_weight_plus_one && gemma3.sandwich_norms);
  EXPECT_TRUE(gemma3.tie_word_embeddings);
  EXPECT_EQ(gemma3.hidden_activation, Activation::kGeluTanh);
  EXPECT_NE(gemma3.head_dim, gemma3.hidden_size / gemma3.num_heads);
  EXPECT_NE(gemma3.query_pre_attn_scalar, gemma3.head_dim);
  EXPECT_GT(gemma3.attn_logit_softcapping, 0.0);
  EXPECT_GT(gemma3.final_logit_softcapping, 0.0);
  EXPECT_FLOAT_EQ(gemma3.embedding_multiplier, 8.0f);
  EXPECT_EQ(gemma3.sliding_window, 8);
  EXPECT_EQ(gemma3.layer_sliding, (std::vector<bool>{true, false, true, false}));
  EXPECT_TRUE(LayerSlides(gemma3, 0));
  EXPECT_FALSE(LayerSlides(gemma3, 1));
  EXPECT_GT(gemma3.rope_local_theta, 0.0);
  EXPECT_EQ(gemma3.rope_scaling.type, RopeScaling::Type::kLinear);

  const ModelConfig mistral = SyntheticConfig("mistral-tiny").value();
  EXPECT_EQ(mistral.architecture, "MistralForCausalLM");
  EXPECT_EQ(mistral.sliding_window, 16);
  EXPECT_TRUE(mistral.layer_sliding.empty());
  for (int layer = 0; layer < mistral.num_layers; ++layer) EXPECT_TRUE(LayerSlides(mistral, layer));

  for (const char* preset : kTinyPresets) {
    SCOPED_TRACE(preset);
    const ModelConfig c = SyntheticConfig(preset).value();
    EXPECT_EQ(c.vocab_size, 258);
    EXPECT_EQ(c.bos_token_id, 256);
    EXPECT_TRUE(c.Validate().ok());
    EXPECT_TRUE(PlanShard(c, {1, 2}).ok()) << "tiny presets split over --tp 2";
  }
}

TEST(FamilyPresetsTest, SmallPresetsHaveAbout100MParameters) {
  for (const char* preset : kSmallPresets) {
    SCOPED_TRACE(preset);
    absl::StatusOr<std::unique_ptr<LlamaWeights>> w =
        LoadWeights(std::string("synthetic:") + preset);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE((*w)->config.Validate().ok());
    const int64_t params = (*w)->ParameterBytes() / 4;
    EXPECT_GT(params, 90'000'000);
    EXPECT_LT(params, 130'000'000);
  }
  const ModelConfig gemma3 = SyntheticConfig("gemma3-small").value();
  EXPECT_EQ(std::count(gemma3.layer_sliding.begin(), gemma3.layer_sliding.end(), false), 2);
}

TEST(FamilyPresetsTest, SyntheticWeightsFillTheNewTensors) {
  std::unique_ptr<LlamaWeights> gemma = SyntheticWeights(SyntheticConfig("gemma3-tiny").value(), 5);
  const LayerWeights& layer = gemma->layers[0];
  const int64_t d = gemma->config.head_dim, h = gemma->config.hidden_size;
  for (const Tensor* t : {&layer.q_norm, &layer.k_norm}) {
    EXPECT_EQ(t->shape(), std::vector<int64_t>{d});
  }
  for (const Tensor* t : {&layer.pre_feedforward_norm, &layer.post_feedforward_norm}) {
    EXPECT_EQ(t->shape(), std::vector<int64_t>{h});
  }
  // Folded 1 + w with w small.
  for (float v : Values(layer.q_norm)) {
    EXPECT_GT(v, 0.9f);
    EXPECT_LT(v, 1.1f);
  }
  std::unique_ptr<LlamaWeights> qwen = SyntheticWeights(SyntheticConfig("qwen3-tiny").value(), 5);
  EXPECT_EQ(qwen->layers[1].k_norm.shape(), std::vector<int64_t>{qwen->config.head_dim});
  EXPECT_TRUE(qwen->layers[1].pre_feedforward_norm.empty());
}

TEST(FamilyPresetsTest, WriterOutputParsesBack) {
  for (const char* preset : {"qwen3-tiny", "gemma3-tiny", "mistral-tiny", "qwen3-small",
                             "gemma3-small", "mistral-small"}) {
    for (bool multimodal : {false, true}) {
      const ModelConfig c = SyntheticConfig(preset).value();
      if (multimodal && !c.norm_weight_plus_one) continue;
      SCOPED_TRACE(std::string(preset) + (multimodal ? " multimodal" : ""));
      absl::StatusOr<ModelConfig> p =
          ParseModelConfig(testing::ConfigJson(c, DType::kF32, multimodal));
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(p->architecture, c.architecture);
      EXPECT_EQ(p->head_dim, c.head_dim);
      EXPECT_EQ(p->qk_norm, c.qk_norm);
      EXPECT_EQ(p->norm_weight_plus_one, c.norm_weight_plus_one);
      EXPECT_EQ(p->sandwich_norms, c.sandwich_norms);
      EXPECT_EQ(p->embedding_multiplier, c.embedding_multiplier);
      EXPECT_EQ(p->hidden_activation, c.hidden_activation);
      EXPECT_EQ(p->query_pre_attn_scalar, c.query_pre_attn_scalar);
      EXPECT_EQ(p->attn_logit_softcapping, c.attn_logit_softcapping);
      EXPECT_EQ(p->final_logit_softcapping, c.final_logit_softcapping);
      EXPECT_EQ(p->sliding_window, c.sliding_window);
      EXPECT_EQ(p->layer_sliding, c.layer_sliding);
      EXPECT_EQ(p->rope_local_theta, c.rope_local_theta);
      EXPECT_EQ(p->tie_word_embeddings, c.tie_word_embeddings);
      EXPECT_EQ(p->eos_token_ids, c.eos_token_ids);
      EXPECT_EQ(p->bos_token_id, c.bos_token_id);
      EXPECT_EQ(RopeInvFreq(*p), RopeInvFreq(c));
      EXPECT_EQ(LocalRopeInvFreq(*p), LocalRopeInvFreq(c));
    }
  }
}

TEST(FamilyPresetsTest, WriterListsLayerTypesWhenNoPatternFits) {
  ModelConfig c = SyntheticConfig("gemma3-tiny").value();
  c.layer_sliding = {false, true, true, false};
  const std::string json = testing::ConfigJson(c);
  EXPECT_THAT(json, HasSubstr("layer_types"));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("sliding_window_pattern")));
  absl::StatusOr<ModelConfig> parsed = ParseModelConfig(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->layer_sliding, c.layer_sliding);
  EXPECT_THAT(testing::ConfigJson(SyntheticConfig("gemma3-tiny").value()),
              HasSubstr("\"sliding_window_pattern\": 2"));
}

// --- Loading --------------------------------------------------------------------------------

// Each loaded tensor is what was written; norms 1 + w (added in fp32) for Gemma.
void ExpectLoadedAsWritten(LlamaWeights& loaded, const CheckpointTensors& written) {
  const bool plus_one = loaded.config.norm_weight_plus_one;
  int norms = 0;
  for (const TensorSlot& slot : TensorSlots(&loaded)) {
    SCOPED_TRACE(slot.name);
    auto it = written.find(slot.name);
    ASSERT_NE(it, written.end());
    std::vector<float> expected = it->second.values;
    if (slot.norm && plus_one) {
      ++norms;
      for (float& v : expected) v = 1.0f + v;
    }
    EXPECT_EQ(Values(*slot.tensor), expected);
  }
  if (plus_one) {
    EXPECT_EQ(norms, 6 * loaded.config.num_layers + 1);
  }
}

TEST_F(FamiliesTest, GemmaCheckpointLoadsNormsAsOnePlusW) {
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    CheckpointSpec spec;
    spec.config = SyntheticConfig("gemma3-tiny").value();
    spec.dtype = dtype;
    const CheckpointTensors written = Write(spec);
    // The checkpoint holds w, near 0.
    const std::vector<float>& w =
        written.at("model.layers.0.pre_feedforward_layernorm.weight").values;
    EXPECT_LT(*std::max_element(w.begin(), w.end()), 0.11f);
    EXPECT_GT(*std::min_element(w.begin(), w.end()), -0.11f);
    absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectLoadedAsWritten(**loaded, written);
    EXPECT_EQ((*loaded)->lm_head.data(), (*loaded)->embed_tokens.data());
    if (dtype == DType::kF32) {
      // An fp32 checkpoint of the synthetic weights loads back as exactly them.
      std::unique_ptr<LlamaWeights> synthetic = SyntheticWeights(spec.config, spec.seed);
      EXPECT_EQ(Values((*loaded)->layers[1].post_feedforward_norm),
                Values(synthetic->layers[1].post_feedforward_norm));
      EXPECT_EQ(Values((*loaded)->final_norm), Values(synthetic->final_norm));
    }
    fs::remove_all(dir_);
  }
}

TEST_F(FamiliesTest, MultimodalGemmaCheckpointLoadsItsLanguageModel) {
  CheckpointSpec spec;
  spec.config = SyntheticConfig("gemma3-tiny").value();
  spec.dtype = DType::kBF16;
  spec.gemma3_multimodal = true;
  spec.num_shards = 2;
  const CheckpointTensors written = Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->config.architecture, "Gemma3ForCausalLM");
  EXPECT_EQ((*loaded)->config.layer_sliding, spec.config.layer_sliding);
  ExpectLoadedAsWritten(**loaded, written);
}

// Newer transformers versions save the language model as model.language_model.*.
TEST_F(FamiliesTest, MultimodalGemmaCheckpointInTheNewerLayoutLoads) {
  CheckpointSpec spec;
  spec.config = SyntheticConfig("gemma3-tiny").value();
  const CheckpointTensors written = Write(spec);
  std::vector<testing::RawTensor> raw = testing::ToRawTensors(written, DType::kF32);
  for (testing::RawTensor& tensor : raw) {
    tensor.name = "model.language_model." + tensor.name.substr(std::string("model.").size());
  }
  raw.push_back({"model.vision_tower.vision_model.post_layernorm.weight", "F32", {2},
                 std::string(8, '\0')});
  ASSERT_TRUE(testing::WriteSafetensors((dir_ / "model.safetensors").string(), raw).ok());
  ASSERT_TRUE(testing::WriteFile((dir_ / "config.json").string(),
                                 testing::ConfigJson(spec.config, DType::kF32, true))
                  .ok());
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectLoadedAsWritten(**loaded, written);
}

TEST_F(FamiliesTest, Qwen3CheckpointLoadsHeadNorms) {
  CheckpointSpec spec;
  spec.config = SyntheticConfig("qwen3-tiny").value();
  spec.dtype = DType::kF16;
  const CheckpointTensors written = Write(spec);
  EXPECT_EQ(written.at("model.layers.1.self_attn.q_norm.weight").shape,
            std::vector<int64_t>{spec.config.head_dim});
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE((*loaded)->config.qk_norm);
  ExpectLoadedAsWritten(**loaded, written);  // plain norms: loaded as stored
}

TEST_F(FamiliesTest, GemmaNormsAreReplicatedAndFoldedOnEveryRank) {
  CheckpointSpec spec;
  spec.config = SyntheticConfig("gemma3-tiny").value();
  spec.dtype = DType::kBF16;
  Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> whole = LoadWeights(dir_.string());
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<std::unique_ptr<LlamaWeights>> part = LoadWeights(dir_.string(), {rank, 2});
    ASSERT_TRUE(part.ok()) << part.status();
    for (int l = 0; l < spec.config.num_layers; ++l) {
      const LayerWeights& a = (*whole)->layers[l];
      const LayerWeights& b = (*part)->layers[l];
      EXPECT_EQ(Values(a.q_norm), Values(b.q_norm));
      EXPECT_EQ(Values(a.k_norm), Values(b.k_norm));
      EXPECT_EQ(Values(a.post_attention_norm), Values(b.post_attention_norm));
      EXPECT_EQ(Values(a.post_feedforward_norm), Values(b.post_feedforward_norm));
    }
    EXPECT_EQ(Values((*whole)->final_norm), Values((*part)->final_norm));
  }
}

TEST_F(FamiliesTest, Qwen3CheckpointWithBiasIsRefused) {
  CheckpointSpec spec;
  spec.config = SyntheticConfig("qwen3-tiny").value();
  spec.config.attention_bias = true;  // the tensors only; config.json says false
  spec.config_json = testing::ConfigJson(SyntheticConfig("qwen3-tiny").value());
  Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(loaded.status().message(), HasSubstr("q_proj.bias"));
}

// --- The reference's features ---------------------------------------------------------------

class ReferenceFeaturesTest : public FamiliesTest {
 protected:
  ReferenceLlama Reference(const ModelConfig& config) {
    CheckpointSpec spec;
    spec.config = config;
    return ReferenceLlama(config, RawValues(Write(spec)));
  }
  static std::vector<int32_t> Prompt(int n, int offset = 0) {
    std::vector<int32_t> tokens;
    for (int i = 0; i < n; ++i) tokens.push_back(static_cast<int32_t>((i * 37 + offset) % 256));
    return tokens;
  }
};

TEST_F(ReferenceFeaturesTest, GreedyDecodingIsNotDegenerate) {
  for (const char* preset : kTinyPresets) {
    SCOPED_TRACE(preset);
    const ReferenceLlama reference = Reference(SyntheticConfig(preset).value());
    std::set<int32_t> distinct;
    for (int p = 0; p < 3; ++p) {
      for (int32_t t : reference.Generate(Prompt(5, p * 11), 12, true).tokens) distinct.insert(t);
    }
    RecordProperty(preset, static_cast<int>(distinct.size()));
    // 29 (qwen3), 9 (gemma3: a tied head, see synthetic.cc) and 33 (mistral) of 36 here.
    EXPECT_GE(distinct.size(), 8u);
    fs::remove_all(dir_);
  }
}

// With every layer sliding, a token reaches the last position through at most num_layers
// windows: tokens further back than num_layers * (window - 1) do not change the logits at all.
TEST_F(ReferenceFeaturesTest, SlidingWindowBoundsWhatATokenSees) {
  const ModelConfig c = SyntheticConfig("mistral-tiny").value();
  const ReferenceLlama reference = Reference(c);
  const int reach = c.num_layers * (c.sliding_window - 1);
  std::vector<int32_t> tokens = Prompt(reach + 3);
  const std::vector<double> base = reference.NextLogprobs(tokens);
  std::vector<int32_t> far = tokens;
  far[1] = (far[1] + 1) % 256;  // position 1 < n - 1 - reach
  EXPECT_EQ(reference.NextLogprobs(far), base);
  std::vector<int32_t> near = tokens;
  near[3] = (near[3] + 1) % 256;  // position n - 1 - reach: just inside
  EXPECT_NE(reference.NextLogprobs(near), base);

  // Without the window the first token matters.
  ModelConfig full = c;
  full.sliding_window = 0;
  fs::remove_all(dir_);
  const ReferenceLlama unwindowed = Reference(full);
  EXPECT_NE(unwindowed.NextLogprobs(far), unwindowed.NextLogprobs(tokens));
}

// Gemma 3's global layers see every token.
TEST_F(ReferenceFeaturesTest, GemmaGlobalLayersSeePastTheWindow) {
  const ModelConfig c = SyntheticConfig("gemma3-tiny").value();
  const ReferenceLlama reference = Reference(c);
  std::vector<int32_t> tokens = Prompt(4 * c.sliding_window);
  std::vector<int32_t> changed = tokens;
  changed[0] = (changed[0] + 1) % 256;
  EXPECT_NE(reference.NextLogprobs(changed), reference.NextLogprobs(tokens));

  // With every layer local, the same change is invisible (4 layers * 7 < 31).
  ModelConfig local = c;
  local.layer_sliding.assign(c.num_layers, true);
  fs::remove_all(dir_);
  const ReferenceLlama all_local = Reference(local);
  EXPECT_EQ(all_local.NextLogprobs(changed), all_local.NextLogprobs(tokens));
}

TEST_F(ReferenceFeaturesTest, FinalSoftcapBoundsTheLogits) {
  const ModelConfig c = SyntheticConfig("gemma3-tiny").value();
  const ReferenceLlama reference = Reference(c);
  const std::vector<double> lp = reference.NextLogprobs(Prompt(6));
  // Logits within (-cap, cap): no logprob below -2 cap - log(V), none above -log(V) + 2 cap.
  const double cap = c.final_logit_softcapping;
  const double log_v = std::log(static_cast<double>(c.vocab_size));
  for (double v : lp) {
    EXPECT_GT(v, -2.0 * cap - log_v);
    EXPECT_LT(v, 2.0 * cap - log_v);
  }
  ModelConfig uncapped = c;
  uncapped.final_logit_softcapping = 0.0;
  uncapped.attn_logit_softcapping = 0.0;
  fs::remove_all(dir_);
  EXPECT_NE(Reference(uncapped).NextLogprobs(Prompt(6)), lp);
}

}  // namespace
}  // namespace carpool::worker
