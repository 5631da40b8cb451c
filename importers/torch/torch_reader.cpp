#include "importers/torch/torch_reader.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "importers/torch/byte_io.h"
#include "importers/torch/torch_archive.h"
#include "importers/torch/torch_pickle.h"
#include "ir/error.h"

namespace qforge {

namespace torch_detail {

namespace {

// torch.save's legacy (pre-1.6) format starts with the pickled magic number
// 0x1950a86a20f9469cfc6c: PROTO 2, LONG1 of 10 bytes.
constexpr unsigned char kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c,
                                          0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
// Deeper nesting than this is no state dict (and could be a self-containing container).
constexpr int kMaxDepth = 64;

void reject_legacy(const MappedFile& file) {
  const auto b = file.bytes();
  if (b.size() >= sizeof(kLegacyMagic) &&
      std::memcmp(b.data(), kLegacyMagic, sizeof(kLegacyMagic)) == 0) {
    const std::string p = file.path().string();
    fail_invalid(quote(p) +
                 " is a legacy (pre-1.6) torch.save file; re-save it with "
                 "torch.save(torch.load(" +
                 quote(p) + "), Y) in a recent PyTorch (zip format)");
  }
}

// The folder holding data.pkl: the saved file's base name, "archive", or anything else.
std::string find_prefix(const ZipReader& zip) {
  std::vector<std::string> prefixes;
  constexpr std::string_view kPickle = "/data.pkl";
  for (const auto& e : zip.entries()) {
    const std::string_view n = e.name;
    if (n.size() > kPickle.size() && n.ends_with(kPickle) &&
        n.find('/') == n.size() - kPickle.size()) {
      prefixes.emplace_back(n.substr(0, n.size() - kPickle.size()));
    }
  }
  const std::string file = quote(zip.path().string());
  if (prefixes.empty()) {
    fail_invalid(file +
                 " is a zip archive but not a torch.save checkpoint: it has no "
                 "'<name>/data.pkl' entry");
  }
  if (prefixes.size() > 1) {
    fail_invalid(file + " holds " + std::to_string(prefixes.size()) + " torch archives ('" +
                 printable(prefixes[0]) + "/data.pkl', '" + printable(prefixes[1]) +
                 "/data.pkl', ...); qforge reads one per file");
  }
  const std::string& prefix = prefixes[0];
  if (zip.find(prefix + "/constants.pkl") != nullptr) {
    fail_unsupported(file +
                     " is a TorchScript archive (torch.jit.save); save the weights with "
                     "torch.save(model.state_dict(), path) or export the model to ONNX");
  }
  if (const auto* order = zip.find(prefix + "/byteorder")) {
    const auto text = as_chars(zip.entry(order->name));
    if (text == "big") {
      fail_unsupported(file +
                       " was saved on a big-endian machine; re-save it on a "
                       "little-endian one");
    }
    if (text != "little") {
      fail_invalid(file + " has a byteorder entry of '" + printable(text) +
                   "', neither 'little' nor 'big'; the file is corrupt");
    }
  }
  return prefix;
}

// Walks the unpickled tree, naming each tensor by its dotted path of keys and indices.
class Flattener {
 public:
  // Containers shared between paths make a DAG whose paths can number 2^depth; a state dict
  // is a tree, with a few tensors (and rarely a dict) reached twice. So the walk may visit each
  // unpickled value about twice, not more.
  Flattener(std::string file, size_t values)
      : file_(std::move(file)), max_visits_(2 * values + 1024) {}

  void visit(const PickleValue& v, const std::string& name, int depth) {
    if (depth > kMaxDepth || ++visits_ > max_visits_) {
      fail_invalid(file_ + ": entry '" + printable(name) + "' is nested more than " +
                   std::to_string(kMaxDepth) +
                   " containers deep or reached through too many shared containers; qforge "
                   "reads dicts of tensors");
    }
    if (const auto* t = v.as<PickleTensor>()) {
      if (!names_.insert(name).second) {
        fail_invalid(file_ + ": two tensors flatten to the name '" + printable(name) +
                     "'; rename one of the keys and re-save");
      }
      tensors.emplace_back(name, t);
    } else if (const auto* d = v.as<PickleDict>()) {
      for (const auto& [key, value] : d->items) {
        if (const auto* s = key->as<std::string>()) {
          visit(*value, join(name, *s), depth + 1);
        } else if (const auto* i = key->as<int64_t>()) {
          visit(*value, join(name, std::to_string(*i)), depth + 1);
        } else {
          ignored.push_back((name.empty() ? "an entry" : "an entry of '" + printable(name) + "'") +
                            " with a " + std::string(pickle_type_name(*key)) + " key");
        }
      }
    } else if (const auto* items = sequence(v)) {
      for (size_t i = 0; i < items->size(); ++i) {
        visit(*(*items)[i], join(name, std::to_string(i)), depth + 1);
      }
    } else {
      ignored.push_back("'" + printable(name) + "' (" + std::string(pickle_type_name(v)) + ")");
    }
  }

  std::vector<std::pair<std::string, const PickleTensor*>> tensors;
  std::vector<std::string> ignored;  // entries that are not tensors, as "'name' (type)"

 private:
  static std::string join(const std::string& prefix, const std::string& key) {
    return prefix.empty() ? key : prefix + "." + key;
  }
  static const std::vector<PickleValue*>* sequence(const PickleValue& v) {
    if (const auto* l = v.as<PickleList>()) return &l->items;
    if (const auto* t = v.as<PickleTuple>()) return &t->items;
    return nullptr;
  }
  std::string file_;
  size_t max_visits_;
  size_t visits_ = 0;
  std::unordered_set<std::string> names_;
};

}  // namespace

std::vector<std::pair<std::string, Tensor>> read_torch_archive(const std::filesystem::path& path) {
  const auto file = MappedFile::open(path);
  reject_legacy(*file);
  const ZipReader zip(file);
  const std::string prefix = find_prefix(zip);
  const std::string pickle_name = prefix + "/data.pkl";
  const TorchPickle pickle = parse_torch_pickle(
      zip.entry(pickle_name), quote(path.string()) + " entry " + quote(pickle_name));
  if (pickle.root->is<PickleTensor>()) {
    fail_unsupported(quote(path.string()) +
                     " holds a single tensor, not a dict of tensors; "
                     "save it as torch.save({'name': tensor}, path)");
  }
  Flattener flat(quote(path.string()), pickle.arena.size());
  flat.visit(*pickle.root, "", 0);
  if (!flat.ignored.empty()) {
    // Said by default: an entry left out of the model should never go unnoticed.
    const size_t n = flat.ignored.size();
    std::string list;
    for (size_t i = 0; i < n && i < 8; ++i) list += (i ? ", " : "") + flat.ignored[i];
    if (n > 8) list += " (and " + std::to_string(n - 8) + " more)";
    spdlog::warn("{}: {} {} not a tensor and not read: {}", quote(path.string()), n,
                 n == 1 ? "entry is" : "entries are", list);
  }
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(flat.tensors.size());
  std::unordered_map<const PickleTensor*, Tensor> made;  // one Tensor per record: tied weights
  for (const auto& [name, record] : flat.tensors) {
    auto it = made.find(record);
    if (it == made.end()) {
      it = made.emplace(record, make_torch_tensor(zip, prefix, *record, name)).first;
    }
    out.emplace_back(name, it->second);
  }
  return out;
}

}  // namespace torch_detail

Graph import_torch(const std::filesystem::path& path) {
  Graph graph;
  graph.name = path.stem().string();
  for (auto& [name, tensor] : torch_detail::read_torch_archive(path)) {
    graph.set_initializer(name, std::move(tensor));
  }
  graph.set_metadata("source_format", "torch");
  graph.set_metadata("source_path", path.string());
  return graph;
}

}  // namespace qforge
