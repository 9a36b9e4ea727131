#include "worker/weights/weights.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/bf16.h"
#include "tests/testing/checkpoint_test.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/weights/model_config.h"
#include "worker/weights/safetensors.h"

namespace carpool::worker {
namespace {

namespace fs = std::filesystem;
using ::carpool::testing::CheckpointSpec;
using ::carpool::testing::CheckpointTensors;
using ::carpool::testing::RawTensor;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelConfig TinyConfig() { return SyntheticConfig("tiny").value(); }

std::vector<float> Values(const Tensor& tensor) {
  return std::vector<float>(tensor.data(), tensor.data() + tensor.numel());
}

// Every tensor the loader produced, by Hugging Face name.
std::map<std::string, const Tensor*> ByName(LlamaWeights* weights) {
  std::map<std::string, const Tensor*> named;
  for (const TensorSlot& slot : TensorSlots(weights)) named[slot.name] = slot.tensor;
  return named;
}

void ExpectSameTensors(LlamaWeights* loaded, const CheckpointTensors& written) {
  for (const auto& [name, tensor] : ByName(loaded)) {
    SCOPED_TRACE(name);
    auto it = written.find(name);
    ASSERT_NE(it, written.end());
    EXPECT_EQ(tensor->shape(), it->second.shape);
    EXPECT_EQ(Values(*tensor), it->second.values);
  }
}

class WeightsTest : public testing::CheckpointTest {
 protected:
  WeightsTest() : CheckpointTest("carpool_weights_") {}

  CheckpointTensors WriteTiny() {
    CheckpointSpec spec;
    spec.config = TinyConfig();
    return Write(spec);
  }

  // Rewrites model.safetensors as F32 from `tensors`.
  void RewriteModel(const std::vector<RawTensor>& tensors) {
    ASSERT_TRUE(testing::WriteSafetensors(Path("model.safetensors"), tensors).ok());
  }

  std::string Path(const std::string& file) const { return (dir_ / file).string(); }

  absl::Status LoadStatus() const { return LoadWeights(dir_.string()).status(); }
};

// --- Round trips -------------------------------------------------------------------------

class RoundTripTest : public WeightsTest, public ::testing::WithParamInterface<DType> {};

TEST_P(RoundTripTest, LoadsExactlyWhatWasWritten) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.dtype = GetParam();
  spec.seed = 7;
  const CheckpointTensors written = Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const ModelConfig& config = (*loaded)->config;
  EXPECT_EQ(config.vocab_size, 258);
  EXPECT_EQ(config.num_layers, 2);
  EXPECT_EQ(config.num_kv_heads, 2);
  EXPECT_EQ(config.head_dim, 16);
  EXPECT_EQ(config.bos_token_id, 256);
  EXPECT_THAT(config.eos_token_ids, ElementsAre(257));
  EXPECT_EQ(written.size(), 2 + 2 * 9 + 1u);  // embed, 9 per layer, norm, lm_head
  ASSERT_EQ((*loaded)->layers.size(), 2u);
  EXPECT_TRUE((*loaded)->layers[0].q_bias.empty());
  EXPECT_NE((*loaded)->lm_head.data(), (*loaded)->embed_tokens.data());
  ExpectSameTensors(loaded->get(), written);
  EXPECT_EQ((*loaded)->files.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, RoundTripTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST_F(WeightsTest, HalfPrecisionValuesAreRoundedNotTruncated) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.dtype = DType::kBF16;
  const CheckpointTensors bf16 = Write(spec);
  const std::vector<float> exact = Values(SyntheticWeights(spec.config, spec.seed)->embed_tokens);
  const std::vector<float>& stored = bf16.at("model.embed_tokens.weight").values;
  ASSERT_EQ(stored.size(), exact.size());
  for (size_t i = 0; i < exact.size(); ++i) {
    ASSERT_LE(std::abs(stored[i] - exact[i]), std::abs(exact[i]) * (1.0f / 256)) << i;
  }
  EXPECT_NE(stored, exact);
}

TEST_F(WeightsTest, ShardedCheckpoint) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.dtype = DType::kBF16;
  spec.num_shards = 3;
  const CheckpointTensors written = Write(spec);
  EXPECT_TRUE(fs::exists(dir_ / "model-00002-of-00003.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->files.size(), 3u);
  ExpectSameTensors(loaded->get(), written);
}

TEST_F(WeightsTest, ShardMissingFromIndexIsNotFound) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.num_shards = 2;
  Write(spec);
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(WeightsTest, TiedEmbeddingsShareData) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.config.tie_word_embeddings = true;
  const CheckpointTensors written = Write(spec);
  EXPECT_FALSE(written.contains("lm_head.weight"));
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaWeights& weights = **loaded;
  EXPECT_TRUE(weights.config.tie_word_embeddings);
  EXPECT_EQ(weights.lm_head.data(), weights.embed_tokens.data());
  EXPECT_EQ(weights.lm_head.shape(), weights.embed_tokens.shape());
  // The tied head is counted once.
  const int64_t embed = 258 * 64, layer = 64 + 64 * 64 * 2 + 32 * 64 * 2 + 64 + 3 * 176 * 64;
  EXPECT_EQ(weights.ParameterBytes(), 4 * (embed + 2 * layer + 64));
}

TEST_F(WeightsTest, TiedConfigIgnoresAWrittenLmHead) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.config.tie_word_embeddings = true;
  spec.write_lm_head = true;
  EXPECT_TRUE(Write(spec).contains("lm_head.weight"));
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->lm_head.data(), (*loaded)->embed_tokens.data());
}

TEST_F(WeightsTest, Qwen2LoadsQkvBias) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.config.architecture = "Qwen2ForCausalLM";
  spec.config.attention_bias = true;
  spec.dtype = DType::kF16;
  const CheckpointTensors written = Write(spec);
  ASSERT_TRUE(written.contains("model.layers.1.self_attn.k_proj.bias"));
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE((*loaded)->config.attention_bias);
  EXPECT_THAT((*loaded)->layers[1].k_bias.shape(), ElementsAre(32));
  EXPECT_THAT((*loaded)->layers[0].q_bias.shape(), ElementsAre(64));
  ExpectSameTensors(loaded->get(), written);
}

TEST_F(WeightsTest, BiasInCheckpointTurnsOnAttentionBias) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.config.attention_bias = true;
  const CheckpointTensors written = Write(spec);
  ModelConfig announced = spec.config;
  announced.attention_bias = false;
  ASSERT_TRUE(testing::WriteFile(Path("config.json"), testing::ConfigJson(announced)).ok());
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE((*loaded)->config.attention_bias);
  EXPECT_EQ(Values((*loaded)->layers[0].v_bias),
            written.at("model.layers.0.self_attn.v_proj.bias").values);
}

TEST_F(WeightsTest, AlignedF32IsUsedInPlace) {
  WriteTiny();
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ((*loaded)->files.size(), 1u);
  const MappedFile& file = *(*loaded)->files[0];
  const auto inside = [&file](const Tensor& t) {
    const auto* p = reinterpret_cast<const uint8_t*>(t.data());
    return p >= file.data() && p + t.numel() * sizeof(float) <= file.data() + file.size();
  };
  EXPECT_TRUE(inside((*loaded)->embed_tokens));
  EXPECT_TRUE(inside((*loaded)->layers[1].down_proj));
  EXPECT_TRUE(inside((*loaded)->lm_head));
}

TEST_F(WeightsTest, MisalignedF32IsCopied) {
  const CheckpointTensors written = WriteTiny();
  const std::vector<RawTensor> raw = testing::ToRawTensors(written, DType::kF32);
  std::string header = testing::SafetensorsHeader(raw);
  while ((8 + header.size()) % 4 != 2) header += ' ';
  std::string data;
  for (const RawTensor& t : raw) data += t.bytes;
  ASSERT_TRUE(
      testing::WriteSafetensorsRaw(Path("model.safetensors"), header.size(), header, data).ok());
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*loaded)->embed_tokens.data()) % alignof(float), 0u);
  ExpectSameTensors(loaded->get(), written);
}

// --- Bad input -----------------------------------------------------------------------------

TEST_F(WeightsTest, MissingFolderIsNotFound) {
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr(dir_.string()));
}

TEST_F(WeightsTest, MissingConfigIsNotFound) {
  WriteTiny();
  fs::remove(dir_ / "config.json");
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr("config.json"));
}

TEST_F(WeightsTest, MissingSafetensorsIsNotFound) {
  WriteTiny();
  fs::remove(dir_ / "model.safetensors");
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr("model.safetensors"));
}

TEST_F(WeightsTest, BadConfigJson) {
  WriteTiny();
  ASSERT_TRUE(testing::WriteFile(Path("config.json"), "{\"vocab_size\": 12,").ok());
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("config.json: "));
}

TEST_F(WeightsTest, UnsupportedArchitecture) {
  WriteTiny();
  ModelConfig config = TinyConfig();
  config.architecture = "GPT2LMHeadModel";
  ASSERT_TRUE(testing::WriteFile(Path("config.json"), testing::ConfigJson(config)).ok());
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_THAT(status.message(), HasSubstr("GPT2LMHeadModel"));
}

TEST_F(WeightsTest, UnsupportedDType) {
  std::vector<RawTensor> raw = testing::ToRawTensors(WriteTiny(), DType::kF32);
  for (RawTensor& t : raw) {
    if (t.name == "model.layers.0.self_attn.q_proj.weight") {
      t.dtype = "I8";
      t.bytes.resize(t.bytes.size() / 4);
    }
  }
  RewriteModel(raw);
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_THAT(status.message(), HasSubstr("I8"));
  EXPECT_THAT(status.message(), HasSubstr("model.layers.0.self_attn.q_proj.weight"));
}

TEST_F(WeightsTest, ExtraTensorsOfOtherDTypesAreIgnored) {
  std::vector<RawTensor> raw = testing::ToRawTensors(WriteTiny(), DType::kF32);
  raw.push_back(
      {"model.layers.0.self_attn.rotary_emb.position_ids", "I64", {4}, std::string(32, '\0')});
  RewriteModel(raw);
  EXPECT_TRUE(LoadStatus().ok()) << LoadStatus();
}

TEST_F(WeightsTest, MissingTensor) {
  CheckpointTensors written = WriteTiny();
  written.erase("model.layers.1.mlp.up_proj.weight");
  RewriteModel(testing::ToRawTensors(written, DType::kF32));
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("missing tensor model.layers.1.mlp.up_proj.weight"));
}

TEST_F(WeightsTest, MissingLmHeadWhenNotTied) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.write_lm_head = false;
  Write(spec);
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("missing tensor lm_head.weight"));
}

TEST_F(WeightsTest, ShapeMismatch) {
  std::vector<RawTensor> raw = testing::ToRawTensors(WriteTiny(), DType::kF32);
  for (RawTensor& t : raw) {
    if (t.name == "model.layers.0.self_attn.q_proj.weight") {
      t.shape = {64, 32};
      t.bytes.resize(t.bytes.size() / 2);
    }
  }
  RewriteModel(raw);
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message(),
            "shape mismatch for model.layers.0.self_attn.q_proj.weight: expected [64, 64], got "
            "[64, 32] in model.safetensors");
}

TEST_F(WeightsTest, TruncatedData) {
  WriteTiny();
  fs::resize_file(dir_ / "model.safetensors", fs::file_size(dir_ / "model.safetensors") - 3);
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
  EXPECT_THAT(status.message(), HasSubstr("model.safetensors"));
  // The last tensor in the file's data is lm_head.weight.
  EXPECT_THAT(status.message(), HasSubstr("lm_head.weight"));
}

TEST_F(WeightsTest, TruncatedHeader) {
  WriteTiny();
  fs::resize_file(dir_ / "model.safetensors", 100);
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("truncated header"));
}

TEST_F(WeightsTest, FileShorterThanHeaderLength) {
  WriteTiny();
  ASSERT_TRUE(testing::WriteFile(Path("model.safetensors"), "abc").ok());
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
}

TEST_F(WeightsTest, HugeHeaderLength) {
  WriteTiny();
  ASSERT_TRUE(testing::WriteSafetensorsRaw(Path("model.safetensors"),
                                           std::numeric_limits<uint64_t>::max() - 3, "{}", "")
                  .ok());
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("truncated header"));
}

TEST_F(WeightsTest, MalformedHeader) {
  WriteTiny();
  const std::string header = "{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}";
  ASSERT_TRUE(testing::WriteSafetensorsRaw(Path("model.safetensors"), header.size(), header,
                                           std::string(8, '\0'))
                  .ok());
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("data_offsets"));
}

TEST_F(WeightsTest, ByteCountDisagreesWithShape) {
  WriteTiny();
  const std::string header =
      "{\"x\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 8]}}";
  ASSERT_TRUE(testing::WriteSafetensorsRaw(Path("model.safetensors"), header.size(), header,
                                           std::string(8, '\0'))
                  .ok());
  const absl::Status status = LoadStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("tensor x"));
  EXPECT_THAT(status.message(), HasSubstr("needs 6 bytes"));
}

TEST(SafetensorsTest, ReadsMetadataAndEntries) {
  const std::string path = ::testing::TempDir() + "/carpool_safetensors_meta.safetensors";
  const std::vector<RawTensor> raw = {
      {"b", "BF16", {2}, testing::EncodeValues({1.5f, -2.0f}, DType::kBF16)},
      {"a", "F32", {1, 1}, testing::EncodeValues({3.25f}, DType::kF32)}};
  std::string header = testing::SafetensorsHeader(raw, {{"format", "pt"}});
  ASSERT_TRUE(
      testing::WriteSafetensorsRaw(path, header.size(), header, raw[0].bytes + raw[1].bytes).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  ASSERT_NE(file->Find("b"), nullptr);
  EXPECT_EQ(file->Find("c"), nullptr);
  absl::StatusOr<Tensor> b = file->Read(*file->Find("b"));
  ASSERT_TRUE(b.ok());
  EXPECT_THAT(Values(*b), ElementsAre(1.5f, -2.0f));
  absl::StatusOr<Tensor> a = file->Read(*file->Find("a"));
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(Values(*a), ElementsAre(3.25f));
  EXPECT_THAT(a->shape(), ElementsAre(1, 1));
  fs::remove(path);
}

// --- Weights kept bf16 ---------------------------------------------------------------------

constexpr LoadOptions kKeepBf16{.keep_bf16 = true};

std::vector<uint16_t> Bits(const Tensor& tensor) {
  return std::vector<uint16_t>(tensor.bf16_data(), tensor.bf16_data() + tensor.numel());
}

// The tensor's values widened to fp32, whatever its type.
std::vector<float> Widened(const Tensor& tensor) {
  if (tensor.type() == TensorType::kF32) return Values(tensor);
  std::vector<float> values;
  for (uint16_t bits : Bits(tensor)) values.push_back(kernels::cpu::Bf16ToFloat(bits));
  return values;
}

bool InsideFile(const MappedFile& file, const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  return p >= file.data() && p + t.nbytes() <= file.data() + file.size();
}

// Whether this process maps `path` (a line of /proc/self/maps names it).
bool Mapped(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.ends_with(path)) return true;
  }
  return false;
}

// Bytes of `w` when its norms are fp32 and its other values `bytes` each (a tied head is no
// slot of its own).
int64_t ExpectedBytes(LlamaWeights* w, int64_t bytes) {
  int64_t norms = 0, others = 0;
  for (const TensorSlot& slot : TensorSlots(w)) {
    (slot.norm ? norms : others) += slot.tensor->numel();
  }
  return 4 * norms + bytes * others;
}

TEST(TensorTest, TypesAndBytes) {
  const std::vector<float> f = {1.0f, 2.0f};
  const Tensor view = Tensor::View(f.data(), {2});
  EXPECT_EQ(view.type(), TensorType::kF32);
  EXPECT_EQ(view.nbytes(), 8);
  EXPECT_EQ(view.raw_data(), f.data());
  EXPECT_EQ(Tensor().type(), TensorType::kF32);
  EXPECT_EQ(Tensor().nbytes(), 0);

  const std::vector<uint16_t> h = {0x3f80, 0xc000, 0x0001};
  const Tensor bf16 = Tensor::ViewBf16(h.data(), {1, 3});
  EXPECT_EQ(bf16.type(), TensorType::kBF16);
  EXPECT_EQ(bf16.bf16_data(), h.data());
  EXPECT_EQ(bf16.numel(), 3);
  EXPECT_EQ(bf16.nbytes(), 6);
  EXPECT_THAT(Widened(bf16), ElementsAre(1.0f, -2.0f, std::ldexp(1.0f, -133)));

  auto buffer = std::make_unique<uint16_t[]>(2);
  buffer[1] = 0x4040;
  const uint16_t* raw = buffer.get();
  const Tensor owned = Tensor::OwnedBf16(std::move(buffer), {2});
  const Tensor copy = owned;  // shares the buffer
  EXPECT_EQ(copy.bf16_data(), raw);
  EXPECT_THAT(Widened(copy), ElementsAre(0.0f, 3.0f));

  // An empty tensor of either type answers nullptr for either accessor.
  EXPECT_EQ(Tensor::ViewBf16(nullptr, {4}).data(), nullptr);
  EXPECT_EQ(Tensor::View(nullptr, {4}).bf16_data(), nullptr);
}

TEST(TensorDeathTest, ReadingATensorAsTheOtherTypeIsAProgrammingError) {
  const std::vector<uint16_t> h = {0x3f80};
  const std::vector<float> f = {1.0f};
  EXPECT_DEATH((void)Tensor::ViewBf16(h.data(), {1}).data(), "CHECK failed");
  EXPECT_DEATH((void)Tensor::View(f.data(), {1}).bf16_data(), "CHECK failed");
}

TEST_F(WeightsTest, Bf16CheckpointStaysBf16InPlace) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.config.attention_bias = true;
  spec.dtype = DType::kBF16;
  const CheckpointTensors written = Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded =
      LoadWeights(dir_.string(), {}, nullptr, kKeepBf16);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(Path("model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*loaded)->files.size(), 1u);
  for (const TensorSlot& slot : TensorSlots(loaded->get())) {
    SCOPED_TRACE(slot.name);
    const Tensor& tensor = *slot.tensor;
    const SafetensorsEntry& entry = *file->Find(slot.name);
    EXPECT_EQ(tensor.shape(), entry.shape);
    EXPECT_EQ(Widened(tensor), written.at(slot.name).values);
    if (slot.norm) {
      EXPECT_EQ(tensor.type(), TensorType::kF32);
      continue;
    }
    ASSERT_EQ(tensor.type(), TensorType::kBF16);
    ASSERT_EQ(static_cast<size_t>(tensor.nbytes()), entry.nbytes);
    // The file's own bits, read in place.
    EXPECT_EQ(std::memcmp(tensor.bf16_data(), entry.data, entry.nbytes), 0);
    EXPECT_TRUE(InsideFile(*(*loaded)->files[0], tensor));
  }
  EXPECT_EQ((*loaded)->ParameterBytes(), ExpectedBytes(loaded->get(), 2));

  // Without the option, the same checkpoint loads as fp32, as before.
  absl::StatusOr<std::unique_ptr<LlamaWeights>> fp32 = LoadWeights(dir_.string());
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  for (const TensorSlot& slot : TensorSlots(fp32->get())) {
    EXPECT_EQ(slot.tensor->type(), TensorType::kF32) << slot.name;
  }
  ExpectSameTensors(fp32->get(), written);
  EXPECT_EQ((*fp32)->ParameterBytes(), ExpectedBytes(fp32->get(), 4));
}

TEST_F(WeightsTest, Bf16TiedHeadIsTheEmbedding) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.config.tie_word_embeddings = true;
  spec.dtype = DType::kBF16;
  Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded =
      LoadWeights(dir_.string(), {}, nullptr, kKeepBf16);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->lm_head.type(), TensorType::kBF16);
  EXPECT_EQ((*loaded)->lm_head.raw_data(), (*loaded)->embed_tokens.raw_data());
  const int64_t embed = 258 * 64, layer = 64 + 64 * 64 * 2 + 32 * 64 * 2 + 64 + 3 * 176 * 64;
  const int64_t norms = 2 * 2 * 64 + 64;
  EXPECT_EQ((*loaded)->ParameterBytes(), 2 * (embed + 2 * layer + 64 - norms) + 4 * norms);
}

TEST_F(WeightsTest, MisalignedBf16IsCopied) {
  const CheckpointTensors written = WriteTiny();
  const std::vector<RawTensor> raw = testing::ToRawTensors(written, DType::kBF16);
  std::string header = testing::SafetensorsHeader(raw);
  if ((8 + header.size()) % 2 == 0) header += ' ';
  std::string data;
  for (const RawTensor& t : raw) data += t.bytes;
  ASSERT_TRUE(
      testing::WriteSafetensorsRaw(Path("model.safetensors"), header.size(), header, data).ok());
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded =
      LoadWeights(dir_.string(), {}, nullptr, kKeepBf16);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Tensor& embed = (*loaded)->embed_tokens;
  ASSERT_EQ(embed.type(), TensorType::kBF16);
  EXPECT_FALSE(InsideFile(*(*loaded)->files[0], embed));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(embed.bf16_data()) % alignof(uint16_t), 0u);
  for (const TensorSlot& slot : TensorSlots(loaded->get())) {
    EXPECT_EQ(Widened(*slot.tensor), testing::RoundToDType(written.at(slot.name).values,
                                                           DType::kBF16))
        << slot.name;
  }
}

TEST_F(WeightsTest, Bf16ShardedCheckpointViewsEveryFile) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.dtype = DType::kBF16;
  spec.num_shards = 3;
  const CheckpointTensors written = Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded =
      LoadWeights(dir_.string(), {}, nullptr, kKeepBf16);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ((*loaded)->files.size(), 3u);
  for (const TensorSlot& slot : TensorSlots(loaded->get())) {
    SCOPED_TRACE(slot.name);
    EXPECT_EQ(Widened(*slot.tensor), written.at(slot.name).values);
    EXPECT_EQ(slot.tensor->type(), slot.norm ? TensorType::kF32 : TensorType::kBF16);
    if (slot.norm) continue;
    bool inside = false;
    for (const auto& file : (*loaded)->files) inside = inside || InsideFile(*file, *slot.tensor);
    EXPECT_TRUE(inside);
  }
}

class KeepBf16OtherDTypesTest : public WeightsTest,
                                public ::testing::WithParamInterface<DType> {};

TEST_P(KeepBf16OtherDTypesTest, LoadAsFp32AsWithoutTheOption) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.dtype = GetParam();
  const CheckpointTensors written = Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded =
      LoadWeights(dir_.string(), {}, nullptr, kKeepBf16);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (const TensorSlot& slot : TensorSlots(loaded->get())) {
    EXPECT_EQ(slot.tensor->type(), TensorType::kF32) << slot.name;
  }
  ExpectSameTensors(loaded->get(), written);
  EXPECT_EQ((*loaded)->ParameterBytes(), ExpectedBytes(loaded->get(), 4));
  // F32 is still read in place.
  EXPECT_EQ(InsideFile(*(*loaded)->files[0], (*loaded)->layers[1].up_proj),
            GetParam() == DType::kF32);
}

INSTANTIATE_TEST_SUITE_P(F32AndF16, KeepBf16OtherDTypesTest,
                         ::testing::Values(DType::kF32, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// Gemma 3 stores norms as w and the loader folds 1 + w: in fp32, from the bf16 w, as without
// keep_bf16.
TEST_F(WeightsTest, Bf16NormsAreFoldedInFp32) {
  CheckpointSpec spec;
  spec.config = SyntheticConfig("gemma3-tiny").value();
  spec.dtype = DType::kBF16;
  const CheckpointTensors written = Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> kept =
      LoadWeights(dir_.string(), {}, nullptr, kKeepBf16);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> fp32 = LoadWeights(dir_.string());
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  const std::vector<TensorSlot> kept_slots = TensorSlots(kept->get());
  const std::vector<TensorSlot> fp32_slots = TensorSlots(fp32->get());
  ASSERT_EQ(kept_slots.size(), fp32_slots.size());
  int norms = 0;
  for (size_t i = 0; i < kept_slots.size(); ++i) {
    const TensorSlot& slot = kept_slots[i];
    SCOPED_TRACE(slot.name);
    EXPECT_EQ(slot.tensor->type(), slot.norm ? TensorType::kF32 : TensorType::kBF16);
    EXPECT_EQ(Widened(*slot.tensor), Values(*fp32_slots[i].tensor));
    if (!slot.norm) continue;
    ++norms;
    const std::vector<float>& w = written.at(slot.name).values;
    EXPECT_EQ(Values(*slot.tensor)[0], 1.0f + w[0]);
  }
  EXPECT_EQ(norms, 4 * 6 + 1);  // input, post-attention, q, k, pre- and post-feedforward; final
}

TEST_F(WeightsTest, ReleaseTensorsEmptiesTheTensorsAndUnmapsTheFile) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.dtype = DType::kBF16;
  Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded =
      LoadWeights(dir_.string(), {}, nullptr, kKeepBf16);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  LlamaWeights& w = **loaded;
  const std::string path = fs::canonical(Path("model.safetensors")).string();
  ASSERT_EQ(w.files.size(), 1u);
  const std::weak_ptr<MappedFile> file = w.files[0];
  EXPECT_TRUE(Mapped(path));
  // A device that borrows a tensor keeps a copy of it, and with it the mapping.
  Tensor borrowed = w.layers[0].q_proj;
  const std::vector<uint16_t> bits = Bits(borrowed);

  w.ReleaseTensors();
  EXPECT_TRUE(w.files.empty());
  EXPECT_EQ(w.ParameterBytes(), 0);
  for (const TensorSlot& slot : TensorSlots(&w)) {
    SCOPED_TRACE(slot.name);
    EXPECT_TRUE(slot.tensor->empty());
    EXPECT_EQ(slot.tensor->numel(), 0);
    EXPECT_EQ(slot.tensor->shape(), slot.shape);  // shapes and types stay
    EXPECT_EQ(slot.tensor->type(), slot.norm ? TensorType::kF32 : TensorType::kBF16);
  }
  EXPECT_TRUE(w.lm_head.empty());
  EXPECT_EQ(w.config.num_layers, 2);
  ASSERT_FALSE(file.expired());
  EXPECT_TRUE(Mapped(path));
  EXPECT_EQ(Bits(borrowed), bits);

  borrowed = Tensor();
  EXPECT_TRUE(file.expired());
  EXPECT_FALSE(Mapped(path));
}

TEST_F(WeightsTest, ReleaseTensorsFreesOwnedFp32) {
  CheckpointSpec spec;
  spec.config = TinyConfig();
  spec.dtype = DType::kF16;  // converted: owned buffers
  Write(spec);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded = LoadWeights(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::string path = fs::canonical(Path("model.safetensors")).string();
  EXPECT_TRUE(Mapped(path));
  const Tensor kept = (*loaded)->layers[1].down_proj;
  (*loaded)->ReleaseTensors();
  EXPECT_FALSE(Mapped(path));  // no view of it is left
  EXPECT_EQ((*loaded)->ParameterBytes(), 0);
  EXPECT_TRUE((*loaded)->layers[1].down_proj.empty());
  EXPECT_EQ(kept.numel(), 64 * 176);  // a copy keeps its own buffer
}

// --- Config ---------------------------------------------------------------------------------

TEST(ModelConfigTest, HuggingFaceDefaults) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(R"({
      "architectures": ["MistralForCausalLM"], "vocab_size": 100, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4,
      "head_dim": null, "rope_scaling": null, "eos_token_id": [5, 7]})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "MistralForCausalLM");
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_EQ(config->head_dim, 8);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config->rope_theta, 10000.0);
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(config->max_position_embeddings, 2048);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_FALSE(config->attention_bias);
  EXPECT_EQ(config->bos_token_id, -1);
  EXPECT_THAT(config->eos_token_ids, ElementsAre(5, 7));
}

TEST(ModelConfigTest, ExplicitValuesAndQwen2Bias) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(R"({
      "architectures": ["Qwen2ForCausalLM"], "vocab_size": 100, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
      "rope_scaling": {"type": "linear", "factor": 2.0}, "max_position_embeddings": 512,
      "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_kv_heads, 2);
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(config->rope_theta, 1e6);
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(config->rope_scaling.factor, 2.0);
  EXPECT_EQ(config->max_position_embeddings, 512);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_TRUE(config->attention_bias);  // always for Qwen2
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_THAT(config->eos_token_ids, ElementsAre(2));
}

TEST(ModelConfigTest, WriterOutputParsesBack) {
  for (const char* preset : {"tiny", "small", "1b", "8b"}) {
    SCOPED_TRACE(preset);
    const ModelConfig config = SyntheticConfig(preset).value();
    absl::StatusOr<ModelConfig> parsed = ParseModelConfig(testing::ConfigJson(config));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->hidden_size, config.hidden_size);
    EXPECT_EQ(parsed->rope_scaling.type, config.rope_scaling.type);
    EXPECT_EQ(parsed->rope_scaling.original_max_position_embeddings,
              config.rope_scaling.original_max_position_embeddings);
    EXPECT_EQ(parsed->tie_word_embeddings, config.tie_word_embeddings);
    EXPECT_EQ(parsed->eos_token_ids, config.eos_token_ids);
    EXPECT_EQ(RopeInvFreq(*parsed), RopeInvFreq(config));
  }
}

struct BadConfig {
  const char* json;
  absl::StatusCode code;
  const char* message;
};

TEST(ModelConfigTest, ErrorsNameTheKey) {
  const std::string base = R"("architectures": ["LlamaForCausalLM"], "vocab_size": 100,
      "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4)";
  const BadConfig cases[] = {
      {"[1, 2]", absl::StatusCode::kInvalidArgument, "not a JSON object"},
      {"{\"hidden_size\": 32", absl::StatusCode::kInvalidArgument, "config.json: "},
      {"{\"vocab_size\": 3}", absl::StatusCode::kInvalidArgument, "architectures"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 32})",
       absl::StatusCode::kInvalidArgument, "missing key 'vocab_size'"},
      {R"({"architectures": ["BertModel"]})", absl::StatusCode::kUnimplemented, "BertModel"},
      {R"({"hidden_size": "32", )", absl::StatusCode::kInvalidArgument, "'hidden_size'"},
      {R"({"hidden_size": 32.5, )", absl::StatusCode::kInvalidArgument, "'hidden_size'"},
      {R"({"hidden_size": 32, "rms_norm_eps": "x", )", absl::StatusCode::kInvalidArgument,
       "'rms_norm_eps'"},
      {R"({"hidden_size": 32, "tie_word_embeddings": 1, )", absl::StatusCode::kInvalidArgument,
       "'tie_word_embeddings'"},
      {R"({"hidden_size": 32, "eos_token_id": "x", )", absl::StatusCode::kInvalidArgument,
       "'eos_token_id'"},
      {R"({"hidden_size": 32, "rope_scaling": {"rope_type": "yarn", "factor": 4}, )",
       absl::StatusCode::kUnimplemented, "yarn"},
      {R"({"hidden_size": 32, "rope_scaling": {"rope_type": "llama3", "factor": 4}, )",
       absl::StatusCode::kInvalidArgument, "low_freq_factor"},
      {R"({"hidden_size": 32, "num_key_value_heads": 3, )", absl::StatusCode::kInvalidArgument,
       "num_key_value_heads"},
      {R"({"hidden_size": 30, )", absl::StatusCode::kInvalidArgument, "not divisible"},
      {R"({"hidden_size": 32, "head_dim": 7, )", absl::StatusCode::kInvalidArgument, "even"},
      {R"({"hidden_size": 0, "head_dim": 8, )", absl::StatusCode::kInvalidArgument,
       "hidden_size must be positive"},
      {R"({"hidden_size": 32, "hidden_act": "gelu", )", absl::StatusCode::kUnimplemented,
       "hidden_act"},
      {R"({"hidden_size": 32, "eos_token_id": 100, )", absl::StatusCode::kInvalidArgument,
       "eos_token_id 100"},
  };
  for (const BadConfig& c : cases) {
    std::string json = c.json;
    if (json.ends_with(", ")) json += base + "}";
    SCOPED_TRACE(json);
    absl::StatusOr<ModelConfig> config = ParseModelConfig(json);
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), c.code) << config.status();
    EXPECT_THAT(config.status().message(), HasSubstr(c.message));
  }
}

TEST(ModelConfigTest, ModelTypeStandsInForArchitectures) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(R"({"model_type": "qwen2",
      "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "Qwen2ForCausalLM");
}

// --- RoPE -----------------------------------------------------------------------------------

double BaseFreq(double theta, int i, int head_dim) {
  return 1.0 / std::pow(theta, 2.0 * i / head_dim);
}

TEST(RopeInvFreqTest, Unscaled) {
  ModelConfig config = TinyConfig();
  const std::vector<float> inv = RopeInvFreq(config);
  ASSERT_EQ(inv.size(), 8u);
  EXPECT_EQ(inv[0], 1.0f);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(inv[i], static_cast<float>(BaseFreq(1e4, i, 16))) << i;
}

TEST(RopeInvFreqTest, Linear) {
  ModelConfig config = TinyConfig();
  config.rope_scaling.type = RopeScaling::Type::kLinear;
  config.rope_scaling.factor = 4.0;
  const std::vector<float> inv = RopeInvFreq(config);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(inv[i], static_cast<float>(BaseFreq(1e4, i, 16) / 4.0)) << i;
  }
}

TEST(RopeInvFreqTest, Llama3MatchesTheWavelengthRule) {
  const ModelConfig config = SyntheticConfig("1b").value();
  const std::vector<float> inv = RopeInvFreq(config);
  ASSERT_EQ(inv.size(), 32u);
  int kept = 0, divided = 0, smoothed = 0;
  for (int i = 0; i < 32; ++i) {
    const double freq = BaseFreq(500000.0, i, 64);
    const double wavelen = 2 * std::numbers::pi / freq;
    double expected;
    if (wavelen < 8192.0 / 4.0) {
      expected = freq;
      ++kept;
    } else if (wavelen > 8192.0 / 1.0) {
      expected = freq / 32.0;
      ++divided;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      expected = (1 - smooth) * freq / 32.0 + smooth * freq;
      ++smoothed;
    }
    EXPECT_EQ(inv[i], static_cast<float>(expected)) << i;
  }
  // All three branches are exercised.
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

// --- Half precision -----------------------------------------------------------------------

TEST(HalfTest, SpecialValues) {
  EXPECT_EQ(HalfToFloat(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(HalfToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7c01)));  // signalling NaN stays NaN

  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0x0001), std::ldexp(1.0f, -133));  // subnormal
  EXPECT_EQ(BFloat16ToFloat(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(BFloat16ToFloat(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7fc0)));
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0xff81)));
}

TEST(HalfTest, EveryBitPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float half = HalfToFloat(h);
    if (std::isnan(half)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(half)))) << bits;
    } else {
      ASSERT_EQ(FloatToHalf(half), h) << bits;
    }
    const float bf = BFloat16ToFloat(h);
    if (std::isnan(bf)) {
      EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(bf)))) << bits;
    } else {
      ASSERT_EQ(FloatToBFloat16(bf), h) << bits;
    }
  }
}

TEST(HalfTest, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                  // rounds to infinity
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);     // tie -> zero
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -26)), 0x0001);     // 0.75 units -> 1
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);     // tie 1.5 -> 2
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);  // up into the normals
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()) & 0x7fc0, 0x7fc0);
}

// --- Synthetic ------------------------------------------------------------------------------

TEST(SyntheticTest, PresetsHaveTheDocumentedShapes) {
  const ModelConfig tiny = SyntheticConfig("tiny").value();
  EXPECT_EQ(tiny.architecture, "LlamaForCausalLM");
  EXPECT_EQ(tiny.vocab_size, 258);
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.intermediate_size, 176);
  EXPECT_EQ(tiny.num_layers, 2);
  EXPECT_EQ(tiny.num_heads, 4);
  EXPECT_EQ(tiny.num_kv_heads, 2);
  EXPECT_EQ(tiny.max_position_embeddings, 2048);
  EXPECT_FALSE(tiny.tie_word_embeddings);
  EXPECT_EQ(tiny.bos_token_id, 256);
  EXPECT_THAT(tiny.eos_token_ids, ElementsAre(257));

  const ModelConfig small = SyntheticConfig("small").value();
  EXPECT_EQ(small.vocab_size, 32000);
  EXPECT_EQ(small.num_layers, 12);
  EXPECT_EQ(small.num_kv_heads, 4);
  EXPECT_TRUE(small.tie_word_embeddings);
  EXPECT_EQ(small.max_position_embeddings, 4096);

  const ModelConfig b1 = SyntheticConfig("1b").value();
  EXPECT_EQ(b1.vocab_size, 128256);
  EXPECT_EQ(b1.hidden_size, 2048);
  EXPECT_EQ(b1.head_dim, 64);
  EXPECT_TRUE(b1.tie_word_embeddings);
  EXPECT_EQ(b1.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(b1.rope_scaling.factor, 32.0);

  const ModelConfig b8 = SyntheticConfig("8b").value();
  EXPECT_EQ(b8.hidden_size, 4096);
  EXPECT_EQ(b8.intermediate_size, 14336);
  EXPECT_EQ(b8.num_layers, 32);
  EXPECT_EQ(b8.head_dim, 128);
  EXPECT_FALSE(b8.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(b8.rope_theta, 500000.0);
  for (const ModelConfig* c : {&tiny, &small, &b1, &b8}) EXPECT_TRUE(c->Validate().ok());
}

TEST(SyntheticTest, UnknownPresetListsThePresets) {
  absl::StatusOr<std::unique_ptr<LlamaWeights>> weights = LoadWeights("synthetic:nope");
  ASSERT_FALSE(weights.ok());
  EXPECT_EQ(weights.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(weights.status().message(), HasSubstr("nope"));
  EXPECT_THAT(weights.status().message(), HasSubstr("tiny"));
  EXPECT_THAT(weights.status().message(), HasSubstr("8b"));
}

TEST(SyntheticTest, DeterministicAndSeedDependent) {
  absl::StatusOr<std::unique_ptr<LlamaWeights>> a = LoadWeights("synthetic:tiny");
  absl::StatusOr<std::unique_ptr<LlamaWeights>> b = LoadWeights("synthetic:tiny");
  ASSERT_TRUE(a.ok() && b.ok());
  const std::map<std::string, const Tensor*> ta = ByName(a->get()), tb = ByName(b->get());
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, tensor] : ta) {
    EXPECT_EQ(Values(*tensor), Values(*tb.at(name))) << name;
    EXPECT_EQ(tensor->shape(), tb.at(name)->shape()) << name;
  }
  // Different tensors and different seeds give different values.
  EXPECT_NE(Values((*a)->layers[0].k_proj), Values((*a)->layers[0].v_proj));
  std::unique_ptr<LlamaWeights> other = SyntheticWeights((*a)->config, kSyntheticSeed + 1);
  EXPECT_NE(Values(other->layers[0].q_proj), Values((*a)->layers[0].q_proj));
}

TEST(SyntheticTest, ValuesHaveTheIntendedScale) {
  std::unique_ptr<LlamaWeights> w = SyntheticWeights(TinyConfig(), 3);
  const auto stats = [](const Tensor& t) {
    double sum = 0, sq = 0;
    for (float v : Values(t)) {
      sum += v;
      sq += double{v} * v;
    }
    const double mean = sum / t.numel();
    return std::pair<double, double>(mean, std::sqrt(sq / t.numel() - mean * mean));
  };
  auto [mean, stddev] = stats(w->layers[0].down_proj);  // in_features 176
  EXPECT_NEAR(mean, 0.0, 0.005);
  EXPECT_NEAR(stddev, 1.0 / std::sqrt(176.0), 0.005);
  std::tie(mean, stddev) = stats(w->embed_tokens);  // untied: std 1
  EXPECT_NEAR(stddev, 1.0, 0.02);
  ModelConfig tied_config = TinyConfig();
  tied_config.tie_word_embeddings = true;
  std::tie(mean, stddev) = stats(SyntheticWeights(tied_config, 3)->embed_tokens);
  EXPECT_NEAR(stddev, 1.0 / 8.0, 0.005);  // tied: 1/sqrt(hidden)
  std::tie(mean, stddev) = stats(w->final_norm);
  EXPECT_NEAR(mean, 1.0, 0.03);
  EXPECT_GT(stddev, 0.01);
  EXPECT_LT(stddev, 0.1);
}

TEST(SyntheticTest, KeepBf16RoundsAllButTheNorms) {
  for (const char* preset : {"tiny", "gemma3-tiny"}) {
    SCOPED_TRACE(preset);
    const ModelConfig config = SyntheticConfig(preset).value();
    std::unique_ptr<LlamaWeights> fp32 = SyntheticWeights(config, 5);
    std::unique_ptr<LlamaWeights> bf16 = SyntheticWeights(config, 5, {}, nullptr, kKeepBf16);
    const std::vector<TensorSlot> fp32_slots = TensorSlots(fp32.get());
    const std::vector<TensorSlot> bf16_slots = TensorSlots(bf16.get());
    ASSERT_EQ(fp32_slots.size(), bf16_slots.size());
    for (size_t i = 0; i < fp32_slots.size(); ++i) {
      SCOPED_TRACE(fp32_slots[i].name);
      const std::vector<float> exact = Values(*fp32_slots[i].tensor);
      const Tensor& t = *bf16_slots[i].tensor;
      EXPECT_EQ(t.shape(), fp32_slots[i].tensor->shape());
      if (fp32_slots[i].norm) {
        EXPECT_EQ(t.type(), TensorType::kF32);
        EXPECT_EQ(Values(t), exact);
        continue;
      }
      ASSERT_EQ(t.type(), TensorType::kBF16);
      std::vector<uint16_t> rounded;
      for (float v : exact) rounded.push_back(kernels::cpu::FloatToBf16(v));
      EXPECT_EQ(Bits(t), rounded);
      std::vector<float> widened;
      for (float v : exact) widened.push_back(kernels::cpu::RoundToBf16(v));
      EXPECT_EQ(Widened(t), widened);
    }
    EXPECT_EQ(bf16->lm_head.raw_data() == bf16->embed_tokens.raw_data(),
              config.tie_word_embeddings);
    EXPECT_EQ(bf16->ParameterBytes(), ExpectedBytes(bf16.get(), 2));
  }
  absl::StatusOr<std::unique_ptr<LlamaWeights>> loaded =
      LoadWeights("synthetic:tiny", {}, nullptr, kKeepBf16);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->layers[0].up_proj.type(), TensorType::kBF16);
  EXPECT_EQ(Bits((*loaded)->layers[0].up_proj),
            Bits(SyntheticWeights(TinyConfig(), kSyntheticSeed, {}, nullptr, kKeepBf16)
                     ->layers[0]
                     .up_proj));
}

TEST(SyntheticTest, SmallLoadsQuickly) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<LlamaWeights>> small = LoadWeights("synthetic:small");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(small.ok());
  const int64_t params = (*small)->ParameterBytes() / 4;
  EXPECT_GT(params, 90'000'000);
  EXPECT_LT(params, 110'000'000);
  EXPECT_EQ((*small)->lm_head.data(), (*small)->embed_tokens.data());
  EXPECT_TRUE((*small)->files.empty());
  RecordProperty("load_seconds", std::to_string(seconds));
  EXPECT_LT(seconds, 30.0);  // a few seconds on a laptop; generous for a loaded CI machine
}

}  // namespace
}  // namespace carpool::worker
