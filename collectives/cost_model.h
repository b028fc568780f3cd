// Tuning, part two: the cost model (docs/design.md, docs/tuning.md).
//
// From a LinkProfile (collectives/tuning.h), the predicted time of one call on one row of the
// algorithm table, with or without a codec on the inter-node leg. The terms, per rank:
//   a message on a link class     alpha + bytes / beta, where beta is the pair's bandwidth, or
//                                 the node's divided by the ranks of a node that cross at once
//                                 (over one connection a peer, args.lanes == 1: the node's
//                                 one-socket rate so divided)
//   a ring pass                   (ranks - 1) x chunks x (alpha + chunk / beta): every link
//                                 carries ranks - 1 segments, chunk after chunk
//   a chain (ring broadcast)      (ranks - 2 + chunks) x (alpha + chunk / beta): the chunks
//                                 follow each other down the chain
//   reductions and codecs         bytes / (rate x cpu_share), where the profile's rates are one
//                                 core's and cpu_share the core a rank can count on
//   the hierarchy's pipeline      its three stages overlap over blocks: the slowest stage,
//                                 plus the others' time for one block
//   a compressed stage            the wire and the codec overlap over chunks likewise; each
//                                 chunk message pays alpha, and each round's turn (the owner's
//                                 work on its last chunk before the sums go back) is exposed
//   a device row (rows.cc)        staging copies at the device's copy rate (Device::copyMBps,
//                                 measured when the device is made: the profile is measured
//                                 before any device exists), node stages as rings on the
//                                 device's node links (Device::nodeMBps: NCCL on the GPUs'
//                                 bus) or the intra-node class; the staged allreduce's copies
//                                 down, cross-node leg (a ring, or under a codec a compressed
//                                 exchange a chunk) and copies up overlap over 4 MB chunks
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

// The ops the planner leaves to its rules (allgather, broadcast) and one point-to-point
// message, with the same terms as above: the advisor (nanoccl-advise, predictCall) prices a
// training step with them. The planner does not call these, so its choice of row for these ops
// stays the rules'.
//   allgather ring          one pipelined ring pass of every rank's piece
//   allgather hierarchical  each shard across nodes by its local rank (all at once), then an
//                           intra-node ring allgather (equal pieces: no hand-over first)
//   broadcast tree          ceil(log2 size) hops of the whole buffer
//   broadcast ring          a pipelined chain of chunks through every rank
//   broadcast hierarchical  the root's shards to its local ranks, each shard along a chain of
//                           nodes, an intra-node ring allgather
// kNoPrediction for other rows and ops, or where the profile lacks a link class needed.
double predictMovementSeconds(const AlgorithmRow& row, const CallArgs& args,
                              const Topology& topology, const LinkProfile& profile,
                              size_t chunkBytes);

// One message of `bytes` between two ranks (a pipeline stage's activations): alpha plus bytes
// over the pair's rate, inter-node with `crossing` ranks of the node sending at once (the
// node's rate shared among them). kNoPrediction where the profile lacks that link class.
double predictSendSeconds(double bytes, bool interNode, int crossing, const LinkProfile& profile);

}  // namespace nanoccl::detail
