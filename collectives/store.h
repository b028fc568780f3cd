// Store: the key-value rendezvous every rank of a job can reach (torch's c10d::Store in
// production, through backend/'s adapter; InMemoryStore for ranks-as-threads tests; FileStore
// for processes on one machine without torch).
//
// Values are arbitrary bytes. get() and wait() block until the keys exist or the deadline
// passes (kTimeout). All methods are thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"

namespace nanoccl {

class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  virtual Result<std::string> get(const std::string& key, const Deadline& deadline) = 0;
  // Atomically adds `delta` to the integer stored at `key` (0 if absent); returns the new value.
  virtual Result<int64_t> add(const std::string& key, int64_t delta) = 0;
  virtual Status wait(const std::vector<std::string>& keys, const Deadline& deadline) = 0;
};

// Keys prefixed with "<prefix>/": one communicator's view of a shared store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}
  Status set(const std::string& key, const std::string& value) override {
    return base_->set(prefix_ + key, value);
  }
  Result<std::string> get(const std::string& key, const Deadline& deadline) override {
    return base_->get(prefix_ + key, deadline);
  }
  Result<int64_t> add(const std::string& key, int64_t delta) override {
    return base_->add(prefix_ + key, delta);
  }
  Status wait(const std::vector<std::string>& keys, const Deadline& deadline) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    return base_->wait(full, deadline);
  }

 private:
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// A store shared by threads of one process.
class InMemoryStore : public Store {
 public:
  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key, const Deadline& deadline) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, const Deadline& deadline) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

// A store shared by processes of one machine through a directory: one file per key, written
// atomically (temporary file + rename); add() serializes with flock. Waits poll.
class FileStore : public Store {
 public:
  explicit FileStore(std::string directory);
  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key, const Deadline& deadline) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, const Deadline& deadline) override;

 private:
  std::string pathOf(const std::string& key) const;
  std::string dir_;
};

}  // namespace nanoccl
