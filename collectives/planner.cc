#include "collectives/planner.h"

#include <algorithm>
#include <span>
#include <string>

#include "collectives/cost_model.h"

namespace nanoccl::detail {
namespace {

Status anyCall(const CallArgs&, const Topology&) { return Status::ok(); }
bool autoAlways(const CallArgs&, const Topology&, const Config&) { return true; }
bool autoNever(const CallArgs&, const Topology&, const Config&) { return false; }
// Latency-bound sizes: log2(size) rounds beat the ring's 2 x (size - 1) steps.
bool autoSmall(const CallArgs& args, const Topology&, const Config& config) {
  return args.planBytes() <= config.smallMessageBytes;
}

// The board is one node's shared memory, and holds kBoardMessageBytes a rank.
Status boardCall(const CallArgs& args, const Topology& topology) {
  if (topology.numNodes() > 1) {
    return invalidArgument("the ranks are on " + std::to_string(topology.numNodes()) +
                           " nodes (" + topology.describe() +
                           "): the board is one node's shared memory");
  }
  if (args.planBytes() > kBoardMessageBytes) {
    return invalidArgument(std::to_string(args.planBytes()) + " bytes a rank: the board holds " +
                           std::to_string(kBoardMessageBytes));
  }
  return Status::ok();
}
bool autoBoard(const CallArgs& args, const Topology& topology, const Config& config) {
  return topology.numNodes() == 1 &&
         args.planBytes() <= std::min(kBoardMessageBytes, config.smallMessageBytes);
}

// A hierarchical algorithm needs an intra-node stage and an inter-node stage to split into.
Status hierarchicalTopology(const CallArgs&, const Topology& topology) {
  if (topology.hierarchical()) return Status::ok();
  return invalidArgument(
      "the topology is flat (" + topology.describe() +
      "): hierarchical algorithms need more than one node and a node with more than one rank "
      "(ranks with equal NANOCCL_NODE_ID are one node)");
}
// Bandwidth-bound sizes on a hierarchical topology: each byte crosses the node links once per
// node instead of once per rank. Small messages stay on the flat latency-optimal rows, whose
// log2(size) rounds beat the hierarchy's three stages.
bool autoLargeHierarchical(const CallArgs& args, const Topology& topology, const Config& config) {
  return topology.hierarchical() && args.planBytes() > config.smallMessageBytes;
}

// The flat compressed rows: a call with a codec on a topology of one-rank nodes (on a
// hierarchical one, the hierarchical rows compress their inter-node stage instead).
Status compressedFlat(const CallArgs& args, const Topology& topology) {
  if (args.codec == nullptr) {
    return invalidArgument("the call is lossless (compressed rows need NANOCCL_COMPRESSION)");
  }
  if (topology.hierarchical()) {
    return invalidArgument("nodes have several ranks (" + topology.describe() +
                           "): the hierarchical row compresses the inter-node stage");
  }
  return Status::ok();
}

// Device rows (collectives/device/rows.cc) run calls on device memory only, the others only
// calls on host memory.
bool forCall(const AlgorithmRow& row, const CallArgs& args) {
  return row.op == args.op && row.device == (args.device != nullptr);
}
Status deviceOneNode(const CallArgs&, const Topology& topology) {
  if (topology.numNodes() == 1) return Status::ok();
  return invalidArgument("the ranks are on " + std::to_string(topology.numNodes()) + " nodes (" +
                         topology.describe() + "): device_node is one node's stage");
}
Status deviceSeveralNodes(const CallArgs&, const Topology& topology) {
  if (topology.numNodes() > 1) return Status::ok();
  return invalidArgument("the ranks are on one node: device_staged crosses nodes");
}

constexpr bool kLossless = false;
constexpr bool kLossy = true;
constexpr bool kDevice = true;

}  // namespace

const std::vector<AlgorithmRow>& algorithmTable() {
  // One row per (op, algorithm), in order of preference under "auto". Adding an algorithm is
  // adding a row here; nothing else lists them.
  static const std::vector<AlgorithmRow> table = {
      {"board", OpType::kAllreduce,
       "one round on the node's shared memory: every rank publishes its buffer and reduces "
       "everyone's in rank order (one node, up to 64 KiB; recursive doubling without shm)",
       boardCall, autoBoard, allreduceBoard, kLossless},
      {"compressed", OpType::kAllreduce,
       "direct reduce-scatter of encoded segments, each owner encodes its sum once for all "
       "(NANOCCL_COMPRESSION; one rank per node)",
       compressedFlat, autoNever, allreduceCompressed, kLossy},
      {"recursive_doubling", OpType::kAllreduce,
       "log2(size) exchanges of the whole buffer; non-power-of-two sizes fold the extra ranks",
       anyCall, autoSmall, allreduceRecursiveDoubling, kLossless},
      {"hierarchical", OpType::kAllreduce,
       "intra-node reduce-scatter, inter-node allreduce of each shard by its local rank on every "
       "node at once, intra-node allgather",
       hierarchicalTopology, autoLargeHierarchical, allreduceHierarchical, kLossy},
      {"ring", OpType::kAllreduce,
       "ring reduce-scatter + allgather, chunked and pipelined (bandwidth-optimal)", anyCall,
       autoAlways, allreduceRing, kLossless},
      {"tree", OpType::kAllreduce, "binomial-tree reduce to rank 0, then binomial broadcast",
       anyCall, autoNever, allreduceTree, kLossless},

      {"tree", OpType::kReduce, "binomial tree toward the root", anyCall, autoSmall, reduceTree, kLossless},
      {"ring", OpType::kReduce, "ring reduce-scatter, then each segment to the root", anyCall,
       autoAlways, reduceRing, kLossless},

      {"board", OpType::kBroadcast,
       "one round on the node's shared memory: the root publishes, every rank copies (one "
       "node, up to 64 KiB; the tree without shm)",
       boardCall, autoBoard, broadcastBoard, kLossless},
      {"tree", OpType::kBroadcast, "binomial tree from the root", anyCall, autoSmall,
       broadcastTree, kLossless},
      {"hierarchical", OpType::kBroadcast,
       "the root hands one shard to each local rank, each shard is broadcast across nodes by "
       "its local rank at once, intra-node allgather",
       hierarchicalTopology, autoLargeHierarchical, broadcastHierarchical, kLossless},
      {"ring", OpType::kBroadcast, "pipelined chain of chunks from the root", anyCall, autoAlways,
       broadcastRing, kLossless},

      {"hierarchical", OpType::kAllgather,
       "each node's pieces sharded over its local ranks, inter-node allgather of each shard by "
       "its local rank on every node at once, intra-node allgather",
       hierarchicalTopology, autoLargeHierarchical, allgatherHierarchical, kLossless},
      {"ring", OpType::kAllgather, "ring, chunked and pipelined; uneven counts", anyCall,
       autoAlways, allgatherRing, kLossless},
      {"compressed", OpType::kReduceScatter,
       "every segment straight to its owner, encoded (NANOCCL_COMPRESSION; one rank per node)",
       compressedFlat, autoNever, reduceScatterCompressed, kLossy},
      {"hierarchical", OpType::kReduceScatter,
       "intra-node reduce-scatter of every node's shards, inter-node reduce-scatter of each "
       "shard by its local rank on every node at once, shards to their ranks within the node",
       hierarchicalTopology, autoLargeHierarchical, reduceScatterHierarchical, kLossy},
      {"ring", OpType::kReduceScatter, "ring, chunked and pipelined; uneven counts", anyCall,
       autoAlways, reduceScatterRing, kLossless},
      {"pairwise", OpType::kAlltoall, "every receive posted, then sends to rank+1, rank+2, ...",
       anyCall, autoAlways, alltoallPairwise, kLossless},
      {"direct", OpType::kGather, "every rank sends to the root", anyCall, autoAlways,
       gatherDirect, kLossless},
      {"direct", OpType::kScatter, "the root sends to every rank", anyCall, autoAlways,
       scatterDirect, kLossless},
      {"board", OpType::kBarrier,
       "one round on the node's shared memory (one node; dissemination without shm)", boardCall,
       autoBoard, barrierBoard, kLossless},
      {"dissemination", OpType::kBarrier, "ceil(log2(size)) rounds of 1-byte signals", anyCall,
       autoAlways, barrierDissemination, kLossless},
      // Calls on device memory (CallArgs::device): one node stage on one node, staged through
      // host memory across nodes.
      {"device_node", OpType::kAllreduce, "one node stage (NCCL on CUDA)", deviceOneNode,
       autoAlways, allreduceDeviceNode, kLossless, kDevice},
      {"device_staged", OpType::kAllreduce,
       "node reduce-scatter, each shard across nodes through host chunks (under a codec: "
       "compressed there only), node allgather",
       deviceSeveralNodes, autoAlways, allreduceDeviceStaged, kLossy, kDevice},
      {"device_node", OpType::kBroadcast, "one node stage (NCCL on CUDA)", deviceOneNode,
       autoAlways, broadcastDeviceNode, kLossless, kDevice},
      {"device_staged", OpType::kBroadcast, "the root's bytes through host memory, host broadcast",
       deviceSeveralNodes, autoAlways, broadcastDeviceStaged, kLossless, kDevice},
      {"device_node", OpType::kAllgather, "one node stage (NCCL on CUDA)", deviceOneNode,
       autoAlways, allgatherDeviceNode, kLossless, kDevice},
      {"device_staged", OpType::kAllgather, "through host memory, host allgather",
       deviceSeveralNodes, autoAlways, allgatherDeviceStaged, kLossless, kDevice},
      {"device_node", OpType::kReduceScatter, "one node stage (NCCL on CUDA)", deviceOneNode,
       autoAlways, reduceScatterDeviceNode, kLossless, kDevice},
      {"device_staged", OpType::kReduceScatter, "through host memory, host reduce_scatter",
       deviceSeveralNodes, autoAlways, reduceScatterDeviceStaged, kLossless, kDevice},
  };
  return table;
}

Status checkAlgorithmName(const std::string& algo) {
  if (algo.empty() || algo == "auto") return Status::ok();
  std::vector<std::string> names;
  for (const AlgorithmRow& row : algorithmTable()) {
    if (algo == row.name) return Status::ok();
    if (std::find(names.begin(), names.end(), row.name) == names.end()) {
      names.push_back(row.name);
    }
  }
  std::string all = "auto";
  for (const std::string& name : names) all += ", " + name;
  return invalidArgument("unknown algorithm '" + algo + "' (NANOCCL_ALGO); valid names: " + all);
}

Result<const AlgorithmRow*> planAlgorithm(const CallArgs& args, const Topology& topology,
                                          const Config& config) {
  const std::vector<AlgorithmRow>& table = algorithmTable();
  const std::string& want = config.algo;
  const bool forced = !(want.empty() || want == "auto");
  if (forced) {
    bool known = false;
    std::string forOp;
    const AlgorithmRow* named = nullptr;
    for (const AlgorithmRow& row : table) {
      if (want == row.name) known = true;
      if (!forCall(row, args)) continue;
      forOp += std::string(", ") + row.name;
      if (want == row.name) named = &row;
    }
    if (named != nullptr) {
      const Status why = named->supports(args, topology);
      if (why.isOk()) return named;
      return invalidArgument("algorithm '" + want + "' (NANOCCL_ALGO) cannot run this " +
                             opTypeName(args.op) + ": " + why.message() + "; valid for " +
                             opTypeName(args.op) + ": auto" + forOp);
    }
    if (!known) return checkAlgorithmName(want);
    // Known, but only for other ops: this op stays on "auto".
  }
  // A call with a codec takes the first lossy row that can run it: the size threshold was
  // applied already (NANOCCL_COMPRESSION_MIN_BYTES), so the small-message rows do not apply.
  if (args.codec != nullptr) {
    for (const AlgorithmRow& row : table) {
      if (forCall(row, args) && row.lossy && row.supports(args, topology).isOk()) return &row;
    }
  }
  for (const AlgorithmRow& row : table) {
    if (forCall(row, args) && row.autoWhen(args, topology, config) &&
        row.supports(args, topology).isOk()) {
      return &row;
    }
  }
  return internalError(std::string("no algorithm for ") + opTypeName(args.op));
}

namespace {

// The codecs compression "auto" may take for this call (null: lossless), with their params.
std::vector<std::pair<const codec::Codec*, codec::CodecParams>> codecChoices(
    const CallArgs& args, const Config& config) {
  std::vector<std::pair<const codec::Codec*, codec::CodecParams>> out;
  if (!args.codecAuto) {
    out.emplace_back(args.codec, args.codecParams);
    return out;
  }
  Result<std::vector<std::string>> names = splitCodecList(config.compressionAllow);
  if (!names.isOk()) return {{nullptr, {}}};  // checked when the setting was read
  for (const std::string& name : names.value()) {
    if (name == "none") {
      out.emplace_back(nullptr, codec::CodecParams{});
      continue;
    }
    Result<const codec::Codec*> c = codec::findCodec(name);
    if (!c.isOk()) continue;
    codec::CodecParams params;
    params.blockSize = static_cast<uint32_t>(config.compressionBlock);
    if (!codec::resolveBlockSize(*c.value(), params).isOk()) continue;
    out.emplace_back(c.value(), params);
  }
  return out;
}

}  // namespace

int plannedLanes(const Config& config, const LinkProfile* profile, bool compressed) {
  if (config.nsocks < 2 || config.nsocksSet) return 0;
  if (profile == nullptr || profile->inter.oneSocketMBps <= 0) return compressed ? 1 : 0;
  const double gain = compressed ? kMoreSocketsGainCompressed : kMoreSocketsGain;
  return profile->inter.nodeMBps > gain * profile->inter.oneSocketMBps ? 0 : 1;
}

Result<Plan> plan(const CallArgs& args, const Topology& topology, const Config& config,
                  const LinkProfile* profile) {
  Result<const AlgorithmRow*> rules = planAlgorithm(args, topology, config);
  Plan out;
  out.codec = args.codecAuto ? nullptr : args.codec;
  out.codecParams = args.codecParams;
  if (!rules.isOk() && args.codecAuto) {
    // A forced row that needs a codec (NANOCCL_ALGO=compressed): the first allowed one.
    for (const auto& [codec, params] : codecChoices(args, config)) {
      if (codec == nullptr) continue;
      CallArgs trial = args;
      trial.codec = codec;
      trial.codecParams = params;
      Result<const AlgorithmRow*> again = planAlgorithm(trial, topology, config);
      if (again.isOk()) {
        rules = again;
        out.codec = codec;
        out.codecParams = params;
        break;
      }
    }
  }
  NANOCCL_ASSIGN_OR_RETURN(const AlgorithmRow* ruled, std::move(rules));
  out.row = ruled;
  out.predictedSeconds = kNoPrediction;
  out.lanes = plannedLanes(config, profile, out.codec != nullptr && ruled->lossy);
  if (profile == nullptr) return out;
  const bool forced = !(config.algo.empty() || config.algo == "auto") &&
                      std::string(ruled->name) == config.algo;
  // A fixed codec keeps the row the rules gave it (the one lossy row that can run it).
  const bool fixedCodec = !args.codecAuto && args.codec != nullptr;
  std::vector<size_t> chunks = {config.chunkBytes};
  if (!config.chunkBytesSet) {
    for (size_t c : kChunkCandidates) {
      if (c != config.chunkBytes) chunks.push_back(c);
    }
  }
  CallArgs trial = args;
  for (const auto& [codec, params] : codecChoices(args, config)) {
    trial.codec = codec;
    trial.codecParams = params;
    trial.lanes = plannedLanes(config, profile, codec != nullptr);
    for (const AlgorithmRow& row : algorithmTable()) {
      if (!forCall(row, args)) continue;
      if ((forced || fixedCodec) && &row != ruled) continue;
      if (codec != nullptr && !row.lossy) continue;
      if (!row.supports(trial, topology).isOk()) continue;
      // A lossless plan has one chunk, that of all its passes; a lossy one two: its
      // compressed exchange's and its node stages' passes'.
      const bool lossy = codec != nullptr && row.lossy;
      for (size_t chunk : chunks) {
        trial.codecChunkBytes = lossy ? chunk : 0;
        const std::span<const size_t> passChunks =
            lossy ? std::span<const size_t>(chunks) : std::span<const size_t>(&chunk, 1);
        for (size_t passes : passChunks) {
          const double t = predictSeconds(row, trial, topology, *profile, passes);
          if (t < out.predictedSeconds) {
            out.row = &row;
            out.codec = codec;
            out.codecParams = params;
            out.codecChunkBytes = trial.codecChunkBytes;
            out.chunkBytes = passes == config.chunkBytes ? 0 : passes;
            out.lanes = trial.lanes;
            out.predictedSeconds = t;
          }
        }
      }
    }
  }
  return out;
}

namespace {

Status setCodec(CallArgs& args, const std::string& name, const Config& config) {
  if (name.empty() || name == "none") return Status::ok();
  NANOCCL_ASSIGN_OR_RETURN(const codec::Codec* c, codec::findCodec(name));
  codec::CodecParams params;
  params.blockSize = static_cast<uint32_t>(config.compressionBlock);
  NANOCCL_CHECK(codec::resolveBlockSize(*c, params).status());
  args.codec = c;
  args.codecParams = params;
  return Status::ok();
}

// The counts of a call whose `total` elements are split evenly (the remainder on the first).
std::vector<size_t> evenCounts(size_t total, int size) {
  std::vector<size_t> counts(static_cast<size_t>(size), total / static_cast<size_t>(size));
  counts[0] += total % static_cast<size_t>(size);
  return counts;
}

}  // namespace

Result<CallPrediction> predictCall(const std::string& op, size_t count, DataType dtype,
                                   const std::string& codec, int crossing,
                                   const Topology& topology, const Config& config,
                                   const LinkProfile& profile) {
  CallPrediction out;
  if (op == "send_inter" || op == "send_intra") {
    if (!codec.empty() && codec != "none") {
      return invalidArgument("point-to-point messages are not compressed (codec '" + codec + "')");
    }
    out.algorithm = "direct";
    out.codec = "none";
    out.seconds = predictSendSeconds(static_cast<double>(count) * dataTypeSize(dtype),
                                     op == "send_inter", std::max(crossing, 1), profile);
    return out;
  }
  CallArgs args;
  args.dtype = dtype;
  args.redop = ReduceOp::kSum;
  if (op == "allreduce") {
    args.op = OpType::kAllreduce;
    args.count = count;
  } else if (op == "reduce_scatter" || op == "allgather") {
    args.op = op == "allgather" ? OpType::kAllgather : OpType::kReduceScatter;
    args.counts = evenCounts(count, topology.size());
    args.count = args.counts[0];
  } else if (op == "broadcast") {
    args.op = OpType::kBroadcast;
    args.count = count;
    args.root = 0;
  } else {
    return invalidArgument("unknown op '" + op +
                           "': allreduce, reduce_scatter, allgather, broadcast, send_inter, "
                           "send_intra");
  }
  const bool reduces = args.op == OpType::kAllreduce || args.op == OpType::kReduceScatter;
  if (!reduces && !codec.empty() && codec != "none") {
    return invalidArgument(op + " is not compressed (codec '" + codec + "')");
  }
  NANOCCL_CHECK(setCodec(args, codec, config));
  // As the communicator does: a codec only where there is an inter-node leg.
  if (topology.numNodes() < 2) args.codec = nullptr;
  NANOCCL_ASSIGN_OR_RETURN(Plan p, plan(args, topology, config, &profile));
  out.algorithm = p.row->name;
  const bool lossy = p.codec != nullptr && p.row->lossy;
  out.codec = lossy ? p.codec->name : "none";
  if (lossy) {
    const size_t n = std::max<size_t>(count, 1);
    out.wireRatio = static_cast<double>(p.codec->encodedBytes(n, p.codecParams)) / (4.0 * n);
  }
  out.seconds = reduces ? p.predictedSeconds
                        : predictMovementSeconds(*p.row, args, topology, profile,
                                                 config.chunkBytes);
  if (topology.size() < 2) out.seconds = 0;
  return out;
}

}  // namespace nanoccl::detail
