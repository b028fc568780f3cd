// reduce, broadcast, gather, scatter: the root moves through the ranks from one dtype to the
// next, so every suite instance also covers several roots.
#include <numeric>

#include "tests/collectives/test_util.h"

namespace nanoccl::colltest {
namespace {

class ReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReduceTest, MatchesReferenceOnRootOthersUnchanged) {
  const Case& c = GetParam();
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldFor(c), comms);
  const int n = c.size;
  int k = 0;
  for (const Combo& combo : combosFor(c)) {
    const int root = (k++ * 2 + 1) % n;
    SCOPED_TRACE(comboName(combo) + " root " + std::to_string(root));
    const DataType t = combo.dtype;
    const ReduceOp op = combo.op;
    std::vector<std::vector<char>> bufs, inputs;
    for (int r = 0; r < n; ++r) {
      inputs.push_back(makeBuffer(t, c.count, [&](size_t i) { return inputValue(t, op, r, i); }));
      bufs.push_back(inputs.back());
    }
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      tasks.push_back(comms[r]->reduce(bufs[r].data(), c.count, t, op, root, kPremulFactor));
    }
    expectAllOk(tasks);
    expectBuffer(
        t, bufs[root].data(), c.count,
        [&](size_t i) {
          return referenceReduce(t, op, n, [&](int q) { return inputValue(t, op, q, i); });
        },
        "root " + std::to_string(root));
    for (int r = 0; r < n; ++r) {
      if (r != root) {
        EXPECT_EQ(bufs[r], inputs[r]) << "non-root rank " << r << " was modified";
      }
    }
    if (::testing::Test::HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, ReduceTest,
                         ::testing::ValuesIn(standardCases({"tree", "ring"}, kLargeCount)),
                         caseName);

class BroadcastTest : public ::testing::TestWithParam<Case> {};

TEST_P(BroadcastTest, EveryRankGetsRootsData) {
  const Case& c = GetParam();
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldFor(c), comms);
  const int n = c.size;
  int k = 0;
  for (DataType t : dataTypesFor(c)) {
    const int root = (k++ * 3 + n - 1) % n;
    SCOPED_TRACE(std::string(dataTypeName(t)) + " root " + std::to_string(root));
    std::vector<std::vector<char>> bufs;
    for (int r = 0; r < n; ++r) {
      bufs.push_back(
          makeBuffer(t, c.count, [&](size_t i) { return inputValue(t, ReduceOp::kSum, r, i); }));
    }
    const std::vector<char> expected = bufs[root];
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r)
      tasks.push_back(comms[r]->broadcast(bufs[r].data(), c.count, t, root));
    expectAllOk(tasks);
    for (int r = 0; r < n; ++r) EXPECT_EQ(bufs[r], expected) << "rank " << r;
    if (::testing::Test::HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, BroadcastTest,
                         ::testing::ValuesIn(standardCases({"tree", "ring"}, kLargeCount)),
                         caseName);

// Rank r's piece: uneven, with empty pieces for small counts.
size_t pieceCount(size_t count, int n, int r) {
  if (count == 0) return 0;
  return count / n + static_cast<size_t>((r * 2 + 1) % 3);
}

Value pieceValue(DataType t, int r, size_t j) {
  return inputValue(t, ReduceOp::kSum, r * 13 + 5, j);
}

class GatherTest : public ::testing::TestWithParam<Case> {};

TEST_P(GatherTest, RootGetsEveryPiece) {
  const Case& c = GetParam();
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldFor(c), comms);
  const int n = c.size;
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = pieceCount(c.count, n, r);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const std::vector<size_t> offs = [&] {
    std::vector<size_t> o(n, 0);
    for (int r = 1; r < n; ++r) o[r] = o[r - 1] + counts[r - 1];
    return o;
  }();
  int k = 0;
  for (DataType t : dataTypesFor(c)) {
    const int root = (k++ + 1) % n;
    SCOPED_TRACE(std::string(dataTypeName(t)) + " root " + std::to_string(root));
    std::vector<std::vector<char>> sends;
    for (int r = 0; r < n; ++r) {
      sends.push_back(makeBuffer(t, counts[r], [&](size_t j) { return pieceValue(t, r, j); }));
    }
    std::vector<char> recv(std::max<size_t>(total, 1) * dataTypeSize(t), 0);
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      // Non-roots pass no receive counts: only the root needs them.
      tasks.push_back(comms[r]->gather(sends[r].data(), counts[r],
                                       r == root ? recv.data() : nullptr,
                                       r == root ? counts : std::vector<size_t>{}, t, root));
    }
    expectAllOk(tasks);
    for (int r = 0; r < n; ++r) {
      expectBuffer(
          t, recv.data() + offs[r] * dataTypeSize(t), counts[r],
          [&](size_t j) { return pieceValue(t, r, j); }, "piece of rank " + std::to_string(r));
    }
    if (::testing::Test::HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, GatherTest,
                         ::testing::ValuesIn(standardCases({"direct"}, kLargeCount)), caseName);

class ScatterTest : public ::testing::TestWithParam<Case> {};

TEST_P(ScatterTest, EveryRankGetsItsPiece) {
  const Case& c = GetParam();
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldFor(c), comms);
  const int n = c.size;
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = pieceCount(c.count, n, r);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  int k = 0;
  for (DataType t : dataTypesFor(c)) {
    const int root = (k++ + n - 1) % n;
    SCOPED_TRACE(std::string(dataTypeName(t)) + " root " + std::to_string(root));
    // The root's send buffer: rank r's piece back to back.
    std::vector<char> send(std::max<size_t>(total, 1) * dataTypeSize(t));
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      for (size_t j = 0; j < counts[r]; ++j) writeValue(t, send.data(), at++, pieceValue(t, r, j));
    }
    std::vector<std::vector<char>> recvs;
    for (int r = 0; r < n; ++r)
      recvs.emplace_back(std::max<size_t>(counts[r], 1) * dataTypeSize(t), 0);
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      tasks.push_back(comms[r]->scatter(r == root ? send.data() : nullptr,
                                        r == root ? counts : std::vector<size_t>{}, recvs[r].data(),
                                        counts[r], t, root));
    }
    expectAllOk(tasks);
    for (int r = 0; r < n; ++r) {
      expectBuffer(
          t, recvs[r].data(), counts[r], [&](size_t j) { return pieceValue(t, r, j); },
          "rank " + std::to_string(r));
    }
    if (::testing::Test::HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, ScatterTest,
                         ::testing::ValuesIn(standardCases({"direct"}, kLargeCount)), caseName);

}  // namespace
}  // namespace nanoccl::colltest
