// Tuning, part two: the cost model (shared/DESIGN.md "Tuning").
//
// From a LinkProfile (collectives/tuning.h), the predicted time of one call on one row of the
// algorithm table, with or without a codec on the inter-node leg. The terms, per rank:
//   a message on a link class     alpha + bytes / beta, where beta is the pair's bandwidth, or
//                                 the node's divided by the ranks of a node that cross at once
//                                 (over one connection a peer, args.lanes == 1: the node's
//                                 one-socket rate so divided)
//   a ring pass                   (ranks - 1) x chunks x (alpha + chunk / beta): every link
//                                 carries ranks - 1 segments, chunk after chunk
//   reductions and codecs         bytes / (rate x cpu_share), where the profile's rates are one
//                                 core's and cpu_share the core a rank can count on
//   the hierarchy's pipeline      its three stages overlap over blocks: the slowest stage,
//                                 plus the others' time for one block
//   a compressed stage            the wire and the codec overlap over chunks likewise; each
//                                 chunk message pays alpha, and each round's turn (the owner's
//                                 work on its last chunk before the sums go back) is exposed
// It is a model, not a measurement: it ranks the rows, and nanoccl.stats() shows its
// predictions beside the measured times so that drift is visible.
#pragma once

#include <limits>
#include <string>

#include "collectives/algorithm.h"
#include "collectives/topology.h"
#include "collectives/tuning.h"

namespace nanoccl::detail {

constexpr double kNoPrediction = std::numeric_limits<double>::infinity();

// Seconds `row` is predicted to take for `args` (args.codec set for a compressed call) with
// chunks of `chunkBytes` (the compressed exchange's: args.codecChunkBytes where set);
// kNoPrediction where the model does not cover the row or the op.
double predictSeconds(const AlgorithmRow& row, const CallArgs& args, const Topology& topology,
                      const LinkProfile& profile, size_t chunkBytes);

}  // namespace nanoccl::detail
