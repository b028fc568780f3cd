// Tuning, part one: the link profile (docs/design.md, docs/tuning.md).
//
// A LinkProfile says what the links and the CPU of a job can do: per link class (intra-node,
// inter-node) the one-way latency of a small message (alpha) and the bandwidth of one rank
// pair and of a whole node at once (beta), and how fast this machine reduces float32 and runs
// each codec. The planner's cost model reads it; nanoccl-tune prints and saves it.
//
// Where it comes from (NANOCCL_TUNING):
//   off      no profile: the planner keeps its fixed thresholds (the default for now;
//            NANOCCL_COMPRESSION=auto turns it into cached)
//   cached   the profile file (NANOCCL_TUNING_FILE, default ~/.cache/nanoccl/link_profile.txt)
//            when it was measured on the same shape, transport and socket count; else measured
//            now and saved there
//   measure  measured now, at communicator creation (~0.1-0.3 s at 1 Gbit/s), and saved
// All ranks agree on one profile: rank 0 decides (reads the file, or combines what the ranks
// measured) and hands it to the others through the store. Every rank must use the same
// NANOCCL_TUNING (and, with a profile, the same settings that steer the planner: compression,
// compression_allow, compression_block, chunk_bytes); a malformed file is an error on every
// rank, naming the file and the line. Only a regular file of at most 64 KiB is read.
//
// File format (text, one record per line, '#' starts a comment; rates in MB/s = 10^6 bytes/s):
//   version 1
//   shape 2x2                      nodes x ranks per node ("2+1" for unequal nodes)
//   transport tcp                  the inter-node transport (NANOCCL_TRANSPORT's row)
//   nsocks 2
//   measured <UTC time, ISO 8601>
//   inter alpha_us 61.2 pair_MBps 117.5 node_MBps 118.1     (or: inter none)
//   inter_one_socket_MBps 119.0    node_MBps over one connection a peer (optional)
//   intra alpha_us 9.1 pair_MBps 3100 node_MBps 3100        (or: intra none)
//   reduce_MBps 5200                float32 sum, one core, per byte of input
//   cpu_share 0.5                   cores of rank 0's host / ranks of the job on it, at most 1
//   codec int8 encode_MBps 2100 decode_MBps 3500 accumulate_MBps 3000   (one line per codec)
// Codec rates are per byte of float32 input (the uncompressed side).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/store.h"
#include "collectives/topology.h"
#include "common/config.h"
#include "common/deadline.h"
#include "common/status.h"
#include "transports/transport.h"

namespace nanoccl {

struct LinkClassProfile {
  bool present = false;    // false: this topology has no such link (one node; one rank a node)
  double alphaUs = 0;      // one-way time of an 8-byte message: half the median round trip
  double pairMBps = 0;     // one rank pair, one large message (striped over nsocks on tcp)
  // inter: every shard of node 0 (local ranks below the smallest node's size) sending to its
  // peer on node 1 at once; intra: the pair's rate (not measured separately yet)
  double nodeMBps = 0;
  // inter over tcp with nsocks > 1: the same as nodeMBps over one connection a peer (0: not
  // measured). The planner's socket count weighs the two; there nodeMBps comes from the same
  // probe on all connections, also on flat topologies (one shard), where it was the pair's.
  double oneSocketMBps = 0;
};

struct CodecRates {
  std::string name;  // "fp16", "bf16", "int8", "int4"
  double encodeMBps = 0;
  double decodeMBps = 0;
  double accumulateMBps = 0;
};

struct LinkProfile {
  static constexpr int kVersion = 1;
  std::string shape;      // shapeOf(topology)
  std::string transport;  // "tcp", "fabric"
  int nsocks = 1;
  std::string measured;   // UTC time of the measurement, ISO 8601
  LinkClassProfile inter;
  LinkClassProfile intra;
  double reduceMBps = 0;
  // The share of a core each rank can count on: rank 0's host's cores over the job's ranks on
  // that host (by host name), at most 1. An emulated 2x2 cluster on 2 cores: 0.5.
  double cpuShare = 1;
  std::vector<CodecRates> codecs;

  // The file format above; parse(toText()) gives the profile back.
  std::string toText() const;
  // `where` names the source in errors ("/home/u/.cache/nanoccl/link_profile.txt").
  static Result<LinkProfile> parse(const std::string& text, const std::string& where);
  // Whether it was measured for this job's links.
  bool fits(const std::string& shape, const std::string& transport, int nsocks) const;
  // One line for logs: "2x2 over tcp x2: inter 61 us, 117 MB/s pair, 118 MB/s node; ...".
  std::string summary() const;
};

// "2x2" (nodes x ranks per node), "2+1" where nodes differ, "1x4" for one node.
std::string shapeOf(const Topology& topology);

// NANOCCL_TUNING_FILE, else $XDG_CACHE_HOME/nanoccl/link_profile.txt, else
// $HOME/.cache/nanoccl/link_profile.txt.
std::string profilePath(const Config& config);
// Empty when the file does not exist; a parse error names the file and the line.
Result<std::optional<LinkProfile>> loadProfile(const std::string& path);
// Writes through a temporary file and a rename, creating the directory (0700) if needed.
Status saveProfile(const LinkProfile& profile, const std::string& path);

// Measures reduceMBps and every lossy codec's rates on this thread (~50 ms).
void measureCpuRates(LinkProfile& profile);

namespace detail {
struct Hierarchy;
}

// What the tuner needs of a communicator whose transports are connected and idle.
struct TuningTarget {
  int rank = 0;
  int size = 1;
  const Topology* topology = nullptr;
  const Config* config = nullptr;
  Transport* main = nullptr;                         // every rank (flat); null when size == 1
  const detail::Hierarchy* hierarchy = nullptr;      // null when the topology is flat
  std::string transport;                             // the inter-node row's name
  std::chrono::milliseconds timeout{60000};
};

// At communicator creation, on every rank, before any call: the profile under
// config.tuning (null when "off"). Every rank checks that all ranks use the same mode; when
// measuring, every rank takes part in the probes, which run on `target`'s transports. `store`
// is the communicator's own (prefixed) store.
Result<std::shared_ptr<const LinkProfile>> agreeOnProfile(Store& store, const TuningTarget& target,
                                                          const Deadline& deadline);

}  // namespace nanoccl
