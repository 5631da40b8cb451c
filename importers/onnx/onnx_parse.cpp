#include "importers/onnx/onnx_parse.h"

#include <google/protobuf/io/coded_stream.h>

#include <climits>
#include <cstdint>

#include "ir/error.h"

namespace qforge {

namespace {

// Field numbers from onnx.proto.
constexpr uint64_t kModelGraph = 7;
constexpr uint64_t kGraphInitializer = 5;
constexpr uint64_t kTensorRawData = 9;
constexpr uint64_t kMaxFieldNumber = (uint64_t{1} << 29) - 1;
constexpr int kLengthDelimited = 2;

struct WireField {
  uint64_t number;
  int wire_type;
  std::span<const std::byte> whole;    // tag, length and payload
  std::span<const std::byte> payload;  // length-delimited fields only
};

bool read_varint(std::span<const std::byte> b, size_t& pos, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && pos < b.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(b[pos++]);
    value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// The fields of one message, in order; nullopt on malformed bytes or groups (wire types 3/4).
std::optional<std::vector<WireField>> split_fields(std::span<const std::byte> msg) {
  std::vector<WireField> fields;
  size_t pos = 0;
  while (pos < msg.size()) {
    const size_t start = pos;
    uint64_t tag = 0;
    if (!read_varint(msg, pos, tag)) return std::nullopt;
    const uint64_t number = tag >> 3;
    const int wire = static_cast<int>(tag & 7);
    if (number == 0 || number > kMaxFieldNumber) return std::nullopt;
    std::span<const std::byte> payload;
    uint64_t skip = 0;
    switch (wire) {
      case 0: {
        uint64_t ignored = 0;
        if (!read_varint(msg, pos, ignored)) return std::nullopt;
        break;
      }
      case 1: skip = 8; break;
      case 5: skip = 4; break;
      case kLengthDelimited:
        if (!read_varint(msg, pos, skip)) return std::nullopt;
        if (skip > msg.size() - pos) return std::nullopt;
        payload = msg.subspan(pos, static_cast<size_t>(skip));
        break;
      default: return std::nullopt;
    }
    if (skip > msg.size() - pos) return std::nullopt;
    pos += static_cast<size_t>(skip);
    fields.push_back({number, wire, msg.subspan(start, pos - start), payload});
  }
  return fields;
}

void append(std::string& out, std::span<const std::byte> bytes) {
  out.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::optional<SplitInitializer> split_tensor(std::span<const std::byte> tensor) {
  const auto fields = split_fields(tensor);
  if (!fields) return std::nullopt;
  SplitInitializer out;
  for (const auto& f : *fields) {
    if (f.number != kTensorRawData) {
      append(out.proto, f.whole);
      continue;
    }
    // A second raw_data would replace the first: leave that to protobuf.
    if (f.wire_type != kLengthDelimited || out.raw_data) return std::nullopt;
    out.raw_data = f.payload;
  }
  return out;
}

}  // namespace

std::optional<SplitModel> split_onnx_model(std::span<const std::byte> bytes) {
  const auto top = split_fields(bytes);
  if (!top) return std::nullopt;
  SplitModel out;
  std::optional<std::span<const std::byte>> graph;
  for (const auto& f : *top) {
    if (f.number != kModelGraph) {
      append(out.model, f.whole);
      continue;
    }
    // A second graph field would be merged into the first: leave that to protobuf.
    if (f.wire_type != kLengthDelimited || graph) return std::nullopt;
    graph = f.payload;
  }
  if (!graph) return std::nullopt;
  const auto graph_fields = split_fields(*graph);
  if (!graph_fields) return std::nullopt;
  for (const auto& f : *graph_fields) {
    if (f.number != kGraphInitializer) {
      append(out.graph, f.whole);
      continue;
    }
    if (f.wire_type != kLengthDelimited) return std::nullopt;
    auto init = split_tensor(f.payload);
    if (!init) return std::nullopt;
    out.initializers.push_back(std::move(*init));
  }
  return out;
}

namespace {

// Parses with protobuf's 64 MiB default limit raised to its 2 GiB maximum. Returns the byte
// position where parsing stopped, or nullopt on success.
std::optional<int> parse_message(std::span<const std::byte> bytes,
                                 google::protobuf::MessageLite& message) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  in.SetTotalBytesLimit(INT_MAX);
  if (message.ParseFromCodedStream(&in) && in.ConsumedEntireMessage()) return std::nullopt;
  return in.CurrentPosition();
}

std::span<const std::byte> as_span(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// The split path; nullopt hands over to the whole-model parse.
std::optional<ParsedOnnxModel> parse_split(std::span<const std::byte> bytes) {
  auto split = split_onnx_model(bytes);
  if (!split) return std::nullopt;
  ParsedOnnxModel out;
  if (parse_message(as_span(split->model), out.model) ||
      parse_message(as_span(split->graph), *out.model.mutable_graph())) {
    return std::nullopt;
  }
  out.initializers.reserve(split->initializers.size());
  for (const auto& init : split->initializers) {
    ParsedInitializer parsed;
    if (parse_message(as_span(init.proto), parsed.proto)) return std::nullopt;
    parsed.raw_data = init.raw_data;
    out.initializers.push_back(std::move(parsed));
  }
  return out;
}

}  // namespace

ParsedOnnxModel parse_onnx_model(std::span<const std::byte> bytes, const std::string& source) {
  const std::string hint = "; check that the file is complete and is an ONNX model (re-export it)";
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    fail_invalid("'" + source + "' is not a valid ONNX model: " + std::to_string(bytes.size()) +
                 " bytes exceed protobuf's 2 GiB limit (large models keep weights in external data)");
  }
  auto parsed = parse_split(bytes);
  if (!parsed) {
    parsed.emplace();
    if (const auto stopped = parse_message(bytes, parsed->model)) {
      fail_invalid("'" + source + "' is not a valid ONNX model (protobuf parse failed near byte " +
                   std::to_string(*stopped) + " of " + std::to_string(bytes.size()) + ")" + hint);
    }
  }
  const auto& model = parsed->model;
  if (!model.has_ir_version() || !model.has_graph()) {
    fail_invalid("'" + source + "' is not a valid ONNX model (protobuf parsed but " +
                 (model.has_ir_version() ? "there is no graph" : "there is no ir_version") + ")" +
                 hint);
  }
  return std::move(*parsed);
}

}  // namespace qforge
