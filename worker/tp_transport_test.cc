// --tp-transport: parsing, the flag, and which transport a tensor-parallel group resolves to.
#include <string>
#include <vector>

#include "common/flags.h"
#include "gtest/gtest.h"
#include "worker/device_options.h"
#include "worker/engine.h"
#include "worker/engine_flags.h"

namespace carpool::worker {
namespace {

absl::Status ParseEngineFlags(std::vector<std::string> args, EngineOptions* options) {
  FlagParser parser;
  RegisterEngineFlags(&parser, options);
  std::vector<char*> argv = {const_cast<char*>("test")};
  for (std::string& a : args) argv.push_back(a.data());
  return parser.Parse(static_cast<int>(argv.size()), argv.data(), 1);
}

TEST(TpTransportTest, ParsesTheThreeChoicesAndNamesTheFlagOtherwise) {
  EXPECT_EQ(ParseTpTransport("auto").value(), TpTransport::kAuto);
  EXPECT_EQ(ParseTpTransport("mpi").value(), TpTransport::kMpi);
  EXPECT_EQ(ParseTpTransport("NCCL").value(), TpTransport::kNccl);
  for (TpTransport t : {TpTransport::kAuto, TpTransport::kMpi, TpTransport::kNccl}) {
    EXPECT_EQ(ParseTpTransport(TpTransportName(t)).value(), t);
  }
  const absl::StatusOr<TpTransport> bad = ParseTpTransport("gloo");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--tp-transport"), std::string::npos);
  EXPECT_NE(bad.status().message().find("gloo"), std::string::npos);
}

TEST(TpTransportTest, EngineFlagsBindIt) {
  EngineOptions o;
  ASSERT_TRUE(ParseEngineFlags({"--model", "synthetic:tiny"}, &o).ok());
  EXPECT_EQ(o.device.tp_transport, TpTransport::kAuto);
  ASSERT_TRUE(ParseEngineFlags({"--model", "synthetic:tiny", "--tp-transport", "mpi"}, &o).ok());
  EXPECT_EQ(o.device.tp_transport, TpTransport::kMpi);
  ASSERT_TRUE(ParseEngineFlags({"--tp-transport=nccl"}, &o).ok());
  EXPECT_EQ(o.device.tp_transport, TpTransport::kNccl);
  const absl::Status bad = ParseEngineFlags({"--tp-transport", "host"}, &o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--tp-transport"), std::string::npos) << bad;
}

TEST(TpTransportTest, AutoIsNcclOnlyWhenEveryRankHasAGpuAndTheBuildHasNccl) {
  EXPECT_EQ(ResolveTpTransport(TpTransport::kAuto, 2, 2, true).value(), TpTransport::kNccl);
  EXPECT_EQ(ResolveTpTransport(TpTransport::kAuto, 1, 2, true).value(), TpTransport::kMpi);
  EXPECT_EQ(ResolveTpTransport(TpTransport::kAuto, 0, 2, true).value(), TpTransport::kMpi);
  EXPECT_EQ(ResolveTpTransport(TpTransport::kAuto, 2, 2, false).value(), TpTransport::kMpi);
  // mpi forces staging, GPUs or not.
  EXPECT_EQ(ResolveTpTransport(TpTransport::kMpi, 4, 4, true).value(), TpTransport::kMpi);
  EXPECT_EQ(ResolveTpTransport(TpTransport::kMpi, 0, 4, false).value(), TpTransport::kMpi);
  EXPECT_EQ(ResolveTpTransport(TpTransport::kNccl, 4, 4, true).value(), TpTransport::kNccl);
}

TEST(TpTransportTest, NcclWithoutAGpuOnEveryRankOrWithoutNcclIsAnErrorNamingTheFlag) {
  const absl::StatusOr<TpTransport> cpu_rank = ResolveTpTransport(TpTransport::kNccl, 1, 2, true);
  ASSERT_FALSE(cpu_rank.ok());
  EXPECT_EQ(cpu_rank.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cpu_rank.status().message().find("--tp-transport nccl"), std::string::npos);
  EXPECT_NE(cpu_rank.status().message().find("1 of its 2 ranks run on the CPU"),
            std::string::npos)
      << cpu_rank.status();
  const absl::StatusOr<TpTransport> no_nccl = ResolveTpTransport(TpTransport::kNccl, 2, 2, false);
  ASSERT_FALSE(no_nccl.ok());
  EXPECT_EQ(no_nccl.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(no_nccl.status().message().find("no NCCL"), std::string::npos);
}

TEST(TpTransportTest, BuiltWithNcclFollowsTheBuild) {
#ifdef CARPOOL_HAVE_NCCL
  EXPECT_TRUE(BuiltWithNccl());
  EXPECT_TRUE(BuiltWithCuda());
#else
  EXPECT_FALSE(BuiltWithNccl());
#endif
}

}  // namespace
}  // namespace carpool::worker
