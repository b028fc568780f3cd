// libfabric's exported functions, loaded on a process's first fabric transport rather than at
// its start. Loading libfabric runs its providers' constructors, and psm's and psm2's calibrate
// a clock for ~100 ms each (measured: 200 ms to dlopen libfabric.so.1 here), which every nanoccl
// process paid, every rank and every test, whether it used fabric or not. The other fi_* calls
// are inline functions through the objects' ops tables and need no symbol.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>

#include "common/status.h"

namespace nanoccl::fabric {

struct Libfabric {
  int (*getinfo)(uint32_t version, const char* node, const char* service, uint64_t flags,
                 const fi_info* hints, fi_info** info);
  void (*freeinfo)(fi_info* info);
  fi_info* (*dupinfo)(const fi_info* info);  // dupinfo(nullptr): fi_allocinfo()
  int (*fabric)(fi_fabric_attr* attr, fid_fabric** fabric, void* context);
  const char* (*strerror)(int errnum);
  uint32_t (*version)();
};

// libfabric.so.1, loaded once per process (thread-safe); an unavailable error naming dlerror()'s
// reason where it cannot be.
Result<const Libfabric*> loadLibfabric();

// The loaded library: only after a successful loadLibfabric() (every fabric object comes from it).
const Libfabric& libfabric();

}  // namespace nanoccl::fabric
