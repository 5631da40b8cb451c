#include "quant/calib/sample_context.h"

#include <string>
#include <utility>

#include "ir/error.h"

namespace qforge {

namespace {

// Whether the model accepts a batch of one sample: no input fixes its leading dimension at
// more than 1.
bool takes_single_samples(const Executor& executor) {
  for (const ValueInfo& in : executor.inputs()) {
    if (in.shape && !in.shape->empty() && (*in.shape)[0].value && *(*in.shape)[0].value != 1) {
      return false;
    }
  }
  return true;
}

// Row `row` of every feed, as a batch of one (windows of the same storage).
BatchSource::Feeds one_sample(const BatchSource::Feeds& batch, int64_t row) {
  BatchSource::Feeds out;
  for (const auto& [name, t] : batch) {
    Shape shape = t.shape();
    const size_t row_bytes = t.nbytes() / static_cast<size_t>(shape[0]);
    shape[0] = 1;
    out.emplace_back(name, Tensor(t.dtype(), std::move(shape), t.storage(),
                                  t.offset() + static_cast<size_t>(row) * row_bytes));
  }
  return out;
}

}  // namespace

int64_t batch_samples(const BatchSource::Feeds& batch) {
  if (batch.empty() || batch.front().second.rank() == 0) return 1;
  return batch.front().second.shape()[0];
}

std::vector<Tensor> run_batch(const Executor& executor, const BatchSource::Feeds& batch,
                              const BatchSource& data, int64_t first_sample) {
  try {
    return executor.run(batch);
  } catch (const Error& e) {
    if (e.category() == ErrorCategory::Internal) throw;
    const int64_t rows = batch_samples(batch);
    if (rows == 1) throw Error(e.category(), data.sample_origin(first_sample) + ": " + e.what());
    if (takes_single_samples(executor)) {
      for (int64_t r = 0; r < rows; ++r) {
        try {
          executor.run(one_sample(batch, r));
        } catch (const Error& one) {
          if (one.category() == ErrorCategory::Internal) throw;
          throw Error(one.category(), data.sample_origin(first_sample + r) + ": " + one.what());
        }
      }
    }
    throw Error(e.category(), data.sample_origin(first_sample) + " (the first of a batch of " +
                                  std::to_string(rows) + "): " + e.what());
  }
}

}  // namespace qforge
