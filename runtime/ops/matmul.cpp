// MatMul (numpy semantics: 1-D operands, broadcast batch dims) and Gemm, through the tiled
// sgemm of kernels/gemm.h, or through kernels/packed_gemm.h where the executor packed the
// constant weight (runtime/ops/matmul.h). f16/bf16 are computed in f32. The W4A16 products
// (MatMulNBits, the fused Int4MatMul) live in matmul_nbits.cpp and are listed here.
#include "runtime/ops/matmul.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "ir/error.h"
#include "kernels/gemm.h"
#include "runtime/op_registry.h"
#include "runtime/op_utils.h"
#include "runtime/ops/activation.h"
#include "runtime/ops/matmul_nbits.h"

namespace qforge::ops {

namespace {

// The packed weight `p` is what the node's input 1 holds: same K and N.
bool packed_fits(const PackedMatrix* p, int64_t k, int64_t n) {
  return p != nullptr && p->k() == k && p->n() == n;
}

// MatMul, or MatMulBias (runtime/op_fusion.h) when `bias` [N] is given: out = A @ B + bias,
// where a packed product's sums start at the bias.
void matmul(OpContext& ctx, const Tensor* bias) {
  const DType dt = float_dtype(ctx, 0);
  if (ctx.input(1).dtype() != dt) ctx.fail_dtype(1);
  const Tensor a = to_f32(ctx.input(0));
  const PackedMatrix* packed = ctx.packed_weight;  // then B is read from it alone
  const Tensor b = packed != nullptr ? ctx.input(1) : to_f32(ctx.input(1));
  if (a.rank() == 0 || b.rank() == 0) ctx.fail_invalid("MatMul needs inputs of rank 1 or more");
  // Promote 1-D operands to matrices; their unit dim is dropped from the result.
  Shape sa = a.shape(), sb = b.shape();
  const bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  if (sb[sb.size() - 2] != k) {
    ctx.fail_invalid("shapes " + shape_to_string(a.shape()) + " and " + shape_to_string(b.shape()) +
                     " cannot be multiplied (inner dims " + std::to_string(k) + " and " +
                     std::to_string(sb[sb.size() - 2]) + ")");
  }
  const Shape batch_a(sa.begin(), sa.end() - 2), batch_b(sb.begin(), sb.end() - 2);
  const Shape batch = broadcast_shapes(ctx, {&batch_a, &batch_b});
  Shape out_shape = batch;
  if (!a_vec) out_shape.push_back(m);
  if (!b_vec) out_shape.push_back(n);
  float* po = nullptr;  // every product below writes every element
  Tensor out = unset_tensor(DType::F32, out_shape, &po);

  const float* pa = a.data<float>().data();
  const int64_t batches = dims_product(batch, 0, batch.size());
  const int64_t rows = n > 0 ? static_cast<int64_t>(out.numel()) / n : 0;
  const float* pbias = nullptr;
  if (bias != nullptr) {
    if (bias->dtype() != DType::F32 || bias->shape() != Shape{n}) {
      ctx.fail_invalid("bias " + shape_to_string(bias->shape()) + " is not f32 [" +
                       std::to_string(n) + "]");
    }
    pbias = bias->data<float>().data();
  }
  // Unpacked: the bias is added to the finished sums, as the unfused Add does (the packed
  // product adds it in its last pass where the node asks for that).
  const auto add_bias = [&] {
    if (pbias == nullptr) return;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < n; ++j) po[r * n + j] += pbias[j];
    }
  };
  if (packed != nullptr) {  // one matrix B: A's batch dims folded into M
    if (!packed_fits(packed, k, n)) fail_internal(ctx.label() + ": packed weight of another shape");
    const bool start_at_bias = pbias != nullptr && ctx.attr_int(kBiasAfterSumsAttr, 0) == 0;
    gemm_f32_packed(ctx.threads(), m * batches, pa, k, *packed, po, n, false,
                    start_at_bias ? pbias : nullptr, start_at_bias ? nullptr : pbias);
    ctx.set_output(0, from_f32(out, dt));
    return;
  }
  const float* pb = b.data<float>().data();
  GemmShape g{.m = m, .n = n, .k = k, .lda = k, .ldb = n, .ldc = n};
  if (shape_numel(batch_b) == 1 && batch_a == batch) {
    // B is one matrix: fold A's batch dims into M for one large product.
    g.m = m * batches;
    gemm_f32(ctx.threads(), g, pa, pb, po);
  } else {
    if (pbias != nullptr) fail_internal(ctx.label() + ": a bias needs one matrix B");
    std::vector<const float*> as, bs;
    std::vector<float*> cs;
    const Broadcaster bc(batch, {&batch_a, &batch_b});
    bc.for_each_span<2>(0, batches, [&](int64_t o, int64_t len, const std::array<int64_t, 2>& in) {
      for (int64_t i = 0; i < len; ++i) {
        as.push_back(pa + (in[0] + i * bc.inner_stride(0)) * m * k);
        bs.push_back(pb + (in[1] + i * bc.inner_stride(1)) * k * n);
        cs.push_back(po + (o + i) * m * n);
      }
    });
    if (packed_gemm_supported()) {
      // Both operands computed (attention's scores and context): each B packed here, each
      // product one FMA chain per element, the products shared among the threads (or, fewer
      // than the threads, each product's tasks).
      const auto one = [&](size_t i, int threads) {
        const PackedMatrix packed_b(bs[i], k, n, n, false);
        gemm_f32_packed(threads, m, as[i], k, packed_b, cs[i], n, false);
      };
      const auto count = static_cast<int64_t>(as.size());
      if (count < ctx.threads()) {
        for (size_t i = 0; i < as.size(); ++i) one(i, ctx.threads());
      } else {
        const auto chunk = [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) one(static_cast<size_t>(i), 1);
        };
        parallel_chunks(ctx.threads(), count, grain_for(m * n * k), chunk);
      }
    } else {
      gemm_f32_batched(ctx.threads(), g, as, bs, cs);
    }
  }
  add_bias();
  ctx.set_output(0, from_f32(out, dt));
}

void run_matmul(OpContext& ctx) { matmul(ctx, nullptr); }

// kAttentionOp (matmul.h) as the ops it fused: MatMul, ScaleAddSoftmax, MatMul (a Transpose of
// the keys first where the node has its perm), each through its own implementation.
void attention_unfused(OpContext& ctx, const Tensor* keys) {
  const auto step = [&](OpFn fn, std::vector<const Tensor*> inputs) {
    OpContext sub = ctx.derived();
    sub.inputs = std::move(inputs);
    sub.outputs.resize(1);
    fn(sub);
    return std::move(sub.outputs[0]);
  };
  Tensor transposed;
  if (ctx.attr("perm") != nullptr) {
    transposed = step(find_op("", "Transpose"), {keys});
    keys = &transposed;
  }
  const Tensor* c = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const Tensor* b = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  const Tensor scores = step(run_matmul, {&ctx.input(0), keys});
  Tensor probs = step(run_scale_add_softmax, {&scores, c, b});
  if (ctx.has_input(5)) {  // the NaN guard: Where(IsNaN(p), z, p)
    const Tensor nan = step(find_op("", "IsNaN"), {&probs});
    probs = step(find_op("", "Where"), {&nan, &ctx.input(5), &probs});
  }
  ctx.set_output(0, step(run_matmul, {&probs, &ctx.input(4)}));
}

// kAttentionOp (matmul.h). f32 operands of rank 2 or more whose batch dims broadcast, V adding
// none, a scalar scale and a bias that broadcasts to the scores: each product's K' and V packed
// once (a K or V that several products share, as grouped-query heads do, once in all), then
// tasks of a product's block of query rows: scores into the task's scratch, their softmax in
// place, the block's output rows. The packed kernel's elements are FMA chains whatever the rows
// taken together, and ScaleAddSoftmax's rows its own, so the bits are the unfused ops'.
// Anything else runs the ops one after another.
void run_attention(OpContext& ctx) {
  const Tensor& q = ctx.input(0);
  const Tensor& keys = ctx.input(1);
  const Tensor* c = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const Tensor* b = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  const Tensor& v = ctx.input(4);
  const Tensor* z = ctx.has_input(5) ? &ctx.input(5) : nullptr;  // the NaN guard's value
  const std::optional<std::vector<int64_t>> perm = ctx.attr_ints("perm");
  const bool rows = perm.has_value();  // keys given as rows [..., n, k]
  const auto f32 = [](const Tensor* t) { return t == nullptr || t->dtype() == DType::F32; };
  if (!packed_gemm_supported() || !f32(&q) || !f32(&keys) || !f32(c) || !f32(b) || !f32(&v) ||
      !f32(z) || q.rank() < 2 || keys.rank() < 2 || v.rank() < 2 ||
      (c != nullptr && c->numel() != 1) || (z != nullptr && (z->numel() != 1 || z->rank() > 1)) ||
      (rows && (perm->size() != keys.rank() || !swaps_last_two(*perm)))) {
    attention_unfused(ctx, &keys);
    return;
  }
  const Shape& sq = q.shape();
  const Shape& sk = keys.shape();
  const Shape& sv = v.shape();
  const int64_t m = sq[sq.size() - 2], k = sq.back();
  const int64_t n = rows ? sk[sk.size() - 2] : sk.back();
  const int64_t d = sv.back();
  if ((rows ? sk.back() : sk[sk.size() - 2]) != k || sv[sv.size() - 2] != n) {
    attention_unfused(ctx, &keys);  // the MatMul's own error
    return;
  }
  const Shape batch_q(sq.begin(), sq.end() - 2), batch_k(sk.begin(), sk.end() - 2),
      batch_v(sv.begin(), sv.end() - 2);
  const Shape batch = broadcast_shapes(ctx, {&batch_q, &batch_k});
  Shape scores_shape = batch;
  scores_shape.push_back(m);
  scores_shape.push_back(n);
  if (broadcast_shapes(ctx, {&batch, &batch_v}) != batch ||
      (b != nullptr && broadcast_shapes(ctx, {&scores_shape, &b->shape()}) != scores_shape)) {
    attention_unfused(ctx, &keys);
    return;
  }
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(d);
  float* po = nullptr;
  Tensor out = unset_tensor(DType::F32, out_shape, &po);
  const int64_t products = shape_numel(batch);
  if (out.numel() == 0) {
    ctx.set_output(0, std::move(out));
    return;
  }
  // Each product's operands; each distinct K' and V packed once.
  std::vector<const float*> qs;
  std::vector<size_t> k_of, v_of;
  std::vector<const float*> k_src, v_src;
  const auto index_of = [](std::vector<const float*>& src, const float* p) {
    const auto at = std::find(src.begin(), src.end(), p);
    if (at != src.end()) return static_cast<size_t>(at - src.begin());
    src.push_back(p);
    return src.size() - 1;
  };
  const float* pq = q.data<float>().data();
  const float* pk = keys.data<float>().data();
  const float* pv = v.data<float>().data();
  const Broadcaster bcb(batch, {&batch_q, &batch_k, &batch_v});
  bcb.for_each_span<3>(0, products, [&](int64_t, int64_t len, const std::array<int64_t, 3>& in) {
    for (int64_t i = 0; i < len; ++i) {
      qs.push_back(pq + (in[0] + i * bcb.inner_stride(0)) * m * k);
      k_of.push_back(index_of(k_src, pk + (in[1] + i * bcb.inner_stride(1)) * k * n));
      v_of.push_back(index_of(v_src, pv + (in[2] + i * bcb.inner_stride(2)) * n * d));
    }
  });
  std::vector<std::unique_ptr<PackedMatrix>> packed_k(k_src.size()), packed_v(v_src.size());
  const auto pack_count = static_cast<int64_t>(k_src.size() + v_src.size());
  run_tasks(ctx.threads(), pack_count, [&](int64_t t, int) {
    const auto i = static_cast<size_t>(t);
    if (i < k_src.size()) {
      // K' [k, n]: given as rows [n, k], it is their transpose.
      packed_k[i] = std::make_unique<PackedMatrix>(k_src[i], k, n, rows ? k : n, rows);
    } else {
      const size_t j = i - k_src.size();
      packed_v[j] = std::make_unique<PackedMatrix>(v_src[j], n, d, d, false);
    }
  });
  const Broadcaster bcs(scores_shape,
                        {&scores_shape, b != nullptr ? &b->shape() : &scores_shape});
  const SoftmaxRows softmax{.n = n,
                            .scale = c != nullptr ? c->data<float>().data() : nullptr,
                            .divide = ctx.attr_int("divide", 0) != 0,
                            .bias = b != nullptr ? b->data<float>().data() : nullptr,
                            .bc = &bcs};
  // A block of query rows whose scores (and their exponentials' scratch) stay in the core's
  // L2: 64 rows of 512 keys are 128 KB each.
  const int64_t block = std::clamp<int64_t>(32768 / std::max<int64_t>(n, 1), 8, 256);
  const int64_t blocks = (m + block - 1) / block;
  struct Scratch {
    std::vector<float> scores, u;
  };
  std::vector<Scratch> scratch(static_cast<size_t>(std::max(ctx.threads(), 1)));
  run_tasks(ctx.threads(), products * blocks, [&](int64_t t, int slot) {
    const int64_t p = t / blocks;
    const int64_t r0 = (t % blocks) * block;
    const int64_t count = std::min(block, m - r0);
    Scratch& s = scratch[static_cast<size_t>(slot)];
    if (s.scores.size() < static_cast<size_t>(block * n)) s.scores.resize(block * n);
    float* sc = s.scores.data();
    const auto pi = static_cast<size_t>(p);
    gemm_f32_packed(1, count, qs[pi] + r0 * k, k, *packed_k[k_of[pi]], sc, n, false);
    const int64_t row = p * m + r0;  // in the scores, for the bias
    scale_add_softmax_rows(softmax, row, row + count, sc, sc, s.u);
    if (z != nullptr) {  // Where(IsNaN(p), z, p)
      const float zv = z->data<float>()[0];
      for (int64_t i = 0; i < count * n; ++i) sc[i] = std::isnan(sc[i]) ? zv : sc[i];
    }
    gemm_f32_packed(1, count, sc, n, *packed_v[v_of[pi]], po + row * d, d, false);
  });
  ctx.set_output(0, std::move(out));
}

void run_matmul_bias(OpContext& ctx) {
  if (ctx.input(1).rank() != 2) ctx.fail_invalid("MatMulBias needs a 2-D B");
  matmul(ctx, &ctx.input(2));
}

void run_gemm(OpContext& ctx) {
  const DType dt = float_dtype(ctx, 0);
  if (ctx.input(1).dtype() != dt) ctx.fail_dtype(1);
  const Tensor a = to_f32(ctx.input(0));
  const PackedMatrix* packed = ctx.packed_weight;  // then B is read from it alone
  const Tensor b = packed != nullptr ? ctx.input(1) : to_f32(ctx.input(1));
  if (a.rank() != 2 || b.rank() != 2) {
    ctx.fail_invalid("Gemm needs 2-D A and B, got " + shape_to_string(a.shape()) + " and " +
                     shape_to_string(b.shape()));
  }
  const bool ta = ctx.attr_int("transA", 0) != 0, tb = ctx.attr_int("transB", 0) != 0;
  const float alpha = ctx.attr_float("alpha", 1.0f), beta = ctx.attr_float("beta", 1.0f);
  const int64_t m = ta ? a.shape()[1] : a.shape()[0];
  const int64_t k = ta ? a.shape()[0] : a.shape()[1];
  const int64_t kb = tb ? b.shape()[1] : b.shape()[0];
  const int64_t n = tb ? b.shape()[0] : b.shape()[1];
  if (k != kb) {
    ctx.fail_invalid("A " + shape_to_string(a.shape()) + " and B " + shape_to_string(b.shape()) +
                     " do not agree on K with transA=" + std::to_string(ta) +
                     ", transB=" + std::to_string(tb));
  }
  float* po = nullptr;  // every product below writes every element
  Tensor out = unset_tensor(DType::F32, {m, n}, &po);
  const bool with_c = ctx.has_input(2) && beta != 0.0f;
  if (with_c) {  // out = beta * C broadcast to [M, N], then accumulate alpha * A @ B
    if (ctx.input(2).dtype() != dt) ctx.fail_dtype(2);
    const Tensor c = to_f32(ctx.input(2));
    const Shape mn{m, n};
    bool fits = c.rank() <= 2;
    for (size_t i = 0; fits && i < c.rank(); ++i) {
      const int64_t d = c.shape()[c.rank() - 1 - i];
      fits = d == 1 || d == mn[1 - i];
    }
    if (!fits) {
      ctx.fail_invalid("C " + shape_to_string(c.shape()) +
                       " does not broadcast to [M, N] = " + shape_to_string(mn));
    }
    const Broadcaster bc(mn, {&c.shape()});
    const float* pc = c.data<float>().data();
    bc.for_each_span<1>(0, m * n, [&](int64_t o, int64_t len, const std::array<int64_t, 1>& in) {
      for (int64_t i = 0; i < len; ++i) po[o + i] = beta * pc[in[0] + i * bc.inner_stride(0)];
    });
  }
  if (packed != nullptr) {
    if (ta || alpha != 1.0f || !packed_fits(packed, k, n)) {
      fail_internal(ctx.label() + ": packed weight for another product");
    }
    gemm_f32_packed(ctx.threads(), m, a.data<float>().data(), a.shape()[1], *packed, po, n,
                    with_c);
    ctx.set_output(0, from_f32(out, dt));
    return;
  }
  const GemmShape g{.trans_a = ta,
                    .trans_b = tb,
                    .m = m,
                    .n = n,
                    .k = k,
                    .lda = a.shape()[1],
                    .ldb = b.shape()[1],
                    .ldc = n,
                    .alpha = alpha,
                    .beta = with_c ? 1.0f : 0.0f};
  gemm_f32(ctx.threads(), g, a.data<float>().data(), b.data<float>().data(), po);
  ctx.set_output(0, from_f32(out, dt));
}

constexpr OpEntry kOps[] = {
    {"", "MatMul", run_matmul},
    {"", "Gemm", run_gemm},
    {kInternalDomain, kMatMulBiasOp, run_matmul_bias},
    {kInternalDomain, kAttentionOp, run_attention},
    {"com.microsoft", "MatMulNBits", run_matmul_nbits},
    {kInternalDomain, kInt4MatMulOp, run_int4_matmul},
};

}  // namespace

std::span<const OpEntry> matmul_ops() { return kOps; }

bool swaps_last_two(const std::vector<int64_t>& perm) {
  const auto r = static_cast<int64_t>(perm.size());
  if (r < 2 || perm[r - 2] != r - 1 || perm[r - 1] != r - 2) return false;
  for (int64_t i = 0; i + 2 < r; ++i) {
    if (perm[i] != i) return false;
  }
  return true;
}

std::shared_ptr<const PackedMatrix> pack_constant_weight(const OpContext& ctx,
                                                         const Tensor& weight) {
  const Node& node = ctx.node();
  const bool onnx = node.domain.empty() || node.domain == "ai.onnx";
  if (!packed_gemm_supported() || weight.rank() != 2) return nullptr;
  if (weight.dtype() != DType::F32 && !is_half(weight.dtype())) return nullptr;
  bool trans = false;
  if (node.domain == kInternalDomain && node.op_type == kMatMulBiasOp) {
    // packed as a MatMul's B
  } else if (!onnx) {
    return nullptr;
  } else if (node.op_type == "Gemm") {
    if (ctx.attr_int("transA", 0) != 0 || ctx.attr_float("alpha", 1.0f) != 1.0f) return nullptr;
    trans = ctx.attr_int("transB", 0) != 0;
  } else if (node.op_type != "MatMul") {
    return nullptr;
  }
  const Tensor b = to_f32(weight);
  const int64_t rows = b.shape()[0], cols = b.shape()[1];
  return std::make_shared<const PackedMatrix>(b.data<float>().data(), trans ? cols : rows,
                                              trans ? rows : cols, cols, trans);
}

}  // namespace qforge::ops
