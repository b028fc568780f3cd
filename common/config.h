// Configuration, NCCL style: every setting is an environment variable NANOCCL_<NAME>, and the
// Python nanoccl.Options field of the same name in lower case overrides it for one group.
// Every setting has a default that works; the table in config.cc is the single list of them
// (docs/configuration.md documents the same table, checked by tests/bench/test_docs_config.py). At NANOCCL_DEBUG=INFO the effective values are
// printed once per process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace nanoccl {

// The highest rail rate NANOCCL_RAIL_MBPS (and a rank's published rail rate) may give, Mbit/s.
inline constexpr int64_t kMaxRailMbps = 10000000;

struct Config {
  // Network interfaces for the TCP transport, NCCL syntax: "eth,ens" (prefixes), "^docker"
  // (exclude), "=eth0" (exact names). Empty: the first non-loopback interface that is up,
  // else loopback.
  std::string socketIfname;
  // Line rate of each rail (each interface socketIfname selects, in its order) in Mbit/s,
  // weighing how much of a striped message each rail carries. Empty: the rate the kernel
  // reports for each interface (/sys/class/net/<if>/speed), equal shares where one is unknown.
  std::vector<int64_t> railMbps;
  // One NIC per GPU: under the hierarchical algorithms, local rank i of every node carries its
  // share across nodes over rail i % rails only, instead of over every rail.
  bool railPerLocalRank = false;
  // "auto" (io_uring when the kernel allows it, else epoll), "uring" or "epoll".
  std::string tcpEngine = "auto";
  // The TCP congestion control of nanoccl's connections (TCP_CONGESTION): "auto" (the host's
  // default, except BBR: then cubic, or reno where this process may not set cubic; see
  // chooseCongestionControl in transports/tcp/handshake.h), "host" (the host's default, BBR
  // too) or an algorithm's name ("cubic", "reno", "bbr", ...), which the kernel must allow
  // (/proc/sys/net/ipv4/tcp_allowed_congestion_control).
  std::string tcpCongestion = "auto";
  // TCP connections per peer on each rail; messages of at least stripeMinBytes are striped
  // across them (over every rail). With a link profile that measured one connection a peer as
  // fast, every call the planner plans travels on one a rail (OpFingerprint::lanes) unless
  // this was set (nsocksSet).
  int nsocks = 2;
  bool nsocksSet = false;  // nsocks given by the environment or the Options
  size_t stripeMinBytes = 256 * 1024;
  // Collective algorithm: "auto", or a name from the algorithm table (ring, recursive_doubling,
  // tree, ...). Forcing one that cannot run the call is an error.
  std::string algo = "auto";
  // Pipelining unit of the ring algorithms and of the compressed exchange, in bytes. With a
  // link profile, the planner picks the compressed exchange's chunk per call from its
  // candidates (collectives/planner.h) unless this was set (chunkBytesSet).
  size_t chunkBytes = 1 << 20;
  bool chunkBytesSet = false;  // chunk_bytes given by the environment or the Options
  // Messages up to this size use the small-message (latency) algorithms under "auto".
  size_t smallMessageBytes = 64 * 1024;
  // How long a thread waiting on a call in flight polls before it sleeps, in microseconds
  // (common/spin.h); 0: sleep at once. Idle threads never poll.
  int spinUs = 100;
  // Deadline of every collective when the caller gives none (torch passes its own).
  int64_t timeoutMs = 300000;
  // Deadline of connection setup (handshakes, store look-ups) when the caller gives none.
  int64_t connectTimeoutMs = 60000;
  // Which node this rank is on (ranks with equal ids are one node). Empty: the embedding
  // layer's id, else "<hostname>/netns:<inode>" (collectives/topology.h).
  std::string nodeId;
  // Transport between nodes (and between all ranks where nothing else is chosen): "auto" (the
  // first inter-node row of the transport table: tcp) or a row's name ("tcp", "fabric").
  // Checked against the table when a communicator is created (transports/registry.cc).
  std::string transport = "auto";
  // Transport for collectives between ranks of one node, flat and hierarchical: "auto" (shared
  // memory where built and possible, else the inter-node transport), "shm" (required), or an
  // inter-node row ("tcp"). Point-to-point send/recv always uses the inter-node transport
  // (transports/routed/routed_transport.h says why).
  std::string intraTransport = "auto";
  // Lossy compression of the inter-node leg of allreduce and reduce_scatter (float32 sum/avg
  // only; intra-node stages stay lossless): "none", "fp16", "bf16", "int8" or "int4"
  // (collectives/codec/codec.h), or "auto": per call, whichever of compressionAllow the cost
  // model predicts fastest (it needs a link profile: "auto" turns tuning "off" into "cached").
  // Every rank of a group must agree.
  std::string compression = "none";
  // The codecs compression "auto" may choose from, comma-separated ("none" = lossless).
  std::string compressionAllow = "none,bf16,int8";
  // Messages below this many bytes stay lossless even with a codec set.
  size_t compressionMinBytes = 1 << 20;
  // Elements per scale of int8/int4; 0 takes the codec's default (256 for int8, 64 for int4).
  // A multiple of 32, at most 2^20.
  int compressionBlock = 0;
  // The job secret out of band (common/secret.h): a file only the job's user can read, or the
  // value itself. Unset: rank 0 draws one and shares it through the store. Never printed.
  std::string secretFile;
  std::string secret;
  // Where the planner's link profile comes from (collectives/tuning.h): "off", "cached" (the
  // file when it fits this job, else measured and saved) or "measure". Every rank must agree.
  std::string tuning = "off";
  // The link profile's file; empty: $XDG_CACHE_HOME or ~/.cache, /nanoccl/link_profile.txt.
  std::string tuningFile;
  // Authenticated encryption (AES-256-GCM) of every byte on TCP connections, with keys
  // derived per connection from the handshake. Every rank must agree.
  bool encrypt = false;

  // Reads every NANOCCL_* variable over the defaults; a malformed value is an error.
  static Result<Config> fromEnv();
  // Sets one field by its Options/env name ("nsocks" or "NANOCCL_NSOCKS").
  Status set(const std::string& name, const std::string& value);
  // "name=value" for every field, in table order.
  std::vector<std::pair<std::string, std::string>> items() const;
  // Logs the effective configuration once per process at NANOCCL_DEBUG=INFO.
  void logOnce() const;
};

// The codec names of a compression_allow value, in order, each once; kInvalidArgument naming
// the first unknown one (an empty name too).
Result<std::vector<std::string>> splitCodecList(const std::string& value);

}  // namespace nanoccl
