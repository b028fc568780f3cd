// nanoccl's threads carry names, as NCCL's do ("NCCL Progress"): every one is "nanoccl-<role>"
// in top -H, gdb and /proc/<pid>/task/*/comm, so a thread count can tell nanoccl's threads from
// torch's (bench/soak.py does).
#pragma once

#include <pthread.h>

#include <thread>
#include <utility>

namespace nanoccl {

// Starts `fn` on a new thread named "nanoccl-<role>" (`role`: at most 7 characters, since
// Linux keeps 15). The name is set before this returns.
template <typename Fn>
std::thread namedThread(const char* role, Fn&& fn) {
  char name[16] = "nanoccl-";
  for (int i = 0; i < 7 && role[i] != '\0'; ++i) {
    name[8 + i] = role[i];
    name[9 + i] = '\0';
  }
  std::thread t(std::forward<Fn>(fn));
  pthread_setname_np(t.native_handle(), name);
  return t;
}

}  // namespace nanoccl
