// C10dStore: torch's c10d::Store (TCPStore, FileStore, PrefixStore... as torch hands it to the
// backend) seen as a nanoccl::Store, so that nanoccl rendezvous on the job's own store and no
// second one is needed.
//
// c10d::Store::get blocks with the store's own timeout, not ours: get() first waits for the key
// with the caller's deadline, then reads it. c10d errors (a store server gone, a timeout) become
// Status values: no exception leaves this class. Thread-safe as the wrapped store is.
#pragma once

#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "collectives/store.h"

namespace nanoccl {

class C10dStore : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key, const Deadline& deadline) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, const Deadline& deadline) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace nanoccl
