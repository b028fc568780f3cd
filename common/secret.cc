#include "common/secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace nanoccl {
namespace {

std::string octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// Trailing newlines and spaces are not part of the secret (`openssl rand -hex 32 > file`).
std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' ||
                        s.back() == '\t')) {
    s.pop_back();
  }
  return s;
}

Status checkLength(const std::string& what, const std::string& secret) {
  if (secret.size() < kMinSecretBytes) {
    return invalidArgument(what + " holds " + std::to_string(secret.size()) +
                           " bytes; a job secret needs at least " +
                           std::to_string(kMinSecretBytes) +
                           " (make one with: openssl rand -hex 32)");
  }
  return Status::ok();
}

Result<std::string> readSecretFile(const std::string& path) {
  const std::string what = "NANOCCL_SECRET_FILE=" + path;
  // O_NOFOLLOW: the checks below are of the file itself, not of a link to it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    return invalidArgument(what + ": cannot open: " + std::strerror(err) +
                           (err == ELOOP ? " (a symbolic link; name the file itself)" : ""));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return invalidArgument(what + ": cannot stat: " + std::strerror(err));
  }
  std::string problem;
  if (!S_ISREG(st.st_mode)) {
    problem = "is not a regular file";
  } else if (st.st_uid != geteuid()) {
    problem = "is owned by uid " + std::to_string(st.st_uid) + ", not by this job's user (uid " +
              std::to_string(geteuid()) + ")";
  } else if ((st.st_mode & 077) != 0) {
    problem = "has mode " + octal(st.st_mode) +
              ": group or others may read or change it; run chmod 600 " + path;
  } else if (st.st_size > static_cast<off_t>(kMaxSecretFileBytes)) {
    problem = "is " + std::to_string(st.st_size) + " bytes; a secret file holds at most " +
              std::to_string(kMaxSecretFileBytes);
  }
  if (!problem.empty()) {
    close(fd);
    return invalidArgument(what + " " + problem + ": refusing to use it as the job secret");
  }
  std::string content(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < content.size()) {
    const ssize_t n = ::read(fd, content.data() + got, content.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  content.resize(got);
  content = trimmed(std::move(content));
  NANOCCL_CHECK(checkLength(what, content));
  return content;
}

}  // namespace

crypto::Key jobKey(const std::string& secretBytes) {
  crypto::Key label{};
  static constexpr char kLabel[] = "nanoccl job secret v1";
  std::memcpy(label.data(), kLabel, sizeof(kLabel) - 1);
  return crypto::derive(label, "job key", {secretBytes});
}

Result<JobSecret> loadOutOfBandSecret(const Config& config) {
  JobSecret out;
  out.where = "the store";
  if (!config.secretFile.empty() && !config.secret.empty()) {
    return invalidArgument(
        "both NANOCCL_SECRET_FILE and NANOCCL_SECRET are set: set one (the file is safer)");
  }
  std::string secret;
  if (!config.secretFile.empty()) {
    NANOCCL_ASSIGN_OR_RETURN(secret, readSecretFile(config.secretFile));
    out.where = "NANOCCL_SECRET_FILE=" + config.secretFile;
  } else if (!config.secret.empty()) {
    secret = trimmed(config.secret);
    NANOCCL_CHECK(checkLength("NANOCCL_SECRET", secret));
    out.where = "NANOCCL_SECRET";
  } else {
    return out;
  }
  out.outOfBand = true;
  out.bytes = std::move(secret);
  return out;
}

}  // namespace nanoccl
