// The planner: picks one row of the algorithm table (planner.cc) for each collective call.
//
// The choice is a pure function of the call's arguments, the topology (the same on every rank),
// the Config and the link profile (rank 0's, on every rank; collectives/tuning.h checks that
// the settings the planner reads agree), so every rank of a matching call picks the same row
// without talking to the others. It runs on
// the calling thread, before the call is queued, so a bad NANOCCL_ALGO is an argument error of
// that call and does not break the communicator.
#pragma once

#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/tuning.h"
#include "common/config.h"
#include "common/status.h"

namespace nanoccl::detail {

// Every row, grouped by op, in order of preference.
const std::vector<AlgorithmRow>& algorithmTable();

// kInvalidArgument listing the valid names unless `algo` (NANOCCL_ALGO) is "auto", empty or
// the name of some row. Communicator::create() checks it, so a typo fails the group's creation
// rather than its first call.
Status checkAlgorithmName(const std::string& algo);

// config.algo == "auto" (or empty): the first row of args.op whose autoWhen() and supports()
// hold: on a hierarchical topology, "hierarchical" for messages above smallMessageBytes, flat
// rows otherwise. A name: that op's row of that name; kInvalidArgument (listing the valid
// names, and saying why) when no row anywhere has the name or the op's row cannot run this
// call. A name that exists only for other ops (NANOCCL_ALGO=ring and a barrier) leaves this op
// on "auto", as NCCL_ALGO does. Every name but "hierarchical" is flat: NANOCCL_ALGO=ring forces
// the flat ring on a hierarchical topology.
// A call with a codec (args.codec, set by the communicator from NANOCCL_COMPRESSION) takes the
// first lossy row of its op that supports it ("hierarchical" on a hierarchical topology,
// "compressed" on one-rank nodes); a forced lossless row runs it lossless.
Result<const AlgorithmRow*> planAlgorithm(const CallArgs& args, const Topology& topology,
                                          const Config& config);

// What the planner chose for one call.
struct Plan {
  const AlgorithmRow* row = nullptr;
  // The codec of the inter-node leg: args.codec, or what compression "auto" chose (null:
  // lossless), with its params.
  const codec::Codec* codec = nullptr;
  codec::CodecParams codecParams;
  // The chunk of the compressed exchange in float32 bytes (CallArgs::codecChunkBytes); 0:
  // config.chunkBytes.
  size_t codecChunkBytes = 0;
  // The chunk of the call's pipelined passes (ring, chain; on a lossy plan its node stages';
  // CallArgs::chunkBytes); 0: config.chunkBytes.
  size_t chunkBytes = 0;
  // Connections a peer on each rail for the call's large messages (OpFingerprint::lanes):
  // plannedLanes().
  int lanes = 0;
  // The cost model's time for the chosen row (collectives/cost_model.h); infinity without a
  // profile or where the model does not cover the op.
  double predictedSeconds = 0;
};

// The socket count a rail of a call (OpFingerprint::lanes; its tcp messages, inter-node and,
// with intra_transport=tcp, intra-node too), 0 meaning all of them:
// - where the user set nsocks (or there is one): 0;
// - under a profile that measured one connection a peer a rail (inter_one_socket_MBps): 1
//   unless all of them were kMoreSocketsGain faster (kMoreSocketsGainCompressed for a
//   compressed call);
// - else 1 for a compressed call (`compressed`), 0 for a lossless one.
// More connections cost CPU and queueing that the probe does not see, and a compressed call's
// codec competes for that CPU while its wire bytes are a quarter or less: on the emulated
// 1 Gbit/s 2x2 cluster two a peer ran a 256 MB int8 allreduce 2-20% slower than one in 11 of
// 12 pairs (results/tuning/README.md), and on two rails 5-15% slower (results/rails). A
// lossless call keeps them all: one connection a rail did not fill a 100 Mbit/s rail beside a
// 1 Gbit/s one (2-6% slower there, results/rails).
inline constexpr double kMoreSocketsGain = 1.10;
// A compressed call sends a quarter of the bytes or less, so more connections gain it a part
// of a part while costing the CPU its codec needs; and the probe's noise here reached 15%: at
// 1.10 a profile of a 1 Gbit/s link that one connection fills (97 MB/s over two a peer
// against 85 over one) gave int8 calls two a peer, 5-10% slower at 256 MB (results/tuning/).
inline constexpr double kMoreSocketsGainCompressed = 1.25;
int plannedLanes(const Config& config, const LinkProfile* profile, bool compressed);

// The chunks the planner weighs for a compressed exchange, and for a call's ring and chain
// passes (a lossy plan's node stages: every pair of the two): config.chunkBytes first (it
// wins ties), then kChunkCandidates; only config.chunkBytes where the user set it.
inline constexpr size_t kChunkCandidates[] = {size_t{256} << 10, size_t{1} << 20,
                                              size_t{4} << 20};

// planAlgorithm(), and with a link profile (null: none) the cost model: under algo "auto" the
// row with the smallest predicted time among those that support the call, and under
// args.codecAuto the codec (of config.compressionAllow) with it; ops and rows the model does
// not cover keep the rules above; a row also gets the chunk of its passes predicted fastest,
// and a lossy one that of its compressed exchange with it (unless chunk_bytes was set). A
// forced algorithm still wins; with args.codecAuto it gets the codec predicted fastest on it.
// Without a profile, args.codecAuto runs lossless.
Result<Plan> plan(const CallArgs& args, const Topology& topology, const Config& config,
                  const LinkProfile* profile);

// One call priced without a communicator (nanoccl-advise): what a group of `topology` with
// `config` and `profile` would run and how long the cost model says it takes.
struct CallPrediction {
  std::string algorithm;  // the row's name; "direct" for a point-to-point send
  std::string codec;      // "none" unless a lossy row runs it with a codec
  double seconds = 0;     // kNoPrediction (infinity) where the model does not cover it
  // Encoded bytes over float32 bytes of the inter-node leg (1 when lossless).
  double wireRatio = 1;
};

// `op`: "allreduce" and "reduce_scatter" (float32 sums: plan() under the profile, as a live
// group does; `count` elements in all, reduce_scatter split evenly over the ranks),
// "allgather" (`count` elements out, every rank's piece equal) and "broadcast" (the rules' row,
// predictMovementSeconds), "send_inter" and "send_intra" (one message of `count` elements
// between two ranks, with `crossing` ranks of a node sending at once across nodes). `codec`
// (allreduce, reduce_scatter): "" or "none" lossless, else that codec forced on the call, as
// allreduce_compressed or the group's compression setting asks for it (the planner's
// compression_min_bytes rule is the caller's to apply). kInvalidArgument for an unknown op,
// dtype or codec.
Result<CallPrediction> predictCall(const std::string& op, size_t count, DataType dtype,
                                   const std::string& codec, int crossing,
                                   const Topology& topology, const Config& config,
                                   const LinkProfile& profile);

}  // namespace nanoccl::detail
