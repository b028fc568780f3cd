#include "backend/c10d_store.h"

#include <algorithm>
#include <chrono>
#include <exception>

namespace nanoccl {
namespace {

// c10d treats a 0 ms timeout as "no timeout": never pass it.
constexpr std::chrono::milliseconds kMinWait{1};
// Waits longer than this are split, so that a "never" deadline is still a finite c10d timeout.
constexpr std::chrono::milliseconds kMaxWait{24LL * 3600 * 1000};

std::string describeKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "'" : ", '") + k + "'";
  return s;
}

}  // namespace

Status C10dStore::set(const std::string& key, const std::string& value) {
  try {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    return Status::ok();
  } catch (const std::exception& e) {
    return peerError("store set('" + key + "') failed: " + e.what());
  }
}

Result<std::string> C10dStore::get(const std::string& key, const Deadline& deadline) {
  NANOCCL_CHECK(wait({key}, deadline));
  try {
    const std::vector<uint8_t> v = store_->get(key);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    return peerError("store get('" + key + "') failed: " + e.what());
  }
}

Result<int64_t> C10dStore::add(const std::string& key, int64_t delta) {
  try {
    return store_->add(key, delta);
  } catch (const std::exception& e) {
    return peerError("store add('" + key + "') failed: " + e.what());
  }
}

Status C10dStore::wait(const std::vector<std::string>& keys, const Deadline& deadline) {
  try {
    while (true) {
      if (store_->check(keys)) return Status::ok();
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at() - Clock::now());
      if (left <= std::chrono::milliseconds(0)) break;
      const auto slice = std::clamp(left, kMinWait, kMaxWait);
      const auto start = Clock::now();
      try {
        store_->wait(keys, slice);
        return Status::ok();
      } catch (const c10::DistStoreError& e) {
        // c10d's own timeout: check again, report ours once the deadline has passed. A
        // DistStoreError well before the slice ended is not a timeout.
        if (Clock::now() - start < slice / 2) {
          return peerError("store wait(" + describeKeys(keys) + ") failed: " + e.what());
        }
      }
    }
  } catch (const std::exception& e) {
    return peerError("store wait(" + describeKeys(keys) + ") failed: " + e.what());
  }
  return timeoutError("store keys " + describeKeys(keys) + " were not set before the deadline");
}

}  // namespace nanoccl
