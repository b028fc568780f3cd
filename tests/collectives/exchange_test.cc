// allgather, reduce_scatter (uneven counts), alltoall (split sizes), barrier.
#include <numeric>

#include "tests/collectives/test_util.h"

namespace nanoccl::colltest {
namespace {

std::vector<size_t> offsetsOf(const std::vector<size_t>& counts) {
  std::vector<size_t> o(counts.size(), 0);
  for (size_t r = 1; r < counts.size(); ++r) o[r] = o[r - 1] + counts[r - 1];
  return o;
}

size_t sumOf(const std::vector<size_t>& v) {
  return std::accumulate(v.begin(), v.end(), size_t{0});
}

// Per-rank counts in three shapes: equal, uneven, and uneven with empty ranks.
// Large counts only use the equal split: the point there is the pipeline, not the shapes.
std::vector<std::vector<size_t>> countPatterns(size_t count, int n) {
  std::vector<std::vector<size_t>> out;
  out.push_back(std::vector<size_t>(n, count));
  if (count == 0 || count > 100000) return out;
  std::vector<size_t> uneven(n), holes(n);
  for (int r = 0; r < n; ++r) {
    uneven[r] = count + static_cast<size_t>(r) * (count / 4 + 1);
    holes[r] = r % 2 == 1 ? 0 : count + static_cast<size_t>(r);
  }
  out.push_back(uneven);
  out.push_back(holes);
  return out;
}

std::string countsText(const std::vector<size_t>& counts) {
  std::string s = "counts";
  for (size_t c : counts) s += " " + std::to_string(c);
  return s;
}

class AllgatherTest : public ::testing::TestWithParam<Case> {};

TEST_P(AllgatherTest, EveryRankGetsEveryPiece) {
  const Case& c = GetParam();
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldFor(c), comms);
  const int n = c.size;
  auto value = [](DataType t, int r, size_t j) {
    return inputValue(t, ReduceOp::kSum, r * 17 + 3, j);
  };
  int variant = 0;
  for (const std::vector<size_t>& counts : countPatterns(c.count, n)) {
    const std::vector<size_t> offs = offsetsOf(counts);
    const size_t total = sumOf(counts);
    for (DataType t : dataTypesFor(c)) {
      // Every other run is "in place": the send buffer is the rank's slot in recv.
      const bool inPlace = (variant++ % 2) == 1;
      SCOPED_TRACE(std::string(dataTypeName(t)) + " " + countsText(counts) +
                   (inPlace ? " in place" : ""));
      const size_t es = dataTypeSize(t);
      std::vector<std::vector<char>> sends, recvs;
      for (int r = 0; r < n; ++r) {
        sends.push_back(makeBuffer(t, counts[r], [&](size_t j) { return value(t, r, j); }));
        recvs.emplace_back(std::max<size_t>(total, 1) * es, 0);
        if (inPlace && counts[r] > 0) {
          std::memcpy(recvs[r].data() + offs[r] * es, sends[r].data(), counts[r] * es);
        }
      }
      std::vector<std::shared_ptr<Task>> tasks;
      for (int r = 0; r < n; ++r) {
        const void* send = inPlace ? recvs[r].data() + offs[r] * es : sends[r].data();
        tasks.push_back(comms[r]->allgather(send, counts[r], recvs[r].data(), counts, t));
      }
      expectAllOk(tasks);
      for (int r = 0; r < n; ++r) {
        for (int q = 0; q < n; ++q) {
          expectBuffer(
              t, recvs[r].data() + offs[q] * es, counts[q],
              [&](size_t j) { return value(t, q, j); },
              "rank " + std::to_string(r) + ", piece of rank " + std::to_string(q));
        }
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, AllgatherTest,
                         ::testing::ValuesIn(standardCases({"ring"}, kLargeCount)), caseName);

class ReduceScatterTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReduceScatterTest, EveryRankGetsItsReducedPart) {
  const Case& c = GetParam();
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldFor(c), comms);
  const int n = c.size;
  const std::vector<std::vector<size_t>> patterns = countPatterns(c.count, n);
  int k = 0;
  for (const Combo& combo : combosFor(c)) {
    // Rotate through the count shapes.
    const std::vector<size_t>& counts = patterns[k++ % patterns.size()];
    SCOPED_TRACE(comboName(combo) + " " + countsText(counts));
    const DataType t = combo.dtype;
    const ReduceOp op = combo.op;
    const size_t es = dataTypeSize(t);
    const std::vector<size_t> offs = offsetsOf(counts);
    const size_t total = sumOf(counts);
    std::vector<std::vector<char>> sends, recvs;
    for (int r = 0; r < n; ++r) {
      sends.push_back(makeBuffer(t, total, [&](size_t i) { return inputValue(t, op, r, i); }));
      recvs.emplace_back(std::max<size_t>(counts[r], 1) * es, 0);
    }
    const std::vector<std::vector<char>> sendCopies = sends;
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      tasks.push_back(
          comms[r]->reduceScatter(sends[r].data(), recvs[r].data(), counts, t, op, kPremulFactor));
    }
    expectAllOk(tasks);
    for (int r = 0; r < n; ++r) {
      expectBuffer(
          t, recvs[r].data(), counts[r],
          [&](size_t j) {
            return referenceReduce(t, op, n,
                                   [&](int q) { return inputValue(t, op, q, offs[r] + j); });
          },
          "rank " + std::to_string(r));
      EXPECT_EQ(sends[r], sendCopies[r]) << "rank " << r << "'s send buffer was modified";
    }
    if (::testing::Test::HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, ReduceScatterTest,
                         ::testing::ValuesIn(standardCases({"ring"}, kLargeCount)), caseName);

class AlltoallTest : public ::testing::TestWithParam<Case> {};

// Elements rank `from` sends to rank `to`: uneven, with empty pairs at small counts.
size_t splitCount(size_t count, int n, int from, int to) {
  if (count == 0) return 0;
  return count / n + static_cast<size_t>((from + 2 * to) % 3);
}

TEST_P(AlltoallTest, EveryPairExchangesItsPiece) {
  const Case& c = GetParam();
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldFor(c), comms);
  const int n = c.size;
  auto value = [](DataType t, int from, int to, size_t j) {
    return inputValue(t, ReduceOp::kSum, from * 31 + to, j);
  };
  for (DataType t : dataTypesFor(c)) {
    SCOPED_TRACE(dataTypeName(t));
    const size_t es = dataTypeSize(t);
    std::vector<std::vector<size_t>> sendCounts(n, std::vector<size_t>(n)),
        recvCounts(n, std::vector<size_t>(n));
    std::vector<std::vector<char>> sends, recvs;
    for (int r = 0; r < n; ++r) {
      for (int p = 0; p < n; ++p) {
        sendCounts[r][p] = splitCount(c.count, n, r, p);
        recvCounts[r][p] = splitCount(c.count, n, p, r);
      }
      std::vector<char> s(std::max<size_t>(sumOf(sendCounts[r]), 1) * es);
      size_t at = 0;
      for (int p = 0; p < n; ++p) {
        for (size_t j = 0; j < sendCounts[r][p]; ++j)
          writeValue(t, s.data(), at++, value(t, r, p, j));
      }
      sends.push_back(std::move(s));
      recvs.emplace_back(std::max<size_t>(sumOf(recvCounts[r]), 1) * es, 0);
    }
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      tasks.push_back(
          comms[r]->alltoall(sends[r].data(), sendCounts[r], recvs[r].data(), recvCounts[r], t));
    }
    expectAllOk(tasks);
    for (int r = 0; r < n; ++r) {
      const std::vector<size_t> offs = offsetsOf(recvCounts[r]);
      for (int p = 0; p < n; ++p) {
        expectBuffer(
            t, recvs[r].data() + offs[p] * es, recvCounts[r][p],
            [&](size_t j) { return value(t, p, r, j); },
            "rank " + std::to_string(r) + ", piece from rank " + std::to_string(p));
      }
    }
    if (::testing::Test::HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, AlltoallTest,
                         ::testing::ValuesIn(standardCases({"pairwise"}, kLargeCount / 4)),
                         caseName);

class BarrierTest : public ::testing::TestWithParam<Case> {};

// No rank leaves a barrier before every rank has entered it.
TEST_P(BarrierTest, NoRankLeavesEarly) {
  const Case& c = GetParam();
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldFor(c), comms);
  const int n = c.size;
  constexpr int kRounds = 5;
  std::atomic<int> entered[kRounds] = {};
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (int k = 0; k < kRounds; ++k) {
        // Ranks arrive at different times; the last one decides when everyone leaves.
        std::this_thread::sleep_for(std::chrono::milliseconds((r * 7 + k * 3) % 11));
        entered[k]++;
        const Status s = comms[r]->barrier()->wait(Deadline::after(std::chrono::seconds(60)));
        if (!s.isOk()) {
          errors[r] = s.toString();
          return;
        }
        if (entered[k].load() != n) {
          errors[r] = "left barrier " + std::to_string(k) + " with only " +
                      std::to_string(entered[k].load()) + " ranks entered";
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

std::vector<Case> barrierCases() {
  std::vector<Case> out;
  for (const std::string engine : {"epoll", "uring"}) {
    for (int size : {1, 2, 3, 4, 5, 8}) out.push_back({engine, size, 0, "auto", 0, false});
  }
  out.push_back({"epoll", 3, 0, "dissemination", 0, false});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Matrix, BarrierTest, ::testing::ValuesIn(barrierCases()), caseName);

}  // namespace
}  // namespace nanoccl::colltest
