#include "runtime/cuda/device_runtime.h"

#include <mutex>
#include <string>
#include <unordered_map>

#include "ir/error.h"
#include "kernels/int4.h"
#include "qforge/cublas_config.h"
#include "runtime/ops/matmul_nbits.h"
#ifdef QFORGE_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/int4_matmul_cuda.h"
#include "kernels/gemm.h"
#endif

namespace qforge {

namespace {

[[maybe_unused]] bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }
[[maybe_unused]] bool is_int4_matmul(const Node& node) {
  return node.domain == ops::kInternalDomain && node.op_type == ops::kInt4MatMulOp;
}

}  // namespace

bool DeviceRuntime::has_device_op(const Node& node) {
#ifdef QFORGE_HAVE_CUDA
  if (is_int4_matmul(node)) return true;
  return QFORGE_HAVE_CUBLAS && default_domain(node) &&
         (node.op_type == "MatMul" || node.op_type == "Gemm");
#else
  (void)node;
  return false;
#endif
}

#ifdef QFORGE_HAVE_CUDA

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    fail_internal(std::string("CUDA runtime: ") + what + ": " + cudaGetErrorString(status));
  }
}

DeviceValue allocate(DType dtype, Shape shape, size_t bytes) {
  DeviceValue v;
  void* p = nullptr;
  if (bytes > 0) check(cudaMalloc(&p, bytes), "cudaMalloc");
  v.ptr = std::shared_ptr<void>(p, [](void* q) {
    if (q != nullptr) cudaFree(q);
  });
  if (p == nullptr) v.ptr = std::shared_ptr<void>(reinterpret_cast<void*>(1), [](void*) {});
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.bytes = bytes;
  return v;
}

DeviceValue upload(const Tensor& t) {
  DeviceValue v = allocate(t.dtype(), t.shape(), t.nbytes());
  if (v.bytes > 0) check(cudaMemcpy(v.ptr.get(), t.bytes().data(), v.bytes, cudaMemcpyHostToDevice), "upload");
  return v;
}

Tensor download(const DeviceValue& v) {
  Tensor t(v.dtype, v.shape);
  if (v.bytes > 0) {
    check(cudaMemcpy(t.mutable_bytes().data(), v.ptr.get(), v.bytes, cudaMemcpyDeviceToHost),
          "download");
  }
  return t;
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

struct DeviceRuntime::Cache {
  std::mutex mu;
  std::unordered_map<int, DeviceValue> values;
};

DeviceRuntime::DeviceRuntime() : cache_(std::make_unique<Cache>()) {}
DeviceRuntime::~DeviceRuntime() = default;

DeviceRuntime::Run::Run(const DeviceRuntime& rt, std::vector<Tensor>& host,
                        const std::vector<bool>& constant)
    : rt_(rt), host_(host), constant_(constant), dev_(host.size()) {}

const DeviceValue& DeviceRuntime::Run::device(int slot) {
  DeviceValue& d = dev_[static_cast<size_t>(slot)];
  if (!d.empty()) return d;
  const Tensor& h = host_[static_cast<size_t>(slot)];
  if (h.empty()) fail_internal("CUDA runtime: value slot " + std::to_string(slot) + " holds no tensor");
  if (constant_[static_cast<size_t>(slot)]) {
    const std::lock_guard<std::mutex> lock(rt_.cache_->mu);
    auto [it, added] = rt_.cache_->values.try_emplace(slot);
    if (added) {
      it->second = upload(h);
      ++uploads_;
    }
    d = it->second;
  } else {
    d = upload(h);
    ++uploads_;
  }
  return d;
}

const Tensor& DeviceRuntime::Run::host(int slot) {
  Tensor& h = host_[static_cast<size_t>(slot)];
  const DeviceValue& d = dev_[static_cast<size_t>(slot)];
  if (h.empty() && !d.empty()) {
    h = download(d);
    ++downloads_;
  }
  return h;
}

void DeviceRuntime::Run::release(int slot) {
  host_[static_cast<size_t>(slot)] = Tensor();
  dev_[static_cast<size_t>(slot)] = DeviceValue();
}

bool DeviceRuntime::Run::run(const Node& node, const std::vector<int>& in,
                             const std::vector<int>& out) {
  // dtype and shape of an input from whichever copy exists.
  const auto meta = [&](size_t i) -> std::pair<DType, Shape> {
    const auto s = static_cast<size_t>(in[i]);
    if (!host_[s].empty()) return {host_[s].dtype(), host_[s].shape()};
    return {dev_[s].dtype, dev_[s].shape};
  };
  const auto present = [&](size_t i) { return i < in.size() && in[i] >= 0; };
  if (out.empty() || out[0] < 0 || !present(0) || !present(1)) return false;
  const auto [adt, ashape] = meta(0);
  const auto [bdt, bshape] = meta(1);
  DeviceValue y;

  if (is_int4_matmul(node)) {
    if (present(4)) return false;  // bias: the CPU op adds it
    if ((adt != DType::F32 && adt != DType::F16) || bdt != DType::I4 || bshape.size() != 2 ||
        ashape.empty() || ashape.back() != bshape[0] || !present(2)) {
      return false;
    }
    const auto [sdt, sshape] = meta(2);
    if (sdt != DType::F32 && sdt != DType::F16) return false;
    if (present(3) && meta(3).first != DType::I8) return false;
    // The CPU op's checks (runtime/ops/matmul_nbits.cpp): scales and zero points hold one value
    // per (block of K, column). Inputs that fail them go to the CPU op, which reports the node;
    // the kernel would read past them.
    const int64_t block_size = node.attr_int("block_size", 0);
    if (block_size <= 0) return false;
    const int64_t params = int4_block_count(bshape[0], block_size) * bshape[1];
    if (numel(sshape) != params || (present(3) && numel(meta(3).second) != params)) return false;
    Shape yshape = ashape;
    yshape.back() = bshape[1];
    const size_t esize = adt == DType::F16 ? 2 : 4;
    y = allocate(adt, yshape, static_cast<size_t>(numel(yshape)) * esize);
    cuda::Int4MatmulDeviceArgs a;
    a.x = device(in[0]).ptr.get();
    a.x_f16 = adt == DType::F16;
    a.k = bshape[0];
    a.n = bshape[1];
    a.m = a.k == 0 ? 0 : numel(ashape) / a.k;
    a.block_size = block_size;
    // An empty reduction is a sum of nothing: zeros, as MatMul gives (the kernel has no rows).
    if (a.k == 0 && y.bytes > 0) check(cudaMemset(y.ptr.get(), 0, y.bytes), "cudaMemset");
    a.packed = static_cast<const uint8_t*>(device(in[1]).ptr.get());
    a.scales = device(in[2]).ptr.get();
    a.scales_f16 = sdt == DType::F16;
    a.zero_points = present(3) ? static_cast<const int8_t*>(device(in[3]).ptr.get()) : nullptr;
    a.round_to_f16 = node.attr_int("round_f16", 0) != 0;
    a.y = y.ptr.get();
    a.y_f16 = adt == DType::F16;
    cuda::int4_matmul_device(a, nullptr);
  } else {
#if QFORGE_HAVE_CUBLAS
    if (!default_domain(node) || adt != DType::F32 || bdt != DType::F32) return false;
    GemmShape g;
    if (node.op_type == "MatMul") {
      if (ashape.size() < 2 || bshape.size() != 2 || ashape.back() != bshape[0]) return false;
      g.k = bshape[0];
      g.n = bshape[1];
      g.m = g.k == 0 ? 0 : numel(ashape) / g.k;
      g.lda = g.k;
      g.ldb = g.n;
      g.ldc = g.n;
      Shape yshape = ashape;
      yshape.back() = g.n;
      y = allocate(DType::F32, yshape, static_cast<size_t>(numel(yshape)) * 4);
      if (g.k == 0 && y.bytes > 0) check(cudaMemset(y.ptr.get(), 0, y.bytes), "cudaMemset");
    } else if (node.op_type == "Gemm") {
      if (ashape.size() != 2 || bshape.size() != 2) return false;
      g.trans_a = node.attr_int("transA", 0) != 0;
      g.trans_b = node.attr_int("transB", 0) != 0;
      g.alpha = node.attr_float("alpha", 1.0f);
      const float beta = node.attr_float("beta", 1.0f);
      g.m = g.trans_a ? ashape[1] : ashape[0];
      g.k = g.trans_a ? ashape[0] : ashape[1];
      g.n = g.trans_b ? bshape[0] : bshape[1];
      if ((g.trans_b ? bshape[1] : bshape[0]) != g.k) return false;
      g.lda = ashape[1];
      g.ldb = bshape[1];
      g.ldc = g.n;
      y = allocate(DType::F32, {g.m, g.n}, static_cast<size_t>(g.m * g.n) * 4);
      if (present(2) && beta != 0.0f) {
        // C broadcast to [M, N] on the host (a bias, usually a constant), then beta * C.
        const Tensor& c = host(in[2]);
        if (c.dtype() != DType::F32 || c.rank() > 2) return false;
        const int64_t cr = c.rank() == 2 ? c.shape()[0] : 1;
        const int64_t cc = c.rank() >= 1 ? c.shape().back() : 1;
        if ((cr != 1 && cr != g.m) || (cc != 1 && cc != g.n)) return false;
        Tensor full(DType::F32, {g.m, g.n});
        auto f = full.mutable_data<float>();
        const auto cv = c.data<float>();
        for (int64_t i = 0; i < g.m; ++i)
          for (int64_t j = 0; j < g.n; ++j)
            f[static_cast<size_t>(i * g.n + j)] =
                cv[static_cast<size_t>((cr == 1 ? 0 : i) * cc + (cc == 1 ? 0 : j))];
        if (y.bytes > 0) {
          check(cudaMemcpy(y.ptr.get(), f.data(), y.bytes, cudaMemcpyHostToDevice), "upload C");
        }
        g.beta = beta;
      } else if (g.k == 0 && y.bytes > 0) {
        check(cudaMemset(y.ptr.get(), 0, y.bytes), "cudaMemset");
      }
    } else {
      return false;
    }
    if (g.k > 0 && g.m > 0 && g.n > 0) {
      gemm_f32_device(g, static_cast<const float*>(device(in[0]).ptr.get()),
                      static_cast<const float*>(device(in[1]).ptr.get()),
                      static_cast<float*>(y.ptr.get()), nullptr);
    }
#else
    return false;
#endif
  }
  const auto o = static_cast<size_t>(out[0]);
  dev_[o] = std::move(y);
  host_[o] = Tensor();
  return true;
}

#else  // no CUDA in this build

struct DeviceRuntime::Cache {};

DeviceRuntime::DeviceRuntime() {
  fail_unsupported("CUDA execution: this qforge was built without CUDA (use --device cpu)");
}
DeviceRuntime::~DeviceRuntime() = default;

DeviceRuntime::Run::Run(const DeviceRuntime& rt, std::vector<Tensor>& host,
                        const std::vector<bool>& constant)
    : rt_(rt), host_(host), constant_(constant) {}
const Tensor& DeviceRuntime::Run::host(int slot) { return host_[static_cast<size_t>(slot)]; }
bool DeviceRuntime::Run::run(const Node&, const std::vector<int>&, const std::vector<int>&) {
  return false;
}
void DeviceRuntime::Run::release(int slot) { host_[static_cast<size_t>(slot)] = Tensor(); }
const DeviceValue& DeviceRuntime::Run::device(int) {
  fail_internal("CUDA runtime: no CUDA in this build");
}

#endif

}  // namespace qforge
