// NcclComm (transports/nccl/nccl_comm.h): argument checks everywhere; with one device, the
// collectives on a one-rank communicator and the deadline on a peer that never joins; with two,
// two ranks (threads) on two devices.
#include "transports/nccl/nccl_comm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda/cuda_test_util.h"

namespace nanoccl {
namespace {

using cudatest::DeviceBuffer;

constexpr std::chrono::milliseconds kDeadline{60000};

TEST(NcclCommTest, RejectsBadArguments) {
  auto bad = NcclComm::create("too short", 0, 1, 0, Deadline::after(kDeadline));
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().toString();
  auto rank = NcclComm::create(std::string(128, '\0'), 2, 2, 0, Deadline::after(kDeadline));
  ASSERT_FALSE(rank.isOk());
  EXPECT_EQ(rank.status().code(), StatusCode::kInvalidArgument) << rank.status().toString();
}

TEST(NcclCommTest, SupportsNcclTypesAndOps) {
  EXPECT_TRUE(NcclComm::built());
  EXPECT_TRUE(NcclComm::supports(DataType::kFloat32, ReduceOp::kSum));
  EXPECT_TRUE(NcclComm::supports(DataType::kBFloat16, ReduceOp::kPremulSum));
  EXPECT_TRUE(NcclComm::supports(DataType::kInt64, ReduceOp::kAvg));
  EXPECT_FALSE(NcclComm::supports(DataType::kInt16, ReduceOp::kNumOps));
  EXPECT_FALSE(NcclComm::supports(DataType::kInt32, ReduceOp::kPremulSum));
  EXPECT_FALSE(NcclComm::supports(DataType::kInt32, ReduceOp::kBand));
  EXPECT_FALSE(NcclComm::supports(DataType::kComplex64, ReduceOp::kSum));
  EXPECT_FALSE(NcclComm::supports(DataType::kBool, ReduceOp::kMax));
}

// A one-rank communicator: NCCL runs every collective (no peer), so the calls, the reduction
// operators (premul_sum, avg) and the in-place rules are checked on one GPU.
TEST(NcclCommTest, OneRankCollectives) {
  NANOCCL_SKIP_WITHOUT_DEVICES(1);
  const Deadline d = Deadline::after(kDeadline);
  auto id = NcclComm::newUniqueId();
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  auto comm = NcclComm::create(id.value(), 0, 1, 0, d);
  ASSERT_TRUE(comm.isOk()) << comm.status().toString();
  NcclComm& c = *comm.value();

  const size_t n = 1000;
  std::vector<float> x(n);
  std::iota(x.begin(), x.end(), 1.0f);
  DeviceBuffer<float> buf(n), out(n);
  buf.put(x);
  ASSERT_TRUE(c.allreduce(buf.get(), buf.get(), n, DataType::kFloat32, ReduceOp::kSum, 1.0,
                          nullptr, d)
                  .isOk());
  EXPECT_EQ(buf.take(), x);
  ASSERT_TRUE(c.allreduce(buf.get(), out.get(), n, DataType::kFloat32, ReduceOp::kPremulSum,
                          0.5, nullptr, d)
                  .isOk());
  std::vector<float> half = x;
  for (auto& v : half) v *= 0.5f;
  EXPECT_EQ(out.take(), half);
  ASSERT_TRUE(c.reduceScatter(buf.get(), out.get(), n, DataType::kFloat32, ReduceOp::kAvg, 1.0,
                              nullptr, d)
                  .isOk());
  EXPECT_EQ(out.take(), x);
  DeviceBuffer<float> gathered(n);
  ASSERT_TRUE(c.allgather(buf.get(), gathered.get(), n, DataType::kFloat32, nullptr, d).isOk());
  EXPECT_EQ(gathered.take(), x);
  ASSERT_TRUE(c.reduce(buf.get(), buf.get(), n / 2, DataType::kFloat32, ReduceOp::kMax, 1.0, 0,
                       nullptr, d)
                  .isOk());
  ASSERT_TRUE(c.broadcast(buf.get(), buf.get(), n, DataType::kFloat32, 0, nullptr, d).isOk());
  EXPECT_EQ(buf.take(), x);
  EXPECT_TRUE(c.check().isOk());
  EXPECT_TRUE(c.close(d).isOk());
  EXPECT_FALSE(c.allreduce(buf.get(), buf.get(), n, DataType::kFloat32, ReduceOp::kSum, 1.0,
                           nullptr, d)
                   .isOk());
}

// Nothing hangs: a rank whose peer never calls create() gets kTimeout at its deadline.
TEST(NcclCommTest, PeerThatNeverJoinsTimesOut) {
  NANOCCL_SKIP_WITHOUT_DEVICES(1);
  auto id = NcclComm::newUniqueId();
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  const auto start = std::chrono::steady_clock::now();
  auto comm = NcclComm::create(id.value(), 0, 2, 0, Deadline::after(std::chrono::seconds(3)));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(comm.isOk());
  EXPECT_EQ(comm.status().code(), StatusCode::kTimeout) << comm.status().toString();
  EXPECT_LT(took, std::chrono::seconds(30));
}

// Two ranks on two devices: the collectives the CUDA backend uses, in their in-place forms.
TEST(NcclCommTest, TwoRanksTwoDevices) {
  NANOCCL_SKIP_WITHOUT_DEVICES(2);
  auto id = NcclComm::newUniqueId();
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  const size_t n = 4096;  // per rank after the reduce-scatter: n / 2
  std::vector<std::vector<float>> results(2);
  std::vector<Status> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const Deadline d = Deadline::after(kDeadline);
      auto comm = NcclComm::create(id.value(), r, 2, r, d);
      if (!comm.isOk()) {
        errors[r] = comm.status();
        return;
      }
      NcclComm& c = *comm.value();
      std::vector<float> x(n, static_cast<float>(r + 1));
      DeviceBuffer<float> buf(n, r);
      buf.put(x);
      // In-place reduce-scatter then allgather: an allreduce, as the hierarchical plan does it.
      float* mine = buf.get() + r * (n / 2);
      Status s = c.reduceScatter(buf.get(), mine, n / 2, DataType::kFloat32, ReduceOp::kSum, 1.0,
                                 nullptr, d);
      if (s.isOk()) s = c.allgather(mine, buf.get(), n / 2, DataType::kFloat32, nullptr, d);
      // Reduce to and broadcast from each shard's owner (the uneven-node form).
      for (int root = 0; root < 2 && s.isOk(); ++root) {
        float* p = buf.get() + root * (n / 2);
        s = c.reduce(p, p, n / 2, DataType::kFloat32, ReduceOp::kSum, 1.0, root, nullptr, d);
      }
      for (int root = 0; root < 2 && s.isOk(); ++root) {
        float* p = buf.get() + root * (n / 2);
        s = c.broadcast(p, p, n / 2, DataType::kFloat32, root, nullptr, d);
      }
      if (s.isOk()) s = c.close(d);
      errors[r] = s;
      results[r] = buf.take();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r].isOk()) << "rank " << r << ": " << errors[r].toString();
    // (1 + 2) summed, then summed again across the two ranks.
    EXPECT_EQ(results[r], std::vector<float>(n, 6.0f)) << "rank " << r;
  }
}

}  // namespace
}  // namespace nanoccl
