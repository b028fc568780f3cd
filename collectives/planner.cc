#include "collectives/planner.h"

#include <algorithm>
#include <string>

namespace nanoccl::detail {
namespace {

bool anyCall(const CallArgs&, int) { return true; }
bool autoAlways(const CallArgs&, int, const Config&) { return true; }
bool autoNever(const CallArgs&, int, const Config&) { return false; }
// Latency-bound sizes: log2(size) rounds beat the ring's 2 x (size - 1) steps.
bool autoSmall(const CallArgs& args, int, const Config& config) {
  return args.planBytes() <= config.smallMessageBytes;
}

}  // namespace

const std::vector<AlgorithmRow>& algorithmTable() {
  // One row per (op, algorithm), in order of preference under "auto". Adding an algorithm is
  // adding a row here; nothing else lists them.
  static const std::vector<AlgorithmRow> table = {
      {"recursive_doubling", OpType::kAllreduce,
       "log2(size) exchanges of the whole buffer; non-power-of-two sizes fold the extra ranks",
       anyCall, autoSmall, allreduceRecursiveDoubling},
      {"ring", OpType::kAllreduce,
       "ring reduce-scatter + allgather, chunked and pipelined (bandwidth-optimal)", anyCall,
       autoAlways, allreduceRing},
      {"tree", OpType::kAllreduce, "binomial-tree reduce to rank 0, then binomial broadcast",
       anyCall, autoNever, allreduceTree},

      {"tree", OpType::kReduce, "binomial tree toward the root", anyCall, autoSmall, reduceTree},
      {"ring", OpType::kReduce, "ring reduce-scatter, then each segment to the root", anyCall,
       autoAlways, reduceRing},

      {"tree", OpType::kBroadcast, "binomial tree from the root", anyCall, autoSmall,
       broadcastTree},
      {"ring", OpType::kBroadcast, "pipelined chain of chunks from the root", anyCall, autoAlways,
       broadcastRing},

      {"ring", OpType::kAllgather, "ring, chunked and pipelined; uneven counts", anyCall,
       autoAlways, allgatherRing},
      {"ring", OpType::kReduceScatter, "ring, chunked and pipelined; uneven counts", anyCall,
       autoAlways, reduceScatterRing},
      {"pairwise", OpType::kAlltoall, "every receive posted, then sends to rank+1, rank+2, ...",
       anyCall, autoAlways, alltoallPairwise},
      {"direct", OpType::kGather, "every rank sends to the root", anyCall, autoAlways,
       gatherDirect},
      {"direct", OpType::kScatter, "the root sends to every rank", anyCall, autoAlways,
       scatterDirect},
      {"dissemination", OpType::kBarrier, "ceil(log2(size)) rounds of 1-byte signals", anyCall,
       autoAlways, barrierDissemination},
  };
  return table;
}

Result<const AlgorithmRow*> planAlgorithm(const CallArgs& args, int size, const Config& config) {
  const std::vector<AlgorithmRow>& table = algorithmTable();
  const std::string& want = config.algo;
  const bool forced = !(want.empty() || want == "auto");
  if (forced) {
    bool known = false;
    std::string forOp;
    const AlgorithmRow* named = nullptr;
    for (const AlgorithmRow& row : table) {
      if (want == row.name) known = true;
      if (row.op != args.op) continue;
      forOp += std::string(", ") + row.name;
      if (want == row.name) named = &row;
    }
    if (named != nullptr) {
      if (named->supports(args, size)) return named;
      return invalidArgument("algorithm '" + want + "' (NANOCCL_ALGO) cannot run this " +
                             opTypeName(args.op) + "; valid for " + opTypeName(args.op) + ": auto" +
                             forOp);
    }
    if (!known) {
      std::vector<std::string> names;
      for (const AlgorithmRow& row : table) {
        if (std::find(names.begin(), names.end(), row.name) == names.end()) {
          names.push_back(row.name);
        }
      }
      std::string all = "auto";
      for (const std::string& name : names) all += ", " + name;
      return invalidArgument("unknown algorithm '" + want +
                             "' (NANOCCL_ALGO); valid names: " + all);
    }
    // Known, but only for other ops: this op stays on "auto".
  }
  for (const AlgorithmRow& row : table) {
    if (row.op == args.op && row.autoWhen(args, size, config) && row.supports(args, size)) {
      return &row;
    }
  }
  return internalError(std::string("no algorithm for ") + opTypeName(args.op));
}

}  // namespace nanoccl::detail
