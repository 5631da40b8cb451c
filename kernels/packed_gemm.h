#pragma once
// Products with a constant right-hand side packed once: C = A @ B (+ C) on the CPU, where B (a
// model's weight) is laid out ahead of time in panels of 16 columns, so the runtime does not
// repack it on every call as cblas_sgemm does (that packing was a fifth of MiniLM's time).
//
// Every element of C is one fused multiply-add chain over k = 0, 1, ..., K-1 (started from 0,
// or from C's old value when accumulating), whatever the tile, the thread or the row group that
// computes it. So C's bits do not depend on the thread count, on how the rows are split, or on
// how many rows the call has: a row of a batch of 1 equals the same row in a batch of 64.
// The kernel needs AVX2 and FMA; where the CPU lacks them, packed_gemm_supported() is false and
// callers take gemm_f32 (kernels/gemm.h). Where the CPU has AVX-512F, a kernel twice as wide
// runs instead (two panels per call): fused multiply-adds round the same at any vector width, so
// it gives the AVX2 kernel's bits, and a model's outputs do not depend on the CPU's vector ISA.
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>

namespace qforge {

// op(B) [k, n] in ceil(n / 16) panels, each k rows of 16 floats (the last panel zero-padded).
class PackedMatrix {
 public:
  // op(B) = B [k, n] with row stride ldb, or B^T when `trans` (B stored [n, k]).
  PackedMatrix(const float* b, int64_t k, int64_t n, int64_t ldb, bool trans);
  // Panels the caller fills (a convolution writes its columns straight into them): element
  // (kk, j) at mutable_panel(j / 16)[kk * 16 + j % 16]. Only the last panel's columns past n
  // are set here (to 0); the caller writes every other element.
  PackedMatrix(int64_t k, int64_t n);

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  int64_t panels() const { return (n_ + kPanel - 1) / kPanel; }
  const float* panel(int64_t p) const { return data_.get() + p * k_ * kPanel; }
  float* mutable_panel(int64_t p) { return data_.get() + p * k_ * kPanel; }

  static constexpr int64_t kPanel = 16;

 private:
  int64_t k_, n_;
  std::unique_ptr<float[]> data_;
};

// How PackedRows lays A out: in groups of rows for gemm_f32_prepacked, or with its rows as the
// vector lanes for gemm_f32_lanes (blocks of 16 rows, each row of a block one lane of a vector).
enum class RowLayout { Groups, Lanes };

// A [m, k] laid out once for gemm_f32_prepacked or gemm_f32_lanes: a constant left-hand side (a
// convolution's weights, [out channels, in channels x taps]), so that no call packs it again.
class PackedRows {
 public:
  PackedRows(const float* a, int64_t m, int64_t k, int64_t lda,
             RowLayout layout = RowLayout::Groups);

  int64_t m() const { return m_; }
  int64_t k() const { return k_; }
  RowLayout layout() const { return layout_; }
  // Groups: pack_a's layout. Lanes: block b's row l, element kk at data()[(b * k + kk) * 16 + l],
  // the rows past m zero, as many blocks as make whole pairs (32 rows); 64-byte aligned.
  const float* data() const { return data_.get() + align_; }
  // The same A packed as RowLayout::Lanes, made from `a` (the A this was packed from) on the
  // first call and kept: a 1x1 convolution's weights learn the size of the planes they meet,
  // and so which product suits them, only when they run. Safe to call from several threads.
  const PackedRows& as_lanes(const float* a, int64_t lda) const;

 private:
  int64_t m_, k_;
  RowLayout layout_;
  std::unique_ptr<float[]> data_;
  int64_t align_ = 0;
  mutable std::once_flag lanes_once_;
  mutable std::unique_ptr<const PackedRows> lanes_;
};

// B [k, n] read where it lies instead of packed: element (kk, j) at data[row_offset[kk] + j]. A
// stride-1 convolution's zero-padded input planes are such a matrix (row kk a channel and tap,
// column j a position of the padded grid), so it multiplies them without writing columns. The
// product reads whole panels of 16 columns: every row must be readable up to n rounded up to a
// multiple of 16 (the columns past n are read, never stored).
struct InPlaceColumns {
  const float* data;
  std::span<const int64_t> row_offset;  // k entries
  int64_t n;
};

// Where the product's column j lands in a row of C: j is position (i, y, x) of images of
// `rows` x `row_len` positions one after another, stored at i * image_stride + y * row_kept + x
// when y < rows_kept and x < row_kept, and not at all otherwise (a padded grid's columns that
// are no output position).
struct ColumnGrid {
  int64_t row_len, row_kept, rows, rows_kept, image_stride;
};

// True when this CPU runs the packed kernel (AVX2 and FMA).
bool packed_gemm_supported();
// True when the products run on the AVX-512 kernel (the CPU has AVX-512F and
// packed_gemm_use_avx2_only is off).
bool packed_gemm_avx512();
// For tests and benchmarks: run the AVX2 kernel even where the CPU has AVX-512 (process-wide).
void packed_gemm_use_avx2_only(bool on);

// C[m, n] = A[m, k] @ op(B), or C += A @ op(B) when `accumulate`; A and C row-major with row
// strides lda and ldc. `threads` share tasks of C (row groups x panel groups; the split follows
// the thread count, the bits do not). Without `accumulate`, a non-null `col_start` (n values)
// starts every row's sum j at col_start[j]: the same bits as accumulating onto C rows filled
// with col_start, without that pass over C. A non-null `col_add` (n values) is added to each
// finished sum j, rounded once: the bits of adding it to C afterwards, in the same pass.
// Error(Internal) where packed_gemm_supported() is false.
void gemm_f32_packed(int threads, int64_t m, const float* a, int64_t lda, const PackedMatrix& b,
                     float* c, int64_t ldc, bool accumulate, const float* col_start = nullptr,
                     const float* col_add = nullptr);

// True when a product of depth k runs in one pass over k, so that it reads each element of
// its `addend` before it stores that element of C: the addend may then be C itself (an op
// writing its output over an input nothing reads afterwards).
bool gemm_prepacked_one_pass(int64_t k);

// C[m, n] = A @ op(B) with A packed once, each row's sums started at row_start[i] (null: 0):
// the same bits as gemm_f32_packed accumulating onto C rows filled with row_start[i]. With
// `addend` (laid out as C: the element at the same index from it, ldc apart a row), each
// finished sum s becomes s + addend, rounded once (ONNX Add); with `relu`, it is then stored as
// s > 0 ? s : 0 (ONNX Relu; NaN gives 0).
void gemm_f32_prepacked(int threads, const PackedRows& a, const PackedMatrix& b, float* c,
                        int64_t ldc, const float* row_start = nullptr, bool relu = false,
                        const float* addend = nullptr);

// The same product with C's columns stored through `grid` (a chunk of images' columns side by
// side in B, each image's outputs stored in its own place).
void gemm_f32_prepacked(int threads, const PackedRows& a, const PackedMatrix& b,
                        const ColumnGrid& grid, float* c, int64_t ldc,
                        const float* row_start = nullptr, bool relu = false,
                        const float* addend = nullptr);

// The same product with B read in place and C's columns stored through `grid`: each stored
// element is the same FMA chain as gemm_f32_prepacked's on the column matrix B, so the bits
// match that product's wherever the grid stores a column.
void gemm_f32_prepacked(int threads, const PackedRows& a, const InPlaceColumns& b,
                        const ColumnGrid& grid, float* c, int64_t ldc,
                        const float* row_start = nullptr, bool relu = false,
                        const float* addend = nullptr);

// True where gemm_f32_lanes runs: the CPU runs the packed kernel (AVX2 and FMA) and no test
// turned the lane product off. It runs the AVX-512 kernel where packed_gemm_avx512(), else the
// AVX2 one; both give the same bits.
bool lane_gemm_supported();
// For tests: turn the lane product off (process-wide), as on a CPU where it does not run.
void lane_gemm_use(bool on);

// The product gemm_f32_prepacked computes on B read in place through `grid`, with A packed as
// RowLayout::Lanes: 32 rows of C (two vectors of 16 lanes) times up to 14 grid positions a call
// (AVX2: 16 rows, two vectors of 8, times up to 6),
// each element of B broadcast to every lane. Only the positions the grid stores are computed (a
// padded grid's extra columns and a panel's rounding cost nothing), and B's rows are read a
// float at a time, never as vectors straddling cache lines. Each stored element is the same FMA
// chain in k order from row_start, plus the addend, through the Relu, so the bits are those of
// gemm_f32_prepacked. Each element of `addend` is read just before that element of C is stored
// and by nothing else, so the addend may be C itself whatever the depth.
// `b_image_stride` (0: the grid's plane, rows x row_len) is how far apart in B the grid's images
// start: a 1x1 convolution's images are its input planes, cin planes apart.
// Error(Internal) where lane_gemm_supported() is false.
void gemm_f32_lanes(int threads, const PackedRows& a, const InPlaceColumns& b,
                    const ColumnGrid& grid, float* c, int64_t ldc,
                    const float* row_start = nullptr, bool relu = false,
                    const float* addend = nullptr, int64_t b_image_stride = 0);

}  // namespace qforge
