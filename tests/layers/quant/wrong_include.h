#pragma once
// A quant/ header that reads a file format: the layer check must refuse it.
#include "importers/dataset/dataset.h"
