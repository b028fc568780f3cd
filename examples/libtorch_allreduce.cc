// nanoccl from libtorch C++, without Python: every rank sums a tensor with the others.
//
//   build/.../examples/nanoccl_example_allreduce 0 2 /tmp/rdzv &
//   build/.../examples/nanoccl_example_allreduce 1 2 /tmp/rdzv
//
// The ranks meet through a c10d::FileStore on a shared path (a c10d::TCPStore works the same).
// Remove the store file before a new run.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include "backend/process_group_nanoccl.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " RANK SIZE STORE_PATH\n";
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int size = std::atoi(argv[2]);
  try {
    auto store = c10::make_intrusive<c10d::FileStore>(argv[3], size);
    auto options = nanoccl::ProcessGroupNanoccl::Options::create(std::chrono::seconds(30));
    options->settings["socket_ifname"] = "lo";  // the example runs on one machine
    auto pg = c10::make_intrusive<nanoccl::ProcessGroupNanoccl>(store, rank, size, options);

    std::vector<at::Tensor> tensors = {at::full({1 << 20}, float(rank + 1))};
    pg->allreduce(tensors)->wait();
    const float expected = size * (size + 1) / 2.0f;
    const bool ok = tensors[0].eq(expected).all().item<bool>();

    const auto s = pg->stats();
    std::cout << "rank " << rank << ": allreduce " << (ok ? "ok" : "WRONG") << " (sum "
              << tensors[0][0].item<float>() << "), sent "
              << s.intraNodeBytesSent + s.interNodeBytesSent
              << " bytes\n";
    pg->barrier()->wait();
    pg->shutdown();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << "\n";
    return 1;
  }
}
