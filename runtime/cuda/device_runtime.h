#pragma once
// The CUDA side of the Executor (ExecutorOptions::device = Cuda). Scope, honestly:
// - On the device: MatMul (f32, B a 2-D matrix) and Gemm (f32) through cuBLAS (fp32, pedantic
//   math), and the W4A16 product Int4MatMul (what the planning step makes of blocked int4
//   DequantizeLinear -> MatMul and of MatMulNBits; f32 or fp16 activations) through
//   kernels/cuda/int4_matmul.cu.
// - Everything else on the CPU, with explicit copies: a value is uploaded when a device op
//   reads it and only a host copy exists, downloaded when a CPU op (or the caller, or an
//   observer) reads it and only a device copy exists. Constants (weights) are uploaded once per
//   Executor and kept on the device.
// - A device op whose inputs it does not handle at run time (another dtype, a batched B, a
//   bias) runs on the CPU instead, after the same copies.
// Without cuBLAS headers in the build, MatMul and Gemm run on the CPU. Built without CUDA the
// class still exists; constructing it throws Unsupported (the Executor checks the device first).
#include <memory>
#include <vector>

#include "ir/graph.h"

namespace qforge {

// Device memory for one value; null when the value has no device copy.
struct DeviceValue {
  std::shared_ptr<void> ptr;
  DType dtype = DType::F32;
  Shape shape;
  size_t bytes = 0;
  bool empty() const { return ptr == nullptr; }
};

class DeviceRuntime {
 public:
  DeviceRuntime();
  ~DeviceRuntime();
  DeviceRuntime(const DeviceRuntime&) = delete;
  DeviceRuntime& operator=(const DeviceRuntime&) = delete;

  // Whether the node's op has a device implementation (decided once, when planning).
  static bool has_device_op(const Node& node);

  // Per run: the device copies of the value slots, beside the executor's host slots.
  class Run {
   public:
    Run(const DeviceRuntime& rt, std::vector<Tensor>& host, const std::vector<bool>& constant);
    // The host copy of a slot, downloading it when only the device has it.
    const Tensor& host(int slot);
    // Runs `node` on the device: true when done (outputs on the device, host slots empty),
    // false when these inputs are not handled there (nothing changed; run it on the CPU).
    bool run(const Node& node, const std::vector<int>& inputs, const std::vector<int>& outputs);
    void release(int slot);
    int64_t uploads() const { return uploads_; }
    int64_t downloads() const { return downloads_; }

   private:
    const DeviceValue& device(int slot);

    const DeviceRuntime& rt_;
    std::vector<Tensor>& host_;
    const std::vector<bool>& constant_;
    std::vector<DeviceValue> dev_;
    int64_t uploads_ = 0, downloads_ = 0;
  };

 private:
  struct Cache;  // constants already on the device, by slot
  std::unique_ptr<Cache> cache_;
};

}  // namespace qforge
