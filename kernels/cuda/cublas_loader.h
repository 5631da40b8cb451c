#pragma once
// cuBLAS, loaded with dlopen at first use: the binary links no cuBLAS and starts without it.
// Built when CMake found the cuBLAS headers (QFORGE_CUBLAS_ROOT; qforge/cublas_config.h says
// QFORGE_HAVE_CUBLAS 1). The library is looked up as $QFORGE_CUBLAS_LIB (a full path) when
// set, else libcublas.so.13 through the dynamic linker's search path, else in the lib/ folder
// of the wheel found at configure time. Missing: Error(Unsupported) naming the library and how
// to install it. No cuBLAS types here; kernels/cuda/cublas_api.h has the entry points.
#include <string>

namespace qforge::cuda {

struct CublasLibrary {
  std::string path;  // what was loaded
};

// Loads the library on the first call (thread-safe) and resolves every entry point qforge
// uses. Throws Error(Unsupported) when it cannot be loaded or lacks a symbol.
const CublasLibrary& load_cublas();

// Loads from exactly `path` and resolves the entry points, without caching (tests: the error
// for a missing library).
CublasLibrary load_cublas_from(const std::string& path);

}  // namespace qforge::cuda
