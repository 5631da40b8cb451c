// Dataset on files NumPy itself writes: np.save, np.savez (stored, ZIP64 local headers),
// np.savez_compressed (deflated), and an archive streamed to a pipe (CRC in data descriptors).
// The digest must equal hashlib.sha256 of the same samples. Runs when QFORGE_PYTHON names a
// Python with numpy (scripts/test.sh sets it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "importers/dataset/dataset.h"
#include "tests/unit/importers/dataset/dataset_test_util.h"

using namespace qforge;

namespace {

// Writes the files into `dir` and, per file, the sha256 of the first `n` samples of `x`.
constexpr const char* kScript = R"PY(
import hashlib, io, subprocess, sys, zipfile
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(7)
x = rng.standard_normal((300, 3, 32, 32)).astype(np.float32)  # 3.5 MiB: many inflate rounds
labels = rng.integers(0, 10, 300)
np.save(f"{d}/x.npy", x)
np.savez(f"{d}/stored.npz", x=x, labels=labels)
np.savez_compressed(f"{d}/deflated.npz", x=x, labels=labels)
# Streamed to a pipe, zipfile cannot seek back: sizes and CRCs go to data descriptors.
r = subprocess.run([sys.executable, "-c", """
import sys, zipfile, numpy as np, io
x = np.load(sys.argv[1])
with zipfile.ZipFile(sys.stdout.buffer, "w", zipfile.ZIP_DEFLATED) as z:
    with z.open("x.npy", "w") as f:
        np.lib.format.write_array(f, x)
""", f"{d}/x.npy"], stdout=subprocess.PIPE, check=True)
open(f"{d}/piped.npz", "wb").write(r.stdout)
open(f"{d}/digest_all", "w").write(hashlib.sha256(x.tobytes()).hexdigest())
open(f"{d}/digest_100", "w").write(hashlib.sha256(x[:100].tobytes()).hexdigest())
)PY";

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace

TEST(DatasetNumpy, ReadsWhatNumpyWrites) {
  const char* python = std::getenv("QFORGE_PYTHON");
  if (python == nullptr) {
    GTEST_SKIP() << "QFORGE_PYTHON not set: point it at a Python with numpy "
                    "(e.g. QFORGE_PYTHON=.venv/bin/python) to read NumPy-written files";
  }
  test::ScratchDir dir("ds_numpy");
  {
    std::ofstream f(dir / "make.py");
    f << kScript;
  }
  const std::string cmd =
      std::string(python) + " " + (dir / "make.py").string() + " " + dir.path().string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ValueInfo x;
  x.name = "x";
  x.dtype = DType::F32;
  x.shape = std::vector<Dim>{Dim{std::nullopt, "n"}, Dim{3, ""}, Dim{32, ""}, Dim{32, ""}};
  const std::string all = read_text(dir / "digest_all");
  const std::string first100 = read_text(dir / "digest_100");
  for (const char* file : {"x.npy", "stored.npz", "deflated.npz", "piped.npz"}) {
    Dataset every(dir / file, {x}, 0, 64);
    EXPECT_EQ(every.size(), 300) << file;
    EXPECT_EQ(every.digest(), all) << file;
    Dataset some(dir / file, {x}, 100, 7);
    EXPECT_EQ(some.digest(), first100) << file;
  }
  Dataset labelled(dir / "deflated.npz", {x}, 0, 32);
  EXPECT_EQ(labelled.extra_names(), std::vector<std::string>{"labels"});
  Dataset::Feeds batch, extras;
  ASSERT_TRUE(labelled.next(batch, &extras));
  EXPECT_EQ(extras.at(0).second.shape(), (Shape{32}));
}
