// A tiny stand-in for GoogleTest, used only by the GPU-only build (tests/gpu/CMakeLists.txt) on
// machines without GoogleTest. It implements the subset carpool's GPU tests use: TEST, TEST_F,
// EXPECT_/ASSERT_ TRUE, FALSE, EQ, NE, LT, LE, GT, GE, NEAR, GTEST_SKIP, SCOPED_TRACE,
// AssertionResult, streamed messages and --gtest_filter (see gtest_main.cc). Output lines follow
// GoogleTest's ("[ RUN      ]", "[       OK ]", "[  SKIPPED ]", "[  FAILED  ]"). The real
// GoogleTest is always preferred when CMake finds it.
#ifndef CARPOOL_TESTS_GPU_COMPAT_GTEST_GTEST_H_
#define CARPOOL_TESTS_GPU_COMPAT_GTEST_GTEST_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <ios>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace testing {

class AssertionResult {
 public:
  explicit AssertionResult(bool success) : success_(success) {}
  explicit operator bool() const { return success_; }
  std::string message() const { return message_.str(); }
  template <typename V>
  AssertionResult& operator<<(const V& value) {
    message_ << value;
    return *this;
  }
  AssertionResult(const AssertionResult& other) : success_(other.success_) {
    message_ << other.message_.str();
  }

 private:
  bool success_;
  std::ostringstream message_;
};

inline AssertionResult AssertionSuccess() { return AssertionResult(true); }
inline AssertionResult AssertionFailure() { return AssertionResult(false); }

class Test {
 public:
  virtual ~Test() = default;
  virtual void SetUp() {}
  virtual void TearDown() {}
  virtual void TestBody() = 0;
};

namespace internal {

struct TestInfo {
  std::string suite;
  std::string name;
  std::function<Test*()> factory;
};

inline std::vector<TestInfo>& Registry() {
  static std::vector<TestInfo> tests;
  return tests;
}

struct Registrar {
  Registrar(const char* suite, const char* name, std::function<Test*()> factory) {
    Registry().push_back({suite, name, std::move(factory)});
  }
};

// What the running test has reported so far.
struct State {
  bool failed = false;
  bool skipped = false;
  std::vector<std::string> traces;
};
inline State& Current() {
  static State state;
  return state;
}

class Message {
 public:
  template <typename V>
  Message& operator<<(const V& value) {
    stream_ << value;
    return *this;
  }
  Message& operator<<(std::ostream& (*manipulator)(std::ostream&)) {
    stream_ << manipulator;
    return *this;
  }
  Message& operator<<(std::ios_base& (*manipulator)(std::ios_base&)) {
    stream_ << manipulator;
    return *this;
  }
  std::string str() const { return stream_.str(); }

 private:
  std::ostringstream stream_;
};

enum class Kind { kFailure, kSkip };

// Reports when a failed check's message is complete.
class Helper {
 public:
  Helper(const char* file, int line, std::string summary, Kind kind)
      : file_(file), line_(line), summary_(std::move(summary)), kind_(kind) {}
  void operator=(const Message& message) const {
    State& state = Current();
    if (kind_ == Kind::kSkip) {
      state.skipped = true;
      const std::string text = message.str();
      std::printf("%s:%d: Skipped\n%s\n", file_, line_, text.c_str());
      return;
    }
    state.failed = true;
    std::printf("%s:%d: Failure\n%s\n", file_, line_, summary_.c_str());
    const std::string text = message.str();
    if (!text.empty()) std::printf("%s\n", text.c_str());
    for (auto it = state.traces.rbegin(); it != state.traces.rend(); ++it) {
      std::printf("  trace: %s\n", it->c_str());
    }
  }

 private:
  const char* file_;
  int line_;
  std::string summary_;
  Kind kind_;
};

class ScopedTrace {
 public:
  ScopedTrace(const char* file, int line, const std::string& message) {
    Current().traces.push_back(std::string(file) + ":" + std::to_string(line) + ": " + message);
  }
  ~ScopedTrace() { Current().traces.pop_back(); }
  ScopedTrace(const ScopedTrace&) = delete;
  ScopedTrace& operator=(const ScopedTrace&) = delete;
};

template <typename V, typename = void>
struct Streamable : std::false_type {};
template <typename V>
struct Streamable<V,
                  std::void_t<decltype(std::declval<std::ostream&>() << std::declval<const V&>())>>
    : std::true_type {};
template <typename V, typename = void>
struct Iterable : std::false_type {};
template <typename V>
struct Iterable<V, std::void_t<decltype(std::declval<const V&>().begin()),
                               decltype(std::declval<const V&>().end())>> : std::true_type {};

template <typename V>
std::string Print(const V& value) {
  std::ostringstream out;
  if constexpr (std::is_enum_v<V>) {
    out << static_cast<long long>(value);
  } else if constexpr (Streamable<V>::value) {
    out << value;
  } else if constexpr (Iterable<V>::value) {
    out << "{";
    int shown = 0;
    for (const auto& element : value) {
      if (shown > 0) out << ", ";
      if (shown++ == 16) {
        out << "...";
        break;
      }
      out << Print(element);
    }
    out << "}";
  } else {
    out << "<" << sizeof(V) << "-byte object>";
  }
  return out.str();
}

struct Outcome {
  bool ok;
  std::string summary;
};

inline Outcome Truth(const AssertionResult& result, const char* text, bool expected) {
  if (static_cast<bool>(result) == expected) return {true, ""};
  std::string summary = std::string("Value of: ") + text +
                        "\n  Actual: " + (expected ? "false" : "true") +
                        "\nExpected: " + (expected ? "true" : "false");
  const std::string message = result.message();
  if (!message.empty()) summary += "\n" + message;
  return {false, summary};
}
inline Outcome Truth(bool value, const char* text, bool expected) {
  return Truth(AssertionResult(value), text, expected);
}

template <typename A, typename B, typename Op>
Outcome Compare(const A& a, const B& b, const char* a_text, const char* b_text, const char* op,
                Op compare) {
  if (compare(a, b)) return {true, ""};
  return {false, std::string("Expected: (") + a_text + ") " + op + " (" + b_text +
                     "), actual: " + Print(a) + " vs " + Print(b)};
}

inline Outcome Near(double a, double b, double tolerance, const char* a_text, const char* b_text) {
  if (std::abs(a - b) <= tolerance) return {true, ""};
  std::ostringstream out;
  out << "The difference between " << a_text << " and " << b_text << " is " << std::abs(a - b)
      << ", which exceeds " << tolerance << " (" << a << " vs " << b << ")";
  return {false, out.str()};
}

}  // namespace internal
}  // namespace testing

#define CARPOOL_GTEST_CONCAT_INNER_(a, b) a##b
#define CARPOOL_GTEST_CONCAT_(a, b) CARPOOL_GTEST_CONCAT_INNER_(a, b)

// `on_failure` is `return` for fatal checks and empty for non-fatal ones.
#define CARPOOL_GTEST_CHECK_(outcome, on_failure)                                         \
  switch (0)                                                                              \
  case 0:                                                                                 \
  default:                                                                                \
    if (const ::testing::internal::Outcome gtest_outcome_ = (outcome); gtest_outcome_.ok) \
      ;                                                                                   \
    else                                                                                  \
      on_failure ::testing::internal::Helper(__FILE__, __LINE__, gtest_outcome_.summary,  \
                                             ::testing::internal::Kind::kFailure) =       \
          ::testing::internal::Message()

#define EXPECT_TRUE(c) CARPOOL_GTEST_CHECK_(::testing::internal::Truth((c), #c, true), )
#define EXPECT_FALSE(c) CARPOOL_GTEST_CHECK_(::testing::internal::Truth((c), #c, false), )
#define ASSERT_TRUE(c) CARPOOL_GTEST_CHECK_(::testing::internal::Truth((c), #c, true), return )
#define ASSERT_FALSE(c) CARPOOL_GTEST_CHECK_(::testing::internal::Truth((c), #c, false), return )

#define CARPOOL_GTEST_CMP_(a, b, op, on_failure)                                         \
  CARPOOL_GTEST_CHECK_(                                                                  \
      ::testing::internal::Compare((a), (b), #a, #b, #op,                                \
                                   [](const auto& x, const auto& y) { return x op y; }), \
      on_failure)
#define EXPECT_EQ(a, b) CARPOOL_GTEST_CMP_(a, b, ==, )
#define EXPECT_NE(a, b) CARPOOL_GTEST_CMP_(a, b, !=, )
#define EXPECT_LT(a, b) CARPOOL_GTEST_CMP_(a, b, <, )
#define EXPECT_LE(a, b) CARPOOL_GTEST_CMP_(a, b, <=, )
#define EXPECT_GT(a, b) CARPOOL_GTEST_CMP_(a, b, >, )
#define EXPECT_GE(a, b) CARPOOL_GTEST_CMP_(a, b, >=, )
#define ASSERT_EQ(a, b) CARPOOL_GTEST_CMP_(a, b, ==, return )
#define ASSERT_NE(a, b) CARPOOL_GTEST_CMP_(a, b, !=, return )
#define ASSERT_LT(a, b) CARPOOL_GTEST_CMP_(a, b, <, return )
#define ASSERT_LE(a, b) CARPOOL_GTEST_CMP_(a, b, <=, return )
#define ASSERT_GT(a, b) CARPOOL_GTEST_CMP_(a, b, >, return )
#define ASSERT_GE(a, b) CARPOOL_GTEST_CMP_(a, b, >=, return )
#define EXPECT_NEAR(a, b, tolerance) \
  CARPOOL_GTEST_CHECK_(::testing::internal::Near((a), (b), (tolerance), #a, #b), )
#define ASSERT_NEAR(a, b, tolerance) \
  CARPOOL_GTEST_CHECK_(::testing::internal::Near((a), (b), (tolerance), #a, #b), return )
#define ADD_FAILURE()                                                                              \
  ::testing::internal::Helper(__FILE__, __LINE__, "Failed", ::testing::internal::Kind::kFailure) = \
      ::testing::internal::Message()

#define GTEST_SKIP()                                                                             \
  return ::testing::internal::Helper(__FILE__, __LINE__, "", ::testing::internal::Kind::kSkip) = \
             ::testing::internal::Message()

#define SCOPED_TRACE(message)                                                           \
  const ::testing::internal::ScopedTrace CARPOOL_GTEST_CONCAT_(gtest_trace_, __LINE__)( \
      __FILE__, __LINE__, (::testing::internal::Message() << (message)).str())

#define CARPOOL_GTEST_TEST_(suite, name, parent)                                               \
  class suite##_##name##_Test : public parent {                                                \
   public:                                                                                     \
    void TestBody() override;                                                                  \
  };                                                                                           \
  static const ::testing::internal::Registrar suite##_##name##_registrar_(                     \
      #suite, #name, [] { return static_cast<::testing::Test*>(new suite##_##name##_Test); }); \
  void suite##_##name##_Test::TestBody()

#define TEST(suite, name) CARPOOL_GTEST_TEST_(suite, name, ::testing::Test)
#define TEST_F(fixture, name) CARPOOL_GTEST_TEST_(fixture, name, fixture)

#endif  // CARPOOL_TESTS_GPU_COMPAT_GTEST_GTEST_H_
