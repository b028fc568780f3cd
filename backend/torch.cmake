# Finds the torch of the Python interpreter the build uses (included from the top-level
# CMakeLists.txt when NANOCCL_WITH_TORCH is not OFF).
#
# Sets TORCH_FOUND and, when found, the imported targets
#   nanoccl::torch         libtorch (headers, libtorch, libtorch_cpu, libc10)
#   nanoccl::torch_python  libtorch_python, for the pybind module
# and Python::Module (for Python_add_library).
#
# Why not find_package(Torch): TorchConfig.cmake pulls Caffe2Config.cmake, which for a CUDA
# wheel requires a CUDA toolkit (nvcc) even for code, like this backend, that only needs the
# C++ headers and libraries the wheel already ships. So torch is located the way the brief's
# `torch.utils.cmake_prefix_path` points (<torch>/share/cmake) and the targets are built from
# the wheel's layout, the way torch.utils.cpp_extension does it.

set(TORCH_FOUND OFF)

find_package(Python 3.9 COMPONENTS Interpreter Development.Module)

if(Python_FOUND)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    WORKING_DIRECTORY "${CMAKE_BINARY_DIR}"
    RESULT_VARIABLE _nanoccl_torch_rc
    OUTPUT_VARIABLE _nanoccl_torch_out
    ERROR_VARIABLE _nanoccl_torch_err
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_nanoccl_torch_rc EQUAL 0)
    string(REPLACE "\n" ";" _nanoccl_torch_out "${_nanoccl_torch_out}")
    list(GET _nanoccl_torch_out 0 _nanoccl_torch_cmake)
    list(GET _nanoccl_torch_out 1 NANOCCL_TORCH_VERSION)
    list(GET _nanoccl_torch_out 2 _nanoccl_torch_abi)
    get_filename_component(NANOCCL_TORCH_ROOT "${_nanoccl_torch_cmake}/../.." ABSOLUTE)
    set(_lib "${NANOCCL_TORCH_ROOT}/lib")
    if(NOT _nanoccl_torch_abi STREQUAL "1")
      # The core's std::string-based API must match the ABI of the torch it is linked into.
      message(FATAL_ERROR "torch ${NANOCCL_TORCH_VERSION} uses the pre-C++11 libstdc++ ABI; "
                          "nanoccl needs a torch built with _GLIBCXX_USE_CXX11_ABI=1 (torch >= 2.7 wheels)")
    endif()
    if(EXISTS "${_lib}/libtorch.so" AND EXISTS "${NANOCCL_TORCH_ROOT}/include/torch/csrc/distributed/c10d/Backend.hpp")
      set(TORCH_FOUND ON)
    else()
      message(STATUS "nanoccl: torch at ${NANOCCL_TORCH_ROOT} lacks libtorch.so or the c10d headers")
    endif()
  else()
    message(STATUS "nanoccl: `import torch` failed for ${Python_EXECUTABLE}")
  endif()
endif()

if(TORCH_FOUND AND NOT TARGET nanoccl::torch)
  add_library(nanoccl::torch INTERFACE IMPORTED GLOBAL)
  # SYSTEM: torch's headers do not compile warning-free under -Wall -Wextra.
  set_target_properties(nanoccl::torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES
      "${NANOCCL_TORCH_ROOT}/include;${NANOCCL_TORCH_ROOT}/include/torch/csrc/api/include"
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES
      "${NANOCCL_TORCH_ROOT}/include;${NANOCCL_TORCH_ROOT}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1"
    INTERFACE_LINK_LIBRARIES "${_lib}/libtorch.so;${_lib}/libtorch_cpu.so;${_lib}/libc10.so")
  add_library(nanoccl::torch_python INTERFACE IMPORTED GLOBAL)
  set_target_properties(nanoccl::torch_python PROPERTIES
    INTERFACE_LINK_LIBRARIES "nanoccl::torch;${_lib}/libtorch_python.so")
  message(STATUS "nanoccl: torch ${NANOCCL_TORCH_VERSION} at ${NANOCCL_TORCH_ROOT}")
endif()
