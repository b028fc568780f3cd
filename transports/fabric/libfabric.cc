// Loading libfabric on first use (libfabric.h: why).
#include "transports/fabric/libfabric.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/logging.h"

namespace nanoccl::fabric {
namespace {

Result<Libfabric> load() {
  // RTLD_GLOBAL: libfabric's providers, loaded from its own directory, resolve its symbols.
  void* handle = dlopen("libfabric.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    return unavailableError(std::string("fabric: cannot load libfabric: ") + dlerror());
  }
  Libfabric lib{};
  std::string missing;
  const auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  resolve(lib.getinfo, "fi_getinfo");
  resolve(lib.freeinfo, "fi_freeinfo");
  resolve(lib.dupinfo, "fi_dupinfo");
  resolve(lib.fabric, "fi_fabric");
  resolve(lib.strerror, "fi_strerror");
  resolve(lib.version, "fi_version");
  if (!missing.empty()) {
    dlclose(handle);
    return unavailableError("fabric: libfabric.so.1 lacks " + missing);
  }
  return lib;  // the handle stays open for the process's life
}

const Result<Libfabric>& library() {
  static const Result<Libfabric> lib = load();
  return lib;
}

}  // namespace

Result<const Libfabric*> loadLibfabric() {
  if (!library().isOk()) return library().status();
  return &library().value();
}

const Libfabric& libfabric() {
  if (!library().isOk()) {  // a bug: every fabric object comes from a loaded library
    NANOCCL_WARN("fabric: libfabric used but not loaded: " << library().status().message());
    std::abort();
  }
  return library().value();
}

}  // namespace nanoccl::fabric
