// Executor behaviour: op validation, feed checks, observer, release of intermediates,
// determinism across thread counts.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

Node node(std::string name, std::string op, std::vector<std::string> in,
          std::vector<std::string> out, std::vector<Attribute> attrs = {}) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attributes = std::move(attrs);
  return n;
}

// x -> Relu -> a -> Neg -> b -> Relu -> c -> Neg -> d -> Add(d, x) -> y
Graph chain_graph() {
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x",
                      .dtype = DType::F32,
                      .shape = std::vector<Dim>{{.param = "batch"}, {.value = 3}}});
  g.nodes.push_back(node("r1", "Relu", {"x"}, {"a"}));
  g.nodes.push_back(node("n1", "Neg", {"a"}, {"b"}));
  g.nodes.push_back(node("r2", "Relu", {"b"}, {"c"}));
  g.nodes.push_back(node("n2", "Neg", {"c"}, {"d"}));
  g.nodes.push_back(node("add", "Add", {"d", "x"}, {"y"}));
  g.outputs.push_back({.name = "y"});
  return g;
}

}  // namespace

TEST(Executor, RunsAChain) {
  Executor ex(chain_graph());
  const auto out = ex.run({{"x", f32({2, 3}, {1, -2, 3, -4, 5, -6})}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(values<float>(out[0]),
            (std::vector<float>{1, -2, 3, -4, 5, -6}));  // -relu(-relu x) + x
}

TEST(Executor, RejectsUnsupportedOpUpFront) {
  Graph g = chain_graph();
  g.nodes[2].op_type = "Foo";
  const auto e = catch_error([&] { Executor ex(g); });
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
  EXPECT_EQ(e.message, "op 'Foo' (node 'r2') is not supported by the qforge runtime");
}

TEST(Executor, RejectsOpsOfOtherDomains) {
  Graph g = chain_graph();
  g.nodes[0].domain = "com.microsoft";
  g.set_opset("com.microsoft", 1);
  const auto e = catch_error([&] { Executor ex(g); });
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
  EXPECT_NE(e.message.find("op 'com.microsoft.Relu' (node 'r1') is not supported"),
            std::string::npos)
      << e.message;
}

TEST(Executor, RejectsCudaDevice) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (test_executor_cuda.cpp runs it)";
  const auto e = catch_error([&] { Executor ex(chain_graph(), {.device = Device::Cuda}); });
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
}

TEST(Executor, FeedErrorsNameTheFeed) {
  Executor ex(chain_graph());
  const Tensor good = f32({1, 3}, {1, 2, 3});
  struct Case {
    std::vector<std::pair<std::string, Tensor>> feeds;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"z", good}}, "feed 'z' is not an input of the graph (inputs: x)"},
      {{{"x", good}, {"x", good}}, "feed 'x' is given twice"},
      {{}, "graph input 'x' is not fed"},
      {{{"x", i64({1, 3}, {1, 2, 3})}}, "feed 'x' has dtype i64 but graph input 'x' is f32"},
      {{{"x", f32({3}, {1, 2, 3})}},
       "feed 'x' has shape [3] (rank 1) but graph input 'x' has rank 2 [batch, 3]"},
      {{{"x", f32({3, 1}, {1, 2, 3})}},
       "feed 'x' has shape [3, 1] but dimension 1 of graph input 'x' [batch, 3] is 3"},
      {{{"x", Tensor()}}, "feed 'x' holds no tensor"},
  };
  for (const auto& c : cases) {
    const auto e = catch_error([&] { ex.run(c.feeds); });
    EXPECT_EQ(e.category, ErrorCategory::InvalidInput);
    EXPECT_EQ(e.message, c.message);
  }
  // Symbolic dims take any size.
  EXPECT_NO_THROW(ex.run({{"x", f32({4, 3}, std::vector<float>(12, 1.0f))}}));
}

TEST(Executor, InitializerInputsAreOptionalFeeds) {
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.inputs.push_back({.name = "w", .dtype = DType::F32});
  g.set_initializer("w", f32({2}, {10, 20}));
  g.nodes.push_back(node("add", "Add", {"x", "w"}, {"y"}));
  g.outputs.push_back({.name = "y"});
  Executor ex(g);
  EXPECT_EQ(values<float>(ex.run({{"x", f32({2}, {1, 2})}})[0]), (std::vector<float>{11, 22}));
  EXPECT_EQ(values<float>(ex.run({{"x", f32({2}, {1, 2})}, {"w", f32({2}, {1, 1})}})[0]),
            (std::vector<float>{2, 3}));
}

TEST(Executor, ObserverSeesInputsAndEveryProducedValueInOrder) {
  Executor ex(chain_graph());
  std::vector<std::string> seen;
  std::map<std::string, std::vector<float>> vals;
  ex.set_observer([&](const std::string& name, const Tensor& t) {
    seen.push_back(name);
    vals[name] = t.to_f32();
  });
  ex.run({{"x", f32({1, 3}, {1, -2, 3})}});
  EXPECT_EQ(seen, (std::vector<std::string>{"x", "a", "b", "c", "d", "y"}));
  EXPECT_EQ(vals["a"], (std::vector<float>{1, 0, 3}));
  EXPECT_EQ(vals["b"], (std::vector<float>{-1, 0, -3}));
  EXPECT_EQ(vals["c"], (std::vector<float>{0, 0, 0}));
}

TEST(Executor, ReleasesIntermediatesAfterTheirLastUse) {
  Executor ex(chain_graph());
  // Watch each produced storage; when a value is observed, count how many earlier
  // intermediates are still alive. In a chain only the current node's input survives.
  std::vector<std::pair<std::string, std::weak_ptr<const Storage>>> watched;
  std::vector<size_t> live_at;
  ex.set_observer([&](const std::string& name, const Tensor& t) {
    if (name == "x" || name == "y") return;
    size_t live = 0;
    for (const auto& [n, w] : watched) live += w.expired() ? 0 : 1;
    live_at.push_back(live);
    watched.emplace_back(name, t.storage());
  });
  const auto out = ex.run({{"x", f32({1, 3}, {1, -2, 3})}});
  // When b is observed its producer's input a is still held (released right after), so
  // exactly one older intermediate is alive at each step; without release it would grow.
  EXPECT_EQ(live_at, (std::vector<size_t>{0, 1, 1, 1}));
  for (const auto& [n, w] : watched) EXPECT_TRUE(w.expired()) << n << " outlived the run";
  EXPECT_EQ(out[0].numel(), 3u);
}

TEST(Executor, KeepsValuesUntilTheirLastConsumer) {
  // x -> Relu -> a; a feeds both Neg (b) and the final Add, so a must live until the Add.
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.nodes.push_back(node("r", "Relu", {"x"}, {"a"}));
  g.nodes.push_back(node("n", "Neg", {"a"}, {"b"}));
  g.nodes.push_back(node("e", "Exp", {"b"}, {"c"}));
  g.nodes.push_back(node("add", "Add", {"a", "c"}, {"y"}));
  g.outputs.push_back({.name = "y"});
  Executor ex(g);
  std::map<std::string, std::weak_ptr<const Storage>> w;
  std::map<std::string, std::vector<std::string>> alive_when;
  ex.set_observer([&](const std::string& name, const Tensor& t) {
    for (const auto& [n, p] : w) {
      if (!p.expired()) alive_when[name].push_back(n);
    }
    w[name] = t.storage();
  });
  const auto out = ex.run({{"x", f32({2}, {1, -1})}});
  EXPECT_EQ(alive_when["b"], (std::vector<std::string>{"a", "x"}));
  EXPECT_EQ(alive_when["c"], (std::vector<std::string>{"a", "b", "x"}));  // b goes after Exp
  EXPECT_EQ(alive_when["y"], (std::vector<std::string>{"a", "c", "x"}));
  EXPECT_TRUE(w["a"].expired());
  EXPECT_TRUE(w["c"].expired());
  EXPECT_NEAR(out[0].data<float>()[0], 1.0f + std::exp(-1.0f), 1e-6f);
}

TEST(Executor, UnconsumedOutputsAreReleased) {
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.nodes.push_back(node("d", "Dropout", {"x"}, {"a", "mask"}));
  g.nodes.push_back(node("r", "Relu", {"a"}, {"y"}));
  g.outputs.push_back({.name = "y"});
  Executor ex(g);
  std::weak_ptr<const Storage> mask;
  bool mask_alive_at_y = true;
  ex.set_observer([&](const std::string& name, const Tensor& t) {
    if (name == "mask") mask = t.storage();
    if (name == "y") mask_alive_at_y = !mask.expired();
  });
  ex.run({{"x", f32({2}, {1, -1})}});
  EXPECT_FALSE(mask_alive_at_y);
}

TEST(Executor, OutputsAreBitIdenticalAcrossThreadCounts) {
  // A conv net plus attention-like matmuls, sized to span many gemm tiles and chunks.
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("w1", random_f32({32, 8, 3, 3}, 1));
  g.set_initializer("b1", random_f32({32}, 2));
  g.set_initializer("w2", random_f32({300, 200}, 3));
  g.set_initializer("gamma", random_f32({200}, 4));
  g.set_initializer("beta", random_f32({200}, 5));
  g.nodes.push_back(
      node("conv", "Conv", {"x", "w1", "b1"}, {"c"}, {attr_ints("pads", {1, 1, 1, 1})}));
  g.nodes.push_back(node("relu", "Relu", {"c"}, {"r"}));
  g.nodes.push_back(node("pool", "AveragePool", {"r"}, {"p"},
                         {attr_ints("kernel_shape", {2, 2}), attr_ints("strides", {2, 2})}));
  g.set_initializer("shape", i64({2}, {-1, 300}));
  g.nodes.push_back(node("flat", "Reshape", {"p", "shape"}, {"f"}));
  g.nodes.push_back(node("mm", "MatMul", {"f", "w2"}, {"m"}));
  g.nodes.push_back(node("ln", "LayerNormalization", {"m", "gamma", "beta"}, {"l"}));
  g.nodes.push_back(node("sm", "Softmax", {"l"}, {"s"}));
  g.nodes.push_back(node("red", "ReduceSum", {"s"}, {"y"}, {attr_int("keepdims", 0)}));
  g.outputs.push_back({.name = "s"});
  g.outputs.push_back({.name = "y"});
  const Tensor x = random_f32({6, 8, 50, 40}, 6);
  std::vector<std::vector<Tensor>> results;
  for (int threads : {1, 2, 3}) {
    Executor ex(g, {.threads = threads});
    results.push_back(ex.run({{"x", x}}));
  }
  for (size_t r = 1; r < results.size(); ++r) {
    for (size_t o = 0; o < results[0].size(); ++o) {
      EXPECT_TRUE(results[r][o].equals(results[0][o])) << "output " << o << ", run " << r;
    }
  }
  EXPECT_EQ(results[0][0].shape(), (Shape{320, 200}));  // 6*32*25*20 / 300 rows
}
