#include "router/batch/batch_input.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace carpool::router::batch {
namespace {

using ::testing::HasSubstr;

constexpr char kChat[] = "/v1/chat/completions";

std::string ChatLine(const std::string& custom_id, const std::string& model = "m") {
  return R"({"custom_id":")" + custom_id +
         R"(","method":"POST","url":"/v1/chat/completions","body":{"model":")" + model +
         R"(","messages":[{"role":"user","content":"hi"}]}})";
}

// One input line from its fields, each a JSON member ("" leaves it out).
std::string Line(const std::string& custom_id, const std::string& method, const std::string& url,
                 const std::string& body) {
  std::string out;
  for (const std::string* field : {&custom_id, &method, &url, &body}) {
    if (field->empty()) continue;
    out += (out.empty() ? "{" : ",") + *field;
  }
  return out + "}";
}

constexpr char kPost[] = R"("method":"POST")";
constexpr char kChatUrl[] = R"("url":"/v1/chat/completions")";
constexpr char kMessages[] = R"("messages":[{"role":"user","content":"x"}])";

// The (line, code) pairs of the errors.
std::vector<std::pair<int64_t, std::string>> Codes(const BatchInput& input) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const InputLineError& e : input.errors) out.emplace_back(e.line, e.code);
  return out;
}

using Codes_ = std::vector<std::pair<int64_t, std::string>>;

TEST(BatchInputTest, AcceptsAGoodFileInOrder) {
  std::string file = ChatLine("a") + "\n" + ChatLine("b") + "\r\n" + ChatLine("c");
  auto input = ValidateBatchInput(file, kChat);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_TRUE(input->errors.empty());
  ASSERT_EQ(input->requests.size(), 3u);
  EXPECT_EQ(input->requests[0].custom_id, "a");
  EXPECT_EQ(input->requests[1].custom_id, "b");
  EXPECT_EQ(input->requests[2].custom_id, "c");
  EXPECT_EQ(input->requests[2].line, 3);
  EXPECT_EQ(input->model, "m");
  auto body = nlohmann::json::parse(input->requests[0].body);
  EXPECT_EQ(body["messages"][0]["content"], "hi");
  // The newline that ends the last line is not a blank line.
  auto trailing = ValidateBatchInput(file + "\n", kChat);
  ASSERT_TRUE(trailing.ok());
  EXPECT_TRUE(trailing->errors.empty());
  EXPECT_EQ(trailing->requests.size(), 3u);
}

TEST(BatchInputTest, AcceptsEachEndpoint) {
  auto completions = ValidateBatchInput(
      Line(R"("custom_id":"x")", kPost, R"("url":"/v1/completions")",
           R"("body":{"model":"m","prompt":"p"})"),
      "/v1/completions");
  ASSERT_TRUE(completions.ok());
  EXPECT_TRUE(completions->errors.empty()) << completions->errors[0].message;
  auto embeddings = ValidateBatchInput(
      Line(R"("custom_id":"x")", kPost, R"("url":"/v1/embeddings")",
           R"("body":{"model":"m","input":["a","b"]})"),
      "/v1/embeddings");
  ASSERT_TRUE(embeddings.ok());
  EXPECT_TRUE(embeddings->errors.empty()) << embeddings->errors[0].message;
}

TEST(BatchInputTest, ListsEveryBadLineByNumber) {
  const std::string chat_body = R"("body":{"model":"m",)" + std::string(kMessages) + "}";
  std::vector<std::string> lines = {
      ChatLine("ok-1"),                                                              // 1
      "{not json",                                                                   // 2
      "[1, 2]",                                                                      // 3
      Line("", kPost, kChatUrl, chat_body),                                          // 4
      Line(R"("custom_id":"")", kPost, kChatUrl, chat_body),                         // 5
      Line(R"("custom_id":7)", kPost, kChatUrl, chat_body),                          // 6
      ChatLine("ok-1"),                                                              // 7
      Line(R"("custom_id":"g")", R"("method":"GET")", kChatUrl, chat_body),          // 8
      Line(R"("custom_id":"h")", kPost, R"("url":"/v1/responses")", chat_body),      // 9
      Line(R"("custom_id":"i")", kPost, R"("url":"/v1/embeddings")",
           R"("body":{"model":"m","input":"x"})"),                                   // 10
      Line(R"("custom_id":"j")", kPost, kChatUrl, ""),                               // 11
      Line(R"("custom_id":"k")", kPost, kChatUrl, R"("body":"text")"),               // 12
      Line(R"("custom_id":"l")", kPost, kChatUrl, R"("body":{"model":"m"})"),        // 13
      Line(R"("custom_id":"n")", kPost, kChatUrl,
           R"("body":{)" + std::string(kMessages) + "}"),                            // 14
      ChatLine("o", "other-model"),                                                  // 15
      Line(R"("custom_id":"p")", kPost, kChatUrl,
           R"("body":{"model":"m","stream":true,)" + std::string(kMessages) + "}"),  // 16
      "",                                                                            // 17
      Line(R"("custom_id":"q")", kPost, kChatUrl,
           R"("body":{"model":"m","messages":[{"role":"wizard","content":"x"}]})"),  // 18
      ChatLine("ok-2"),                                                              // 19
  };
  std::string file;
  for (const std::string& l : lines) file += l + "\n";
  auto input = ValidateBatchInput(file, kChat);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(Codes(*input), (Codes_{{2, "invalid_json"},
                                   {3, "not_an_object"},
                                   {4, "missing_custom_id"},
                                   {5, "missing_custom_id"},
                                   {6, "missing_custom_id"},
                                   {7, "duplicate_custom_id"},
                                   {8, "invalid_method"},
                                   {9, "invalid_url"},
                                   {10, "invalid_url"},
                                   {11, "missing_body"},
                                   {12, "missing_body"},
                                   {13, "invalid_body"},
                                   {14, "missing_model"},
                                   {15, "mismatched_model"},
                                   {16, "invalid_body"},
                                   {17, "empty_line"},
                                   {18, "invalid_body"}}));
  // Nothing runs from a file with errors.
  EXPECT_TRUE(input->requests.empty());
  // The messages say what is wrong.
  EXPECT_THAT(input->errors[5].message, HasSubstr("ok-1"));
  EXPECT_THAT(input->errors[7].message, HasSubstr("/v1/chat/completions"));
  EXPECT_THAT(input->errors[8].message, HasSubstr("/v1/embeddings"));
  EXPECT_THAT(input->errors[11].message, HasSubstr("messages"));
  EXPECT_THAT(input->errors[13].message, HasSubstr("other-model"));
  EXPECT_THAT(input->errors[14].message, HasSubstr("stream"));
  EXPECT_THAT(input->errors[16].message, HasSubstr("role"));
}

TEST(BatchInputTest, ListsSeveralProblemsOfOneLine) {
  auto input = ValidateBatchInput(Line("", R"("method":"PUT")", R"("url":"/v2/x")", R"("body":[])"),
                                  kChat);
  ASSERT_TRUE(input.ok());
  EXPECT_EQ(Codes(*input), (Codes_{{1, "missing_custom_id"},
                                   {1, "invalid_method"},
                                   {1, "invalid_url"},
                                   {1, "missing_body"}}));
}

TEST(BatchInputTest, EndpointBodiesAreCheckedByTheirOwnParser) {
  auto no_prompt = ValidateBatchInput(
      Line(R"("custom_id":"x")", kPost, R"("url":"/v1/completions")", R"("body":{"model":"m"})"),
      "/v1/completions");
  ASSERT_TRUE(no_prompt.ok());
  EXPECT_EQ(Codes(*no_prompt), (Codes_{{1, "invalid_body"}}));
  EXPECT_THAT(no_prompt->errors[0].message, HasSubstr("prompt"));
  auto no_input = ValidateBatchInput(
      Line(R"("custom_id":"x")", kPost, R"("url":"/v1/embeddings")", R"("body":{"model":"m"})"),
      "/v1/embeddings");
  ASSERT_TRUE(no_input.ok());
  EXPECT_EQ(Codes(*no_input), (Codes_{{1, "invalid_body"}}));
  EXPECT_THAT(no_input->errors[0].message, HasSubstr("input"));
}

TEST(BatchInputTest, FileLevelErrors) {
  EXPECT_EQ(ValidateBatchInput(ChatLine("a"), "/v1/responses").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateBatchInput("", kChat).status().code(), absl::StatusCode::kInvalidArgument);

  std::string three = ChatLine("a") + "\n" + ChatLine("b") + "\n" + ChatLine("c") + "\n";
  BatchInputOptions two_lines;
  two_lines.max_lines = 2;
  auto too_many = ValidateBatchInput(three, kChat, two_lines);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_many.status().message(), HasSubstr("3 lines"));
  two_lines.max_lines = 3;
  EXPECT_TRUE(ValidateBatchInput(three, kChat, two_lines).ok());

  BatchInputOptions small;
  small.max_bytes = static_cast<int64_t>(three.size()) - 1;
  auto too_big = ValidateBatchInput(three, kChat, small);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(too_big.status().message(), HasSubstr(std::to_string(three.size())));
  small.max_bytes = static_cast<int64_t>(three.size());
  EXPECT_TRUE(ValidateBatchInput(three, kChat, small).ok());

  BatchInputOptions defaults;
  EXPECT_EQ(defaults.max_lines, 50000);
  EXPECT_EQ(defaults.max_bytes, 200 * 1000 * 1000);
}

TEST(BatchInputTest, ErrorsJsonIsOpenAIsList) {
  auto j = nlohmann::json::parse(BatchErrorsJson({{3, "invalid_json", "bad"}}));
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["line"], 3);
  EXPECT_EQ(j["data"][0]["code"], "invalid_json");
  EXPECT_EQ(j["data"][0]["message"], "bad");
  EXPECT_TRUE(j["data"][0]["param"].is_null());
}

}  // namespace
}  // namespace carpool::router::batch
