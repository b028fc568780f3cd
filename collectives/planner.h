// The planner: picks one row of the algorithm table (planner.cc) for each collective call.
//
// The choice is a pure function of the call's arguments, the topology (the same on every rank),
// the Config and the link profile (rank 0's, on every rank; collectives/tuning.h checks that
// the settings the planner reads agree), so every rank of a matching call picks the same row
// without talking to the others. It runs on
// the calling thread, before the call is queued, so a bad NANOCCL_ALGO is an argument error of
// that call and does not break the communicator.
#pragma once

#include <vector>

#include "collectives/algorithm.h"
#include "collectives/tuning.h"
#include "common/config.h"
#include "common/status.h"

namespace nanoccl::detail {

// Every row, grouped by op, in order of preference.
const std::vector<AlgorithmRow>& algorithmTable();

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
  // The cost model's time for the chosen row (collectives/cost_model.h); infinity without a
  // profile or where the model does not cover the op.
  double predictedSeconds = 0;
};

// planAlgorithm(), and with a link profile (null: none) the cost model: under algo "auto" the
// row with the smallest predicted time among those that support the call, and under
// args.codecAuto the codec (of config.compressionAllow) with it; ops and rows the model does
// not cover keep the rules above. A forced algorithm still wins; with args.codecAuto it gets
// the codec predicted fastest on it. Without a profile, args.codecAuto runs lossless.
Result<Plan> plan(const CallArgs& args, const Topology& topology, const Config& config,
                  const LinkProfile* profile);

}  // namespace nanoccl::detail
