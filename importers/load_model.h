#pragma once
// One entry point for every input qforge reads: decides the format from the file's bytes and
// calls the matching importer.
#include <filesystem>

#include "importers/format.h"
#include "ir/graph.h"

namespace qforge {

struct LoadedModel {
  FileFormat format = FileFormat::Unknown;
  Graph graph;
};

// Throws Error(IO) for a missing file, Error(InvalidInput) naming the file when no importer
// recognises it.
LoadedModel load_model(const std::filesystem::path& path);

}  // namespace qforge
