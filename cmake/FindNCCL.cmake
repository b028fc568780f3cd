# Finds NCCL (nccl.h and libnccl.so.2) for the CUDA device's node stage (collectives/device/cuda_device.cc).
#
# Looked for, first match wins:
#   1. NCCL_ROOT or NCCL_HOME (CMake variable or environment): <root>/include, <root>/lib[64]
#   2. the nvidia-nccl-cu* wheel of the build's Python (-DPython_EXECUTABLE / Python3_EXECUTABLE):
#      site-packages/nvidia/nccl/{include,lib}, which scripts/setup.sh installs into .venv where
#      nvcc is present. A CUDA torch wheel depends on the same wheel, so the NCCL found there is
#      the one torch itself loads: one NCCL in the process.
#   3. the system: the CUDA toolkit's directories, /usr, /usr/local.
#
# Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and, when found, the imported
# target nanoccl::nccl. The library is linked by its full path (the wheel ships libnccl.so.2
# without a libnccl.so symlink), with an RPATH to its directory: the installed Python module
# keeps it, so `import nanoccl` finds NCCL even where torch did not load it (a CPU torch).

set(_nccl_hints "")
foreach(_root IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "${NCCL_HOME}" "$ENV{NCCL_HOME}")
  if(_root)
    list(APPEND _nccl_hints "${_root}")
  endif()
endforeach()

set(_nccl_python "")
if(Python_EXECUTABLE)
  set(_nccl_python "${Python_EXECUTABLE}")
elseif(Python3_EXECUTABLE)
  set(_nccl_python "${Python3_EXECUTABLE}")
endif()
set(_nccl_wheel "")
if(_nccl_python)
  # nvidia and nvidia.nccl are namespace packages (no __init__.py): ask for the spec.
  execute_process(
    COMMAND "${_nccl_python}" -c
      "import importlib.util as u; s = u.find_spec('nvidia.nccl'); print(list(s.submodule_search_locations)[0] if s else '')"
    RESULT_VARIABLE _nccl_rc
    OUTPUT_VARIABLE _nccl_wheel
    ERROR_QUIET
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _nccl_rc EQUAL 0)
    set(_nccl_wheel "")
  endif()
endif()

set(_nccl_system "")
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    get_filename_component(_parent "${_dir}/.." ABSOLUTE)
    list(APPEND _nccl_system "${_parent}")
  endforeach()
endif()
list(APPEND _nccl_system /usr/local/cuda /usr /usr/local)

# Each place is tried on its own (NO_DEFAULT_PATH) so that the order above holds even when the
# system has another NCCL.
foreach(_place IN LISTS _nccl_hints _nccl_wheel _nccl_system)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    break()
  endif()
  unset(NCCL_INCLUDE_DIR CACHE)
  unset(NCCL_LIBRARY CACHE)
  find_path(NCCL_INCLUDE_DIR nccl.h PATHS "${_place}" PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 PATHS "${_place}"
               PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu NO_DEFAULT_PATH)
endforeach()

set(NCCL_VERSION "")
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_defines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} ([0-9]+)" _m "${_nccl_defines}")
    set(_nccl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
# 2.14: non-blocking communicators (ncclConfig_t), which the dead-peer deadlines rely on.
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NCCL_VERSION VERSION_LESS 2.14)
  message(STATUS "nanoccl: NCCL ${NCCL_VERSION} at ${NCCL_INCLUDE_DIR} is older than 2.14: not used")
  set(NCCL_FOUND OFF)
endif()

if(NCCL_FOUND AND NOT TARGET nanoccl::nccl)
  get_filename_component(_nccl_libdir "${NCCL_LIBRARY}" DIRECTORY)
  add_library(nanoccl::nccl INTERFACE IMPORTED GLOBAL)
  set_target_properties(nanoccl::nccl PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}"
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${NCCL_LIBRARY}"
    INTERFACE_LINK_OPTIONS "LINKER:-rpath,${_nccl_libdir}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
