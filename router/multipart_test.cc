#include "router/multipart.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;

constexpr char kType[] = "multipart/form-data; boundary=XyZ123";

// A body as curl and the OpenAI SDKs send it: a plain field, then a file.
std::string Body(const std::string& file) {
  return "--XyZ123\r\n"
         "Content-Disposition: form-data; name=\"purpose\"\r\n\r\n"
         "batch\r\n"
         "--XyZ123\r\n"
         "Content-Disposition: form-data; name=\"file\"; filename=\"in put.jsonl\"\r\n"
         "Content-Type: application/octet-stream\r\n\r\n" +
         file + "\r\n--XyZ123--\r\n";
}

TEST(MultipartTest, ReadsFieldsAndFiles) {
  const std::string file = "{\"a\": 1}\r\n{\"b\": 2}\n--XyZ12 not a boundary\r\n";
  const std::string body = Body(file);
  auto parts = ParseMultipart(kType, body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "purpose");
  EXPECT_EQ((*parts)[0].filename, "");
  EXPECT_EQ((*parts)[0].data, "batch");
  EXPECT_EQ((*parts)[1].name, "file");
  EXPECT_EQ((*parts)[1].filename, "in put.jsonl");
  EXPECT_EQ((*parts)[1].content_type, "application/octet-stream");
  EXPECT_EQ((*parts)[1].data, file);  // bytes kept exactly, CRLFs inside included
}

TEST(MultipartTest, QuotedBoundaryPreambleAndEmptyPart) {
  const std::string body =
      "preamble\r\n--b\r\nContent-Disposition: form-data; name=\"e\"\r\n\r\n\r\n--b--";
  auto parts = ParseMultipart("Multipart/Form-Data; charset=utf-8; boundary=\"b\"", body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 1u);
  EXPECT_EQ((*parts)[0].name, "e");
  EXPECT_EQ((*parts)[0].data, "");
}

TEST(MultipartTest, RefusesMalformedBodiesByName) {
  EXPECT_THAT(ParseMultipart("application/json", "{}").status().message(),
              HasSubstr("multipart/form-data"));
  EXPECT_THAT(ParseMultipart("multipart/form-data", "x").status().message(),
              HasSubstr("boundary"));
  EXPECT_THAT(ParseMultipart(kType, "no delimiter").status().message(),
              HasSubstr("opening boundary"));
  std::string truncated = Body("data");
  truncated.resize(truncated.size() - 14);
  EXPECT_THAT(ParseMultipart(kType, truncated).status().message(),
              HasSubstr("closing boundary"));
  EXPECT_THAT(ParseMultipart(kType, "--XyZ123\r\nContent-Type: text/plain\r\n\r\nx\r\n--XyZ123--")
                  .status()
                  .message(),
              HasSubstr("no form field name"));
  EXPECT_THAT(ParseMultipart(kType, "--XyZ123\r\nContent-Disposition: form-data; name=a")
                  .status()
                  .message(),
              HasSubstr("headers do not end"));
}

}  // namespace
}  // namespace carpool::router
