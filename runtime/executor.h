#pragma once
// Executes an IR graph on CPU: for calibration (an observer sees every activation), for
// `qforge compare`, and for running bundles.
//
// Guarantees:
// - Every node's op is checked against the op table when the Executor is built; an op it
//   lacks is Error(Unsupported) naming the op and node, before anything runs.
// - Shapes are computed at run time from the actual inputs (dynamic batch and sequence).
// - Intermediates are released right after their last consumer runs, so peak memory is the
//   live set, not the sum of all activations.
// - Outputs are bit-identical for any `threads`: work is split into chunks whose boundaries
//   depend only on tensor shapes, float reductions run sequentially inside one chunk, each
//   sgemm call covers a fixed tile of the output (OpenBLAS itself runs single-threaded; see
//   kernels/gemm.h), and a product with a packed weight computes each element as one chain in
//   k order (kernels/packed_gemm.h). Results may differ between machines whose OpenBLAS picks
//   another kernel, or whose CPU lacks AVX2/FMA (no packed weights there).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "kernels/device.h"

namespace qforge {

// How f16/bf16 activations are computed. Every op computes in f32; the policies differ in where
// results are rounded to their declared 16-bit type.
enum class HalfCompute {
  Auto,   // Ort on CPU, PerOp with Device::Cuda
  // What ONNX Runtime's CPU provider does (its InsertCastTransformer and
  // RemoveDuplicateCastTransformer): ops it has no fp16 CPU kernel for (Add, MatMul, Softmax,
  // Erf, ...) run in f32, and so does an op with an fp16 kernel whose fp16 inputs and readers
  // all are such ops; a value passing from one such op to another stays f32. A value
  // is rounded where ORT's graph holds it in 16 bits: a graph output, the input of an op with
  // a real fp16 CPU kernel (LayerNormalization, MatMulNBits, DequantizeLinear, Clip, Max/Min,
  // data movement: Reshape, Transpose, Gather, Concat, ...), and model Casts except those ORT
  // folds away (a Cast between f32 and 16 bits whose other side is an f32-computing op).
  Ort,
  PerOp,  // each op's output rounded to its 16-bit type, like a GPU fp16 kernel
};

struct ExecutorOptions {
  // Auto runs on CPU. Cuda runs MatMul, Gemm and the W4A16 products on the device and the rest
  // on the CPU (runtime/cuda/device_runtime.h); without a device it is Error(Unsupported).
  Device device = Device::Cpu;
  int threads = 0;              // 0: as many as OpenMP offers
  // W4A16 products run packed (runtime/int4_fusion.h); the dequantized weights of fused
  // DequantizeLinear nodes are then never computed, so an observer does not see them.
  bool fuse_int4 = true;
  HalfCompute half_compute = HalfCompute::Auto;
  // The constant weights of MatMul, Gemm and Conv are packed once, here, for
  // kernels/packed_gemm.h (where the CPU has AVX2 and FMA), instead of by every sgemm call. The
  // packed copies add the size of those weights (in f32) to the executor's memory.
  bool pack_weights = true;
  // Float subgraphs run as one op (runtime/op_fusion.h): Constant nodes, MatMul + bias Add,
  // the five-op GELU, RMSNorm's chain, SiLU, Conv + BatchNormalization, Conv + Relu, Add +
  // Relu. The values inside a fused subgraph are never computed, so an observer does not see
  // them; what observes every value (calibration, `compare`) turns this off.
  bool fuse_ops = true;
};

// Called with each graph input as fed, then with every value a node produces, in execution
// order. The tensor is only valid during the call; copy it (it is cheap: storage is shared) to
// keep it.
using ValueObserver = std::function<void(const std::string& value_name, const Tensor& value)>;

// Where one run's nodes ran. With Device::Cuda a node whose inputs the device does not handle
// runs on the CPU after copies, so a test of the CUDA path checks device_ops, not only values.
struct RunCounts {
  int64_t device_ops = 0;  // nodes run on the CUDA device
  int64_t cpu_ops = 0;     // nodes run on the CPU
  int64_t uploads = 0;     // values copied to the device
  int64_t downloads = 0;   // values copied back
};

class DeviceRuntime;

class Executor {
 public:
  // Copies what it needs of `graph` (tensor storage is shared, not copied). Throws
  // Error(Unsupported) for an op the runtime lacks or a device it cannot use, and
  // Error(InvalidInput) for a graph that fails Graph::check().
  explicit Executor(const Graph& graph, ExecutorOptions options = {});

  // Runs the graph and returns its outputs in graph order. Every graph input must be fed
  // exactly once (inputs that are also initializers may be left out: the initializer is the
  // default); dtypes must match and fixed dimensions must agree. Errors name the feed.
  // `counts`, when given, receives where the nodes ran.
  std::vector<Tensor> run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                          RunCounts* counts = nullptr) const;

  void set_observer(ValueObserver observer) { observer_ = std::move(observer); }

  const std::vector<ValueInfo>& inputs() const { return graph_.inputs; }
  const std::vector<ValueInfo>& outputs() const { return graph_.outputs; }
  int threads() const { return threads_; }
  // The policy in force (never Auto).
  HalfCompute half_compute() const { return half_compute_; }
  // Names of the 16-bit values the policy keeps in f32 (Ort): empty under PerOp. For tests.
  std::vector<std::string> values_kept_f32() const;

  // Ops the runtime executes ("Add", "Conv", ...), sorted.
  static std::vector<std::string> supported_ops();
  // Opset assumed for the default domain when a graph imports none (graphs built in code).
  static constexpr int64_t kDefaultOpset = 21;

 private:
  struct Plan;  // per-node op, value slots and release lists (executor.cpp)

  void bind_feeds(const std::vector<std::pair<std::string, Tensor>>& feeds,
                  std::vector<Tensor>& slots) const;

  Graph graph_;
  int threads_ = 1;
  HalfCompute half_compute_ = HalfCompute::PerOp;
  ValueObserver observer_;
  std::shared_ptr<const Plan> plan_;
  std::shared_ptr<const DeviceRuntime> device_;  // set for Device::Cuda
};

}  // namespace qforge
