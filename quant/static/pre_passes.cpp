#include "quant/static/pre_passes.h"

#include "quant/static/cleanup.h"
#include "quant/static/fold_batchnorm.h"

namespace qforge {

PipelineReport run_pre_calibration_passes(Graph& graph) {
  Pipeline pre;
  pre.add(make_fold_batchnorm_pass());
  pre.add(make_cleanup_pass());
  return pre.run(graph);
}

}  // namespace qforge
