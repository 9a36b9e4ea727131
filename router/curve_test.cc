// CURVE on the frontend (must-show 10): a client whose key is on the allow-list is served; one
// with another key, or without CURVE, gets no service at all.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "client/carpool_client.h"
#include "common/transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/router.h"
#include "router/testing/sim_worker.h"
#include "router/zap_handler.h"

namespace carpool::router {
namespace {

class CurveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("carpool_curve_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    worker_.reset();
    if (router_) router_->Stop();
    if (thread_.joinable()) thread_.join();
    std::filesystem::remove_all(dir_);
  }

  std::filesystem::path dir_;
  std::unique_ptr<Router> router_;
  std::thread thread_;
  std::unique_ptr<testing::SimWorker> worker_;
};

TEST_F(CurveTest, KeyFilesRoundTrip) {
  const std::string path = (dir_ / "server.key").string();
  auto pub = WriteCurveKeyPair(path);
  ASSERT_TRUE(pub.ok()) << pub.status();
  auto secret = ReadCurveKeyFile(path);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(CurvePublicKey(*secret).value_or(""), *pub);
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::others_read,
            std::filesystem::perms::none);
  auto allowed = ReadCurveAllowList(path + ".pub");
  ASSERT_TRUE(allowed.ok());
  EXPECT_EQ(*allowed, std::vector<std::string>{*pub});
  std::ofstream(dir_ / "bad.pub") << "# a comment\nnot-a-key\n";
  EXPECT_THAT(ReadCurveAllowList((dir_ / "bad.pub").string()).status().message(),
              ::testing::HasSubstr("bad.pub:2"));
}

TEST_F(CurveTest, OnlyAllowedClientKeysAreServed) {
  auto server = GenerateCurveKeyPair();
  auto allowed = GenerateCurveKeyPair();
  auto stranger = GenerateCurveKeyPair();
  ASSERT_TRUE(server.ok() && allowed.ok() && stranger.ok());
  RouterOptions o;
  o.frontend = "tcp://127.0.0.1:*";
  o.backend = "tcp://127.0.0.1:*";
  o.curve_secret_key = server->secret_key;
  o.curve_allowed_client_keys = {allowed->public_key};
  auto router = Router::Create(o);
  ASSERT_TRUE(router.ok()) << router.status();
  router_ = std::move(*router);
  EXPECT_EQ(router_->curve_public_key(), server->public_key);
  thread_ = std::thread([this] { EXPECT_TRUE(router_->Run().ok()); });
  worker_ = std::make_unique<testing::SimWorker>(router_->backend_endpoint(),
                                                 testing::SimWorkerOptions());

  const auto connect = [&](const CurveServerKeys* keys, bool curve) {
    ClientOptions c;
    c.router_endpoint = router_->frontend_endpoint();
    c.default_timeout_ms = 1500;
    if (curve) c.curve_server_public_key = server->public_key;
    if (keys != nullptr) {
      c.curve_public_key = keys->public_key;
      c.curve_secret_key = keys->secret_key;
    }
    auto client = Client::Connect(c);
    EXPECT_TRUE(client.ok()) << client.status();
    return std::move(*client);
  };
  GenerateInput g;
  g.token_ids = testing::TaggedPrompt(1);
  g.sampling.max_tokens = 3;

  auto good = connect(&*allowed, true);
  absl::StatusOr<GenerateResult> served = absl::UnknownError("not tried");
  int attempts = 0;
  for (; attempts < 5 && !served.ok(); ++attempts) served = good->Generate(g);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->tokens.size(), 3u);

  // No service: the call times out, or cannot even be sent (no connection was ever accepted).
  const auto refused = [](const absl::Status& s) {
    return absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s);
  };
  auto bad = connect(&*stranger, true);
  const absl::Status bad_generate = bad->Generate(g).status();
  EXPECT_TRUE(refused(bad_generate)) << bad_generate;
  const absl::Status bad_stats = bad->Stats(500).status();
  EXPECT_TRUE(refused(bad_stats)) << bad_stats;
  auto plain = connect(nullptr, false);
  const absl::Status plain_stats = plain->Stats(500).status();
  EXPECT_TRUE(refused(plain_stats)) << plain_stats;
  // The allowed client is still served, and the refused ones never reached the event loop.
  auto stats = good->Stats(1500);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->requests_total, attempts);
}

}  // namespace
}  // namespace carpool::router
