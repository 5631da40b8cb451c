// account_weights: what a conversion may do with the tensors it read, and what counts as lost.
#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/quantized_linear.h"
#include "ir/weight_inventory.h"

using namespace qforge;

namespace {

Graph state_dict() {
  Graph g;
  g.set_initializer("layer.weight", Tensor(DType::F32, {4, 8}));
  g.set_initializer("layer.bias", Tensor(DType::F32, {4}));
  return g;
}

Graph bn_graph() {
  Graph g;
  for (const char* name : {"W", "scale", "B", "mean", "var", "unused"})
    g.set_initializer(name, Tensor(DType::F32, {4}));
  g.nodes.push_back({"conv", "Conv", "", {"x", "W"}, {"y"}, {}, ""});
  g.nodes.push_back(
      {"bn", "BatchNormalization", "", {"y", "scale", "B", "mean", "var"}, {"z"}, {}, ""});
  return g;
}

TEST(WeightInventory, AQuantizedLinearOfAStateDictKeepsItsTensor) {
  const WeightInventory inv = take_weight_inventory(state_dict());
  Graph q = state_dict();
  store_quantized_linear(q, "layer.weight", Tensor(DType::I8, {4, 8}), Tensor(DType::F32, {4}), 0);
  EXPECT_TRUE(account_weights(inv, q).lost.empty());
  // The same integers with no record (or with their scale gone) say nothing of the values.
  Graph bare = state_dict();
  bare.set_initializer("layer.weight", Tensor(DType::I8, {4, 8}));
  EXPECT_EQ(account_weights(inv, bare).lost, std::vector<std::string>{"layer.weight"});
  Graph no_scale = q;
  no_scale.remove_initializer("layer.weight_scale");
  EXPECT_EQ(account_weights(inv, no_scale).lost, std::vector<std::string>{"layer.weight"});
  // Quantized but reshaped: lost.
  Graph reshaped = state_dict();
  store_quantized_linear(reshaped, "layer.weight", Tensor(DType::I8, {8, 4}),
                         Tensor(DType::F32, {8}), 0);
  EXPECT_EQ(account_weights(inv, reshaped).lost, std::vector<std::string>{"layer.weight"});
}

}  // namespace

TEST(WeightInventory, StateDictKeepsEveryNameAndShape) {
  const Graph in = state_dict();
  const WeightInventory inv = take_weight_inventory(in);
  EXPECT_TRUE(inv.weights_only);
  EXPECT_TRUE(account_weights(inv, in).lost.empty());
  Graph emptied;
  EXPECT_EQ(account_weights(inv, emptied).lost,
            (std::vector<std::string>{"layer.weight", "layer.bias"}));
  Graph renamed = state_dict();
  renamed.remove_initializer("layer.weight");
  renamed.set_initializer("layer.weight_quantized", Tensor(DType::I8, {4, 8}));
  EXPECT_EQ(account_weights(inv, renamed).lost, std::vector<std::string>{"layer.weight"});
  Graph reshaped = state_dict();
  reshaped.set_initializer("layer.bias", Tensor(DType::F32, {2}));
  EXPECT_EQ(account_weights(inv, reshaped).lost, std::vector<std::string>{"layer.bias"});
}

TEST(WeightInventory, GraphAccountsDerivedNamesAndFoldedNodes) {
  const Graph in = bn_graph();
  const WeightInventory inv = take_weight_inventory(in);
  Graph folded;  // BatchNormalization folded into the Conv, whose weight was then quantized
  folded.set_initializer("W_folded_quantized", Tensor(DType::I8, {4}));
  folded.set_initializer("W_folded_quantized_scale", Tensor(DType::F32, {4}));
  folded.nodes.push_back({"conv", "Conv", "", {"x", "W_dq"}, {"z"}, {}, ""});
  const WeightAccount a = account_weights(inv, folded);
  EXPECT_TRUE(a.lost.empty());
  EXPECT_EQ(a.unread, std::vector<std::string>{"unused"});
  Graph kept_bn = folded;  // the BatchNormalization is still there without its statistics
  kept_bn.nodes.push_back({"bn", "BatchNormalization", "", {"z", "s2"}, {"w"}, {}, ""});
  EXPECT_EQ(account_weights(inv, kept_bn).lost,
            (std::vector<std::string>{"scale", "B", "mean", "var"}));
  Graph lost = folded;  // the Conv kept, its weight gone in every form
  lost.remove_initializer("W_folded_quantized");
  lost.remove_initializer("W_folded_quantized_scale");
  EXPECT_EQ(account_weights(inv, lost).lost, std::vector<std::string>{"W"});
}

TEST(WeightInventory, CheckNothingLostStopsTheConversionNamingTheTensors) {
  const WeightInventory inv = take_weight_inventory(state_dict());
  EXPECT_TRUE(check_nothing_lost(inv, state_dict(), "convert").empty());
  Graph half = state_dict();
  half.remove_initializer("layer.bias");
  try {
    check_nothing_lost(inv, half, "the conversion of 'in.pt' to 'out.safetensors'");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Internal);
    const std::string m = e.what();
    EXPECT_NE(m.find("'in.pt' to 'out.safetensors' would leave 1 of the 2 tensors it read out "
                     "of its output (layer.bias)"),
              std::string::npos)
        << m;
  }
  const WeightInventory graph_inv = take_weight_inventory(bn_graph());
  Graph without_unused = bn_graph();
  without_unused.remove_initializer("unused");
  EXPECT_EQ(check_nothing_lost(graph_inv, without_unused, "convert"),
            std::vector<std::string>{"unused"});
}
