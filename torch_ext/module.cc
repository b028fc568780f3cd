// nanoccl._C: the Python face of backend/. The nanoccl package (torch_ext/nanoccl/) registers
// the backend with torch.distributed in Python; nothing here runs at load time beyond defining
// the bindings.
//
// Holder: torch binds c10d::Backend with an intrusive_ptr holder that drops its reference with
// the GIL released (IntrusivePtrNoGilDestructor in torch/csrc/distributed/c10d/init.cpp); a
// derived class must use a holder of the same shape. Releasing the GIL matters here: the last
// reference to a ProcessGroupNanoccl joins the communicator's threads, and a future callback
// running on them may need the GIL.
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/process_group_nanoccl.h"
#include "collectives/planner.h"
#include "collectives/topology.h"
#include "collectives/tuning.h"
#include "common/config.h"
#include "transports/transport.h"

namespace py = pybind11;

namespace {

template <typename T>
class NoGilDestructor {
 public:
  NoGilDestructor() = default;
  NoGilDestructor(const NoGilDestructor&) = default;
  NoGilDestructor(NoGilDestructor&&) noexcept = default;
  NoGilDestructor& operator=(const NoGilDestructor&) = default;
  NoGilDestructor& operator=(NoGilDestructor&&) noexcept = default;
  /* implicit */ NoGilDestructor(c10::intrusive_ptr<T> impl) : impl_(std::move(impl)) {}
  // pybind11 constructs holders from raw pointers of objects it created.
  explicit NoGilDestructor(T* impl) : impl_(c10::intrusive_ptr<T>::unsafe_steal_from_new(impl)) {}
  ~NoGilDestructor() {
    if (impl_) {
      if (PyGILState_Check()) {
        py::gil_scoped_release release;
        impl_.reset();
      } else {
        impl_.reset();
      }
    }
  }
  T& operator*() const noexcept { return *impl_; }
  T* operator->() const noexcept { return impl_.get(); }
  T* get() const noexcept { return impl_.get(); }
  void reset() noexcept { impl_.reset(); }
  explicit operator bool() const noexcept { return static_cast<bool>(impl_); }

 private:
  c10::intrusive_ptr<T> impl_;
};

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, NoGilDestructor<T>, true)

namespace {

using nanoccl::ProcessGroupNanoccl;

py::dict bytesDict(uint64_t sent, uint64_t received) {
  py::dict d;
  d["bytes_sent"] = sent;
  d["bytes_received"] = received;
  return d;
}

py::dict bytesDict(const nanoccl::PeerCounters& c) { return bytesDict(c.bytesSent, c.bytesReceived); }

// nanoccl.stats()'s dict (its fields: Stats in nanoccl/__init__.py), the one conversion of
// CommStats.
py::dict statsDict(const nanoccl::CommStats& s) {
  const auto nodeOf = [&](int r) {
    return r < static_cast<int>(s.nodes.size()) ? s.nodes[static_cast<size_t>(r)] : std::string();
  };
  py::dict out;
  out["rank"] = s.rank;
  out["size"] = s.size;
  out["node"] = nodeOf(s.rank);
  out["calls"] = s.calls;
  uint64_t sent = 0;
  uint64_t received = 0;
  py::list peers;
  for (int r = 0; r < static_cast<int>(s.perPeer.size()); ++r) {
    const nanoccl::PeerCounters& c = s.perPeer[static_cast<size_t>(r)];
    py::dict d = bytesDict(c);
    d["rank"] = r;
    d["node"] = nodeOf(r);
    d["link"] = r == s.rank ? "self" : (nodeOf(r) == nodeOf(s.rank) ? "intra-node" : "inter-node");
    d["messages_sent"] = c.messagesSent;
    d["messages_received"] = c.messagesReceived;
    peers.append(d);
    sent += c.bytesSent;
    received += c.bytesReceived;
  }
  out["bytes_sent"] = sent;
  out["bytes_received"] = received;
  out["per_peer"] = peers;
  py::dict perOp;
  for (size_t i = 0; i < s.bytesSentPerOp.size() || i < s.bytesReceivedPerOp.size(); ++i) {
    const uint64_t b = i < s.bytesSentPerOp.size() ? s.bytesSentPerOp[i] : 0;
    const uint64_t r = i < s.bytesReceivedPerOp.size() ? s.bytesReceivedPerOp[i] : 0;
    if (b != 0 || r != 0) perOp[py::str(nanoccl::opTypeName(static_cast<nanoccl::OpType>(i)))] = bytesDict(b, r);
  }
  out["per_op"] = perOp;
  py::dict perLink;
  perLink["intra-node"] = bytesDict(s.intraNodeBytesSent, s.intraNodeBytesReceived);
  perLink["inter-node"] = bytesDict(s.interNodeBytesSent, s.interNodeBytesReceived);
  out["per_link"] = perLink;
  py::dict perAlgorithm;
  for (const auto& [name, calls] : s.callsPerAlgorithm) perAlgorithm[py::str(name)] = calls;
  out["per_algorithm"] = perAlgorithm;
  py::dict perTransport;
  for (const auto& [name, c] : s.perTransport) perTransport[py::str(name)] = bytesDict(c);
  out["per_transport"] = perTransport;
  py::dict perRail;
  for (const auto& r : s.perRail) perRail[py::str(r.ifname)] = bytesDict(r.bytesSent, r.bytesReceived);
  out["per_rail"] = perRail;
  out["calls_with_kept_buffers"] = s.callsWithKeptBuffers;
  py::dict modelled;
  for (const auto& t : s.modelled) {
    py::dict d;
    d["calls"] = t.calls;
    d["predicted_s"] = t.predictedSeconds;
    d["measured_s"] = t.measuredSeconds;
    modelled[py::str(t.what)] = d;
  }
  out["modelled"] = modelled;
  return out;
}

py::dict linkClassDict(const nanoccl::LinkClassProfile& c) {
  py::dict d;
  d["alpha_us"] = c.alphaUs;
  d["pair_MBps"] = c.pairMBps;
  d["node_MBps"] = c.nodeMBps;
  d["one_socket_MBps"] = c.oneSocketMBps > 0 ? py::object(py::float_(c.oneSocketMBps)) : py::none();
  return d;
}

// nanoccl.link_profile()'s dict: the file's records, and the file's text itself.
py::object profileDict(const std::shared_ptr<const nanoccl::LinkProfile>& p) {
  if (!p) return py::none();
  py::dict d;
  d["shape"] = p->shape;
  d["transport"] = p->transport;
  d["nsocks"] = p->nsocks;
  d["measured"] = p->measured;
  d["inter"] = p->inter.present ? py::object(linkClassDict(p->inter)) : py::none();
  d["intra"] = p->intra.present ? py::object(linkClassDict(p->intra)) : py::none();
  d["reduce_MBps"] = p->reduceMBps;
  d["cpu_share"] = p->cpuShare;
  py::dict codecs;
  for (const nanoccl::CodecRates& c : p->codecs) {
    py::dict r;
    r["encode_MBps"] = c.encodeMBps;
    r["decode_MBps"] = c.decodeMBps;
    r["accumulate_MBps"] = c.accumulateMBps;
    codecs[py::str(c.name)] = r;
  }
  d["codecs"] = codecs;
  d["text"] = p->toText();
  return std::move(d);
}

NoGilDestructor<ProcessGroupNanoccl> createBackend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int64_t timeoutMs,
    const std::string& groupName, const std::vector<int64_t>& globalRanks,
    const std::map<std::string, std::string>& settings) {
  auto options = ProcessGroupNanoccl::Options::create(std::chrono::milliseconds(timeoutMs));
  options->groupName = groupName;
  options->globalRanks = globalRanks;
  options->settings = settings;
  return c10::make_intrusive<ProcessGroupNanoccl>(store, rank, size, options);
}

// predict_collective's arguments turned into the planner's: a dtype by its name, the profile
// from its text, a topology of `nodes` x `perNode` ranks, the defaults plus `settings`.
nanoccl::DataType dataTypeNamed(const std::string& name) {
  for (int i = 0; i < static_cast<int>(nanoccl::DataType::kNumTypes); ++i) {
    const auto t = static_cast<nanoccl::DataType>(i);
    if (name == nanoccl::dataTypeName(t)) return t;
  }
  throw py::value_error("unknown dtype '" + name + "' (float32, bfloat16, float16, ...)");
}

py::tuple predictCollective(const std::string& op, int64_t count, const std::string& dtype,
                            int nodes, int perNode, const std::string& profileText,
                            const std::string& codec, int crossing,
                            const std::map<std::string, std::string>& settings) {
  if (count < 0) throw py::value_error("predict_collective: a negative element count");
  if (nodes < 1 || perNode < 1 || nodes * static_cast<int64_t>(perNode) > 4096) {
    throw py::value_error("predict_collective: a cluster of " + std::to_string(nodes) + " x " +
                          std::to_string(perNode) + " ranks (each at least 1, at most 4096)");
  }
  nanoccl::Result<nanoccl::LinkProfile> profile =
      nanoccl::LinkProfile::parse(profileText, "the link profile");
  if (!profile.isOk()) throw py::value_error(profile.status().message());
  nanoccl::Config config;
  for (const auto& [k, v] : settings) {
    nanoccl::Status s = config.set(k, v);
    if (!s.isOk()) throw py::value_error(s.message());
  }
  std::vector<std::string> ids;
  for (int n = 0; n < nodes; ++n) {
    for (int r = 0; r < perNode; ++r) ids.push_back("node" + std::to_string(n));
  }
  const nanoccl::Topology topology = nanoccl::Topology::fromNodeIds(ids);
  nanoccl::Result<nanoccl::detail::CallPrediction> p = nanoccl::detail::predictCall(
      op, static_cast<size_t>(count), dataTypeNamed(dtype), codec, crossing, topology, config,
      profile.value());
  if (!p.isOk()) throw py::value_error(p.status().message());
  return py::make_tuple(p.value().algorithm, p.value().codec, p.value().seconds,
                        p.value().wireRatio);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "nanoccl's C++ backend (use the nanoccl package, not this module)";
  // The base classes must be registered before the derived ones.
  py::module_::import("torch._C._distributed_c10d");

  py::class_<ProcessGroupNanoccl, c10d::Backend, NoGilDestructor<ProcessGroupNanoccl>>(
      m, "ProcessGroupNanoccl")
      .def("stats", [](const ProcessGroupNanoccl& pg) { return statsDict(pg.stats()); })
      .def("link_profile",
           [](const ProcessGroupNanoccl& pg) { return profileDict(pg.linkProfile()); })
      .def("predict_allreduce", &ProcessGroupNanoccl::predictAllreduce, py::arg("count"),
           py::arg("dtype"), py::arg("codec") = "")
      .def(
          "allreduce_compressed",
          [](ProcessGroupNanoccl& pg, at::Tensor tensor, std::optional<at::Tensor> residual,
             const std::string& codec, int64_t blockSize, const c10d::ReduceOp& op) {
            at::Tensor r = residual ? *residual : at::Tensor();
            return pg.allreduceCompressed(tensor, r, codec, blockSize, op);
          },
          py::arg("tensor"), py::arg("residual"), py::arg("codec"), py::arg("block_size"),
          py::arg("op"), py::call_guard<py::gil_scoped_release>())
      .def(
          "reduce_scatter_compressed",
          [](ProcessGroupNanoccl& pg, at::Tensor output, at::Tensor input,
             std::optional<at::Tensor> residual, const std::string& codec, int64_t blockSize,
             const c10d::ReduceOp& op) {
            at::Tensor r = residual ? *residual : at::Tensor();
            return pg.reduceScatterCompressed(output, input, r, codec, blockSize, op);
          },
          py::arg("output"), py::arg("input"), py::arg("residual"), py::arg("codec"),
          py::arg("block_size"), py::arg("op"), py::call_guard<py::gil_scoped_release>())
      .def(
          "allgather_compressed",
          [](ProcessGroupNanoccl& pg, at::Tensor output, at::Tensor input,
             const std::string& codec, int64_t blockSize) {
            return pg.allgatherCompressed(output, input, codec, blockSize);
          },
          py::arg("output"), py::arg("input"), py::arg("codec"), py::arg("block_size"),
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("comm_id", &ProcessGroupNanoccl::commId);

  // Connects to the group: blocks for up to the timeout, so the GIL is released (the store may
  // be served by a thread of this process, and other Python threads should keep running).
  m.def("create_backend", &createBackend, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout_ms"), py::arg("group_name"), py::arg("global_ranks"), py::arg("settings"),
        py::call_guard<py::gil_scoped_release>());

  // Validates one setting the way the backend will apply it; raises ValueError.
  m.def(
      "check_setting",
      [](const std::string& name, const std::string& value) {
        nanoccl::Config config;
        nanoccl::Status s = config.set(name, value);
        // Transport names are the transport table's to check (unknown, or not built in), and
        // algorithm names the algorithm table's.
        if (s.isOk()) s = nanoccl::chooseTransports(config).status();
        if (s.isOk()) s = nanoccl::detail::checkAlgorithmName(config.algo);
        if (!s.isOk()) throw py::value_error(s.message());
      },
      py::arg("name"), py::arg("value"));

  // A saved link profile (nanoccl-tune --show): its dict, None when the file does not exist;
  // ValueError naming the file and the line when it is not a valid profile.
  m.def(
      "load_link_profile",
      [](const std::string& path) -> py::object {
        nanoccl::Result<std::optional<nanoccl::LinkProfile>> p = nanoccl::loadProfile(path);
        if (!p.isOk()) throw py::value_error(p.status().message());
        if (!p.value()) return py::none();
        return profileDict(std::make_shared<nanoccl::LinkProfile>(*p.value()));
      },
      py::arg("path"));
  // Where a group with these settings reads and saves its link profile.
  m.def(
      "link_profile_path",
      [](const std::map<std::string, std::string>& settings) {
        nanoccl::Result<nanoccl::Config> config = nanoccl::Config::fromEnv();
        if (!config.isOk()) throw py::value_error(config.status().message());
        for (const auto& [k, v] : settings) {
          nanoccl::Status s = config.value().set(k, v);
          if (!s.isOk()) throw py::value_error(s.message());
        }
        return nanoccl::profilePath(config.value());
      },
      py::arg("settings"));

  // One call priced by the planner and the cost model without a group (nanoccl-advise):
  // (algorithm, codec, seconds, wire ratio); ValueError for bad arguments or a bad profile.
  m.def("predict_collective", &predictCollective, py::arg("op"), py::arg("count"),
        py::arg("dtype"), py::arg("nodes"), py::arg("procs_per_node"), py::arg("profile"),
        py::arg("codec") = "", py::arg("crossing") = 1,
        py::arg("settings") = std::map<std::string, std::string>{});
  // This machine's float32 reduce and codec rates as profile records (one core, ~50 ms):
  // a profile text with no links, for the advisor to complete with hand-given ones.
  m.def("measure_cpu_rates", [] {
    nanoccl::LinkProfile p;
    p.shape = "1x1";
    p.transport = "none";
    p.measured = "now";
    nanoccl::measureCpuRates(p);
    return p.toText();
  });

  // Every setting and its default, in the table's order.
  m.def("default_settings", [] { return nanoccl::Config().items(); });
}
