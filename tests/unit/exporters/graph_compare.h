#pragma once
// Field-by-field comparison of two IR graphs for round-trip tests; a mismatch names the path
// to the differing field ("graph 'g' / node 3 'if' / attribute 'then_branch' / ...").
#include <gtest/gtest.h>

#include <string>

#include "ir/graph.h"

namespace qforge::testing {

inline void expect_tensor_equal(const Tensor& a, const Tensor& b, const std::string& where) {
  EXPECT_EQ(a.empty(), b.empty()) << where;
  EXPECT_EQ(dtype_name(a.dtype()), dtype_name(b.dtype())) << where;
  EXPECT_EQ(a.shape(), b.shape()) << where;
  EXPECT_TRUE(a.equals(b)) << where << ": bytes differ";
}

inline void expect_value_infos_equal(const std::vector<ValueInfo>& a,
                                     const std::vector<ValueInfo>& b, const std::string& where) {
  ASSERT_EQ(a.size(), b.size()) << where;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string at = where + " " + std::to_string(i) + " '" + a[i].name + "'";
    EXPECT_EQ(a[i].name, b[i].name) << at;
    EXPECT_EQ(a[i].dtype, b[i].dtype) << at;
    EXPECT_EQ(a[i].shape.has_value(), b[i].shape.has_value()) << at;
    if (a[i].shape && b[i].shape) {
      ASSERT_EQ(a[i].shape->size(), b[i].shape->size()) << at;
      for (size_t d = 0; d < a[i].shape->size(); ++d) {
        EXPECT_EQ((*a[i].shape)[d].value, (*b[i].shape)[d].value) << at << " dim " << d;
        EXPECT_EQ((*a[i].shape)[d].param, (*b[i].shape)[d].param) << at << " dim " << d;
      }
    }
    EXPECT_EQ(a[i].doc_string, b[i].doc_string) << at;
  }
}

inline void expect_graph_equal(const Graph& a, const Graph& b, const std::string& where = "graph");

inline void expect_attribute_equal(const Attribute& a, const Attribute& b,
                                   const std::string& where) {
  EXPECT_EQ(a.name, b.name) << where;
  ASSERT_EQ(static_cast<int>(a.type), static_cast<int>(b.type)) << where;
  EXPECT_EQ(a.doc_string, b.doc_string) << where;
  switch (a.type) {
    case AttrType::Float: EXPECT_EQ(a.f, b.f) << where; break;
    case AttrType::Int: EXPECT_EQ(a.i, b.i) << where; break;
    case AttrType::String: EXPECT_EQ(a.s, b.s) << where; break;
    case AttrType::Tensor: expect_tensor_equal(a.t, b.t, where); break;
    case AttrType::Graph:
      ASSERT_TRUE(a.g && b.g) << where;
      expect_graph_equal(*a.g, *b.g, where + " / graph");
      break;
    case AttrType::Floats: EXPECT_EQ(a.floats, b.floats) << where; break;
    case AttrType::Ints: EXPECT_EQ(a.ints, b.ints) << where; break;
    case AttrType::Strings: EXPECT_EQ(a.strings, b.strings) << where; break;
    case AttrType::Tensors:
      ASSERT_EQ(a.tensors.size(), b.tensors.size()) << where;
      for (size_t i = 0; i < a.tensors.size(); ++i) {
        expect_tensor_equal(a.tensors[i], b.tensors[i], where + " / tensor " + std::to_string(i));
      }
      break;
    case AttrType::Graphs:
      ASSERT_EQ(a.graphs.size(), b.graphs.size()) << where;
      for (size_t i = 0; i < a.graphs.size(); ++i) {
        ASSERT_TRUE(a.graphs[i] && b.graphs[i]) << where;
        expect_graph_equal(*a.graphs[i], *b.graphs[i], where + " / graph " + std::to_string(i));
      }
      break;
  }
}

inline void expect_node_equal(const Node& a, const Node& b, const std::string& where) {
  EXPECT_EQ(a.name, b.name) << where;
  EXPECT_EQ(a.op_type, b.op_type) << where;
  EXPECT_EQ(a.domain, b.domain) << where;
  EXPECT_EQ(a.inputs, b.inputs) << where;
  EXPECT_EQ(a.outputs, b.outputs) << where;
  EXPECT_EQ(a.doc_string, b.doc_string) << where;
  ASSERT_EQ(a.attributes.size(), b.attributes.size()) << where;
  for (size_t i = 0; i < a.attributes.size(); ++i) {
    expect_attribute_equal(a.attributes[i], b.attributes[i],
                           where + " / attribute '" + a.attributes[i].name + "'");
  }
}

inline void expect_graph_equal(const Graph& a, const Graph& b, const std::string& where) {
  const std::string at = where + " '" + a.name + "'";
  EXPECT_EQ(a.name, b.name) << at;
  EXPECT_EQ(a.doc_string, b.doc_string) << at;
  ASSERT_EQ(a.nodes.size(), b.nodes.size()) << at;
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    expect_node_equal(a.nodes[i], b.nodes[i],
                      at + " / node " + std::to_string(i) + " '" + a.nodes[i].name + "'");
  }
  expect_value_infos_equal(a.inputs, b.inputs, at + " / input");
  expect_value_infos_equal(a.outputs, b.outputs, at + " / output");
  expect_value_infos_equal(a.value_info, b.value_info, at + " / value_info");
  ASSERT_EQ(a.initializers().size(), b.initializers().size()) << at;
  for (size_t i = 0; i < a.initializers().size(); ++i) {
    const auto& [name_a, ta] = a.initializers()[i];
    const auto& [name_b, tb] = b.initializers()[i];
    EXPECT_EQ(name_a, name_b) << at << " / initializer " << i;
    expect_tensor_equal(ta, tb, at + " / initializer '" + name_a + "'");
  }
  EXPECT_EQ(a.opset_imports, b.opset_imports) << at;
  EXPECT_EQ(a.metadata, b.metadata) << at;
  EXPECT_EQ(a.model.ir_version, b.model.ir_version) << at;
  EXPECT_EQ(a.model.producer_name, b.model.producer_name) << at;
  EXPECT_EQ(a.model.producer_version, b.model.producer_version) << at;
  EXPECT_EQ(a.model.domain, b.model.domain) << at;
  EXPECT_EQ(a.model.model_version, b.model.model_version) << at;
  EXPECT_EQ(a.model.doc_string, b.model.doc_string) << at;
}

}  // namespace qforge::testing
