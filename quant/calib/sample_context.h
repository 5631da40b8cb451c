#pragma once
// Runs one batch of a data set through a model; when the model rejects the data (a token id
// past the vocabulary, a mask shorter than the ids), the error names the sample that caused it,
// so that the user can find it in the data set. Calibration and compare run their batches here.
#include <cstdint>
#include <vector>

#include "ir/batch_source.h"
#include "ir/tensor.h"
#include "runtime/executor.h"

namespace qforge {

// executor.run(batch). On an Error other than Internal, reruns the batch's samples one at a
// time (where the model's batch dimension allows one) to find the first the model rejects, and
// throws that error, same category, prefixed with data.sample_origin() of that sample
// (`first_sample` is the batch's first sample in the pass). Where no single sample fails alone,
// or the model takes fixed batches, the prefix names the batch's first sample and its size.
std::vector<Tensor> run_batch(const Executor& executor, const BatchSource::Feeds& batch,
                              const BatchSource& data, int64_t first_sample);

// Samples in a batch: the leading dimension of its first feed.
int64_t batch_samples(const BatchSource::Feeds& batch);

}  // namespace qforge
