// ScratchPool (collectives/algorithm.h): one call's scratch memory is the next call's.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "collectives/algorithm.h"

namespace nanoccl::detail {
namespace {

TEST(ScratchPool, ACallReusesTheBlocksOfTheLastOneBestFit) {
  ScratchPool pool;
  std::vector<ScratchPool::Block> used;
  used.push_back(pool.take(1000));
  used.push_back(pool.take(1 << 20));
  const char* small = used[0].mem.get();
  const char* large = used[1].mem.get();
  EXPECT_EQ(pool.pooledBytes(), 0u);
  pool.give(std::move(used));
  EXPECT_EQ(pool.pooledBytes(), 1000u + (1u << 20));
  // The smallest block that fits: 900 bytes take the 1000-byte block, 5000 the 1 MiB one.
  ScratchPool::Block a = pool.take(900);
  EXPECT_EQ(a.mem.get(), small);
  EXPECT_EQ(a.bytes, 1000u);
  ScratchPool::Block b = pool.take(5000);
  EXPECT_EQ(b.mem.get(), large);
  // Nothing left that fits: a new block of exactly the size asked.
  ScratchPool::Block c = pool.take(64);
  EXPECT_NE(c.mem.get(), nullptr);
  EXPECT_EQ(c.bytes, 64u);
  EXPECT_EQ(pool.pooledBytes(), 0u);
  EXPECT_EQ(pool.take(0).bytes, 1u);  // never a null block
}

TEST(ScratchPool, KeepsAtMostItsCapDroppingTheLargestFirst) {
  ScratchPool pool;
  std::vector<ScratchPool::Block> used;
  used.push_back(pool.take(ScratchPool::kMaxBytes));
  used.push_back(pool.take(4096));
  pool.give(std::move(used));
  EXPECT_EQ(pool.pooledBytes(), 4096u);  // the huge block went: over the cap together
  std::vector<ScratchPool::Block> again;
  again.push_back(pool.take(ScratchPool::kMaxBytes - 4096));
  pool.give(std::move(again));
  EXPECT_EQ(pool.pooledBytes(), ScratchPool::kMaxBytes);  // exactly at the cap: kept
}

// Many communicators (a process group per setting, per pipeline stage) keep at most
// kMaxProcessBytes together: over it, the pool given to least recently drops its blocks first,
// so that the groups in use keep theirs.
TEST(ScratchPool, ThePoolsOfAProcessShareOneCap) {
  ASSERT_EQ(ScratchPool::processPooledBytes(), 0u) << "a pool of another test is still alive";
  constexpr size_t kHalf = ScratchPool::kMaxProcessBytes / 2;
  static_assert(kHalf <= ScratchPool::kMaxBytes);
  auto a = std::make_unique<ScratchPool>();
  ScratchPool b;
  ScratchPool c;
  const auto giveOne = [](ScratchPool& pool, size_t bytes) {
    std::vector<ScratchPool::Block> used;
    used.push_back(pool.take(bytes));  // new char[]: untouched pages, no memory used
    pool.give(std::move(used));
  };
  giveOne(*a, kHalf);
  giveOne(b, kHalf);
  EXPECT_EQ(ScratchPool::processPooledBytes(), ScratchPool::kMaxProcessBytes);  // at the cap
  giveOne(c, 4096);
  // Over it: a, given to least recently, drops its block; c and b keep theirs.
  EXPECT_EQ(c.pooledBytes(), 4096u);
  EXPECT_EQ(a->pooledBytes(), 0u);
  EXPECT_EQ(b.pooledBytes(), kHalf);
  EXPECT_EQ(ScratchPool::processPooledBytes(), kHalf + 4096);
  giveOne(*a, kHalf);  // a in use again: now b is the least recent, and drops
  EXPECT_EQ(a->pooledBytes(), kHalf);
  EXPECT_EQ(b.pooledBytes(), 0u);
  EXPECT_EQ(c.pooledBytes(), 4096u);
  a.reset();  // a pool's blocks leave the process total with it
  EXPECT_EQ(ScratchPool::processPooledBytes(), 4096u);
  giveOne(b, kHalf);
  EXPECT_EQ(b.pooledBytes(), kHalf);
  ScratchPool::Block back = b.take(kHalf);  // taken out: no longer pooled
  EXPECT_EQ(ScratchPool::processPooledBytes(), 4096u);
}

}  // namespace
}  // namespace nanoccl::detail
