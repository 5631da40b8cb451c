#include "ir/tied_weights.h"

namespace qforge {

namespace {
constexpr const char* kTiedWeightsKey = "tied_weights";
}

std::vector<TiedWeight> tied_weights(const Graph& graph) {
  std::vector<TiedWeight> out;
  const std::string* text = graph.find_metadata(kTiedWeightsKey);
  if (text == nullptr) return out;
  size_t start = 0;
  while (start < text->size()) {
    const size_t end = std::min(text->find(';', start), text->size());
    const std::string item = text->substr(start, end - start);
    const size_t eq = item.find('=');
    if (eq != std::string::npos && eq > 0 && eq + 1 < item.size()) {
      out.push_back({item.substr(0, eq), item.substr(eq + 1)});
    }
    start = end + 1;
  }
  return out;
}

void set_tied_weights(Graph& graph, const std::vector<TiedWeight>& ties) {
  std::string text;
  for (const TiedWeight& t : ties) text += (text.empty() ? "" : ";") + t.alias + "=" + t.source;
  graph.set_metadata(kTiedWeightsKey, text);
}

}  // namespace qforge
