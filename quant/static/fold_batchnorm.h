#pragma once
// Folds an inference BatchNormalization into the Conv or ConvTranspose before it:
//   y = gamma * (conv(x) - mean) / sqrt(var + eps) + beta
//     = conv'(x)  with  W'[c] = W[c] * k[c],  b'[c] = (b[c] - mean[c]) * k[c] + beta[c],
//   k = gamma / sqrt(var + eps), c the output channel (Conv axis 0 of W, ConvTranspose axis 1
//   within each group). The folded weight and bias are new initializers (a bias is created when
//   the conv had none); the conv takes over the BatchNormalization's output name.
//
// Folded only when the conv's output has no other reader (nor is a graph output), every
// parameter is a constant initializer that is not also a graph input, and the
// BatchNormalization is in inference mode (no training outputs, training_mode 0). Others are
// left alone and counted as skipped with the reason.
#include <memory>

#include "ir/pass.h"

namespace qforge {

std::unique_ptr<Pass> make_fold_batchnorm_pass();

}  // namespace qforge
