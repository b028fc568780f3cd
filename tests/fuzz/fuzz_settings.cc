// Settings arrive from the environment, from Python's Options and from files: every name and
// value is either applied or refused with kInvalidArgument, and a refused value leaves the old
// one. The input is "name\0value"; the same bytes also go through the secret-file reader.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/config.h"
#include "common/secret.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nanoccl;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string name = split == std::string::npos ? input : input.substr(0, split);
  const std::string value = split == std::string::npos ? "" : input.substr(split + 1);
  Config c;
  const auto before = c.items();
  const Status st = c.set(name, value);
  if (!st.isOk()) {
    if (st.code() != StatusCode::kInvalidArgument || st.message().empty()) __builtin_trap();
    if (c.items() != before) __builtin_trap();  // a refused value changes nothing
  } else {
    for (const auto& [k, v] : c.items()) {
      if (k == "secret" && !v.empty() && v != "(set)") __builtin_trap();  // never printed
    }
  }

  // The secret file: any content, mode 0600.
  static const std::string path = [] {
    char tmpl[] = "/tmp/nanoccl-fuzz-secret-XXXXXX";
    const int fd = mkstemp(tmpl);
    close(fd);
    return std::string(tmpl);
  }();
  const int fd = open(path.c_str(), O_WRONLY | O_TRUNC);
  if (fd < 0) return 0;
  if (write(fd, data, size) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  close(fd);
  chmod(path.c_str(), 0600);
  Config withFile;
  withFile.secretFile = path;
  auto secret = loadOutOfBandSecret(withFile);
  if (secret.isOk()) {
    if (!secret->outOfBand || secret->bytes.size() < kMinSecretBytes) __builtin_trap();
  } else if (secret.status().code() != StatusCode::kInvalidArgument) {
    __builtin_trap();
  }
  return 0;
}
