#include "collectives/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <functional>
#include <optional>
#include <thread>

#include "common/strings.h"

namespace nanoccl {
namespace {

// FileStore waits poll: the store is only used during setup, so a short period costs little.
constexpr auto kPollPeriod = std::chrono::milliseconds(2);
// add() has no deadline parameter; a lock held this long means a dead or stuck holder.
constexpr auto kLockTimeout = std::chrono::seconds(60);

std::string waitTimeoutMessage(const std::string& what, const std::string& key) {
  return what + ": key '" + key + "' was not set before the deadline";
}

Status parseInt64(const std::string& key, const std::string& text, int64_t* out) {
  const std::optional<int64_t> v =
      text.empty() ? 0 : parseDecimal(text, INT64_MIN, INT64_MAX);
  if (!v) return invalidArgument("store key '" + key + "' holds '" + text + "', not an integer");
  *out = *v;
  return Status::ok();
}

Status writeAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return systemError("write", errno);
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

// Reads a whole file; nullopt-style: returns false if it does not exist.
Result<bool> readFile(const std::string& path, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    return systemError(("open " + path).c_str(), errno);
  }
  out->clear();
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return systemError(("read " + path).c_str(), err);
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

void makeDirectories(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') ::mkdir(dir.substr(0, i).c_str(), 0700);
  }
}

}  // namespace

// ---- InMemoryStore ----

Status InMemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
  return Status::ok();
}

Result<std::string> InMemoryStore::get(const std::string& key, const Deadline& deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!waitUntil(cv_, lock, deadline, [&] { return data_.count(key) > 0; })) {
    return timeoutError(waitTimeoutMessage("store get", key));
  }
  return data_[key];
}

Result<int64_t> InMemoryStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) NANOCCL_CHECK(parseInt64(key, it->second, &value));
    value += delta;
    data_[key] = std::to_string(value);
  }
  cv_.notify_all();
  return value;
}

Status InMemoryStore::wait(const std::vector<std::string>& keys, const Deadline& deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ok = waitUntil(cv_, lock, deadline, [&] {
    for (const auto& k : keys) {
      if (data_.count(k) == 0) return false;
    }
    return true;
  });
  if (ok) return Status::ok();
  for (const auto& k : keys) {
    if (data_.count(k) == 0) return timeoutError(waitTimeoutMessage("store wait", k));
  }
  return timeoutError("store wait timed out");
}

// ---- FileStore ----

FileStore::FileStore(std::string directory) : dir_(std::move(directory)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  makeDirectories(dir_);
}

// Keys may hold '/', '.', or anything else: keep [A-Za-z0-9_-] and write every other byte as
// %XX, so a key is always one plain file name that never starts with '.' (temporaries and the
// lock file do). Over-long names keep a readable head and a hash of the whole key.
std::string FileStore::pathOf(const std::string& key) const {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string name;
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '_' || ch == '-') {
      name += static_cast<char>(ch);
    } else {
      name += '%';
      name += kHex[ch >> 4];
      name += kHex[ch & 15];
    }
  }
  if (name.size() > 200) {
    char hash[20];
    std::snprintf(hash, sizeof(hash), "%016zx", std::hash<std::string>{}(key));
    name = name.substr(0, 150) + "%%" + hash;
  }
  return dir_ + "/" + name;
}

namespace {

Status atomicWrite(const std::string& dir, const std::string& path, const std::string& value) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      dir + "/.tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return systemError(("create " + tmp).c_str(), errno);
  Status s = writeAll(fd, value);
  ::close(fd);
  if (s.isOk() && ::rename(tmp.c_str(), path.c_str()) != 0) s = systemError("rename", errno);
  if (!s.isOk()) ::unlink(tmp.c_str());
  return s;
}

}  // namespace

Status FileStore::set(const std::string& key, const std::string& value) {
  return atomicWrite(dir_, pathOf(key), value);
}

Result<std::string> FileStore::get(const std::string& key, const Deadline& deadline) {
  const std::string path = pathOf(key);
  std::string value;
  for (;;) {
    NANOCCL_ASSIGN_OR_RETURN(const bool found, readFile(path, &value));
    if (found) return value;
    if (deadline.expired()) return timeoutError(waitTimeoutMessage("file store get", key));
    std::this_thread::sleep_for(kPollPeriod);
  }
}

Result<int64_t> FileStore::add(const std::string& key, int64_t delta) {
  const std::string lockPath = dir_ + "/.lock";
  const int fd = ::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return systemError(("open " + lockPath).c_str(), errno);
  const Deadline deadline = Deadline::after(kLockTimeout);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const int err = errno;
      ::close(fd);
      return systemError("flock", err);
    }
    if (deadline.expired()) {
      ::close(fd);
      return timeoutError("file store add: lock " + lockPath + " held for over 60 s");
    }
    std::this_thread::sleep_for(kPollPeriod);
  }
  // Closing the descriptor releases the lock, on every path.
  const std::string path = pathOf(key);
  std::string text;
  Result<bool> found = readFile(path, &text);
  if (!found.isOk()) {
    ::close(fd);
    return found.status();
  }
  int64_t value = 0;
  Status s = found.value() ? parseInt64(key, text, &value) : Status::ok();
  if (s.isOk()) {
    value += delta;
    s = atomicWrite(dir_, path, std::to_string(value));
  }
  ::close(fd);
  if (!s.isOk()) return s;
  return value;
}

Status FileStore::wait(const std::vector<std::string>& keys, const Deadline& deadline) {
  for (const auto& key : keys) {
    const std::string path = pathOf(key);
    while (::access(path.c_str(), F_OK) != 0) {
      if (deadline.expired()) return timeoutError(waitTimeoutMessage("file store wait", key));
      std::this_thread::sleep_for(kPollPeriod);
    }
  }
  return Status::ok();
}

}  // namespace nanoccl
