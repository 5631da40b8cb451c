#include "kernels/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "ir/error.h"
#include "kernels/cuda/cublas_api.h"
#include "qforge/cublas_config.h"

namespace qforge::cuda {

namespace {

constexpr const char* kSoname = "libcublas.so.13";
constexpr const char* kInstall =
    "install it with `.venv/bin/pip install nvidia-cublas==13.10.0.20` (scripts/setup.sh does "
    "when nvcc is present) or point QFORGE_CUBLAS_LIB at libcublas.so.13";

template <typename F>
void bind(void* lib, const std::string& path, const char* name, F& fn) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    fail_unsupported("cuBLAS library " + path + " lacks " + name + " (need cuBLAS 13); " +
                     kInstall);
  }
  fn = reinterpret_cast<F>(sym);
}

CublasApi bind_all(void* lib, const std::string& path) {
  CublasApi api;
  api.path = path;
  bind(lib, path, "cublasCreate_v2", api.create);
  bind(lib, path, "cublasDestroy_v2", api.destroy);
  bind(lib, path, "cublasSetStream_v2", api.set_stream);
  bind(lib, path, "cublasSetMathMode", api.set_math_mode);
  bind(lib, path, "cublasSgemm_v2", api.sgemm);
  bind(lib, path, "cublasGemmEx", api.gemm_ex);
  bind(lib, path, "cublasGetStatusString", api.status_string);
  return api;
}

}  // namespace

static CublasApi load_api_from(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    fail_unsupported("cannot load the cuBLAS library " + path + " (" +
                     (why != nullptr ? why : "not found") + "): " + kInstall);
  }
  return bind_all(lib, path);  // the library stays loaded for the process's lifetime
}

const CublasApi& cublas() {
  static std::once_flag once;
  static CublasApi api;
  static std::string failure;
  std::call_once(once, [] {
    std::string tried;
    try {
      if (const char* env = std::getenv("QFORGE_CUBLAS_LIB"); env != nullptr && *env != '\0') {
        api = load_api_from(env);
        return;
      }
      for (const std::string& path : {std::string(kSoname),
                                     std::string(QFORGE_CUBLAS_LIBDIR) + "/" + kSoname}) {
        if (void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL); lib != nullptr) {
          api = bind_all(lib, path);
          return;
        }
        const char* why = dlerror();
        tried += (tried.empty() ? "" : "; ") + path + ": " + (why != nullptr ? why : "not found");
      }
      failure = std::string("cannot load the cuBLAS library ") + kSoname + " (tried " + tried +
                "): " + kInstall;
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) fail_unsupported(failure);
  return api;
}

CublasLibrary load_cublas_from(const std::string& path) {
  return CublasLibrary{load_api_from(path).path};
}

const CublasLibrary& load_cublas() {
  static const CublasLibrary lib{cublas().path};
  return lib;
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const CublasApi& api = cublas();
  fail_internal(std::string("cuBLAS error in ") + what + ": " + api.status_string(status));
}

cublasHandle_t cublas_handle() {
  static std::once_flag once;
  static cublasHandle_t handle = nullptr;
  const CublasApi& api = cublas();
  std::call_once(once, [&] {
    check_cublas(api.create(&handle), "cublasCreate");
    check_cublas(api.set_math_mode(handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
  });
  return handle;
}

}  // namespace qforge::cuda
