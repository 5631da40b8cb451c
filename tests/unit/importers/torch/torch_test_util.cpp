#include "torch_test_util.h"

namespace qforge::torch_test {

namespace {

void append_le(Bytes& b, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
}
void append(Bytes& b, std::string_view s) {
  for (char c : s) b.push_back(static_cast<std::byte>(c));
}

}  // namespace

BuiltZip build_zip(const std::vector<ZipFileSpec>& files, const ZipOptions& options) {
  BuiltZip z;
  Bytes& b = z.bytes;
  for (const auto& f : files) {
    z.local_offsets.push_back(b.size());
    append_le(b, 0x04034b50, 4);
    append_le(b, 20, 2);      // version needed
    append_le(b, 0x0808, 2);  // data descriptor + UTF-8, as torch writes
    append_le(b, f.method, 2);
    append_le(b, 0, 4);  // time, date
    append_le(b, 0, 4);  // crc (not checked by readers of stored torch entries)
    append_le(b, options.zero_local_sizes ? 0 : f.data.size(), 4);
    append_le(b, options.zero_local_sizes ? 0 : f.data.size(), 4);
    append_le(b, f.name.size(), 2);
    size_t pad = 0;
    if (options.align64) {
      const size_t unpadded = b.size() + 2 + f.name.size() + 4;
      pad = (64 - unpadded % 64) % 64;
    }
    append_le(b, options.align64 ? pad + 4 : 0, 2);
    append(b, f.name);
    if (options.align64) {
      append_le(b, 0x4246, 2);  // "FB", torch's padding field
      append_le(b, pad, 2);
      b.insert(b.end(), pad, std::byte{'Z'});
    }
    z.data_offsets.push_back(b.size());
    b.insert(b.end(), f.data.begin(), f.data.end());
  }
  z.cd_offset = b.size();
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& f = files[i];
    z.central_offsets.push_back(b.size());
    const uint64_t sat = 0xffffffffu;
    append_le(b, 0x02014b50, 4);
    append_le(b, 45, 2);  // version made by
    append_le(b, 45, 2);  // version needed
    append_le(b, 0x0808, 2);
    append_le(b, f.method, 2);
    append_le(b, 0, 8);  // time, date, crc
    append_le(b, options.zip64 ? sat : f.data.size(), 4);
    append_le(b, options.zip64 ? sat : f.data.size(), 4);
    append_le(b, f.name.size(), 2);
    append_le(b, options.zip64 ? 28 : 0, 2);  // extra
    append_le(b, 0, 2);                       // comment
    append_le(b, 0, 2);                       // disk
    append_le(b, 0, 6);                       // attributes
    append_le(b, options.zip64 ? sat : z.local_offsets[i], 4);
    append(b, f.name);
    if (options.zip64) {
      append_le(b, 0x0001, 2);
      append_le(b, 24, 2);
      append_le(b, f.data.size(), 8);
      append_le(b, f.data.size(), 8);
      append_le(b, z.local_offsets[i], 8);
    }
  }
  const uint64_t cd_size = b.size() - z.cd_offset;
  if (options.zip64) {
    const size_t record = b.size();
    append_le(b, 0x06064b50, 4);
    append_le(b, 44, 8);  // size of the rest of the record
    append_le(b, 45, 2);
    append_le(b, 45, 2);
    append_le(b, 0, 8);  // disk numbers
    append_le(b, files.size(), 8);
    append_le(b, files.size(), 8);
    append_le(b, cd_size, 8);
    append_le(b, z.cd_offset, 8);
    append_le(b, 0x07064b50, 4);  // locator
    append_le(b, 0, 4);
    append_le(b, record, 8);
    append_le(b, 1, 4);
  }
  z.eocd_offset = b.size();
  append_le(b, 0x06054b50, 4);
  append_le(b, 0, 4);  // disk numbers
  append_le(b, options.zip64 ? 0xffff : files.size(), 2);
  append_le(b, options.zip64 ? 0xffff : files.size(), 2);
  append_le(b, options.zip64 ? 0xffffffffu : cd_size, 4);
  append_le(b, options.zip64 ? 0xffffffffu : z.cd_offset, 4);
  append_le(b, 0, 2);  // comment
  return z;
}

PickleBuilder& PickleBuilder::integer(int64_t v) {
  if (v >= 0 && v < 256) return op(PickleOp::BININT1).byte(static_cast<uint8_t>(v));
  if (v >= 0 && v < 65536) return op(PickleOp::BININT2).le(static_cast<uint64_t>(v), 2);
  if (v >= INT32_MIN && v <= INT32_MAX) return op(PickleOp::BININT).le(static_cast<uint64_t>(v), 4);
  return op(PickleOp::LONG1).byte(8).le(static_cast<uint64_t>(v), 8);
}

PickleBuilder& PickleBuilder::tensor_v2(std::string_view storage, std::string_view key,
                                        int64_t numel, int64_t offset,
                                        const std::vector<int64_t>& size,
                                        const std::vector<int64_t>& stride) {
  global("torch._utils", "_rebuild_tensor_v2").op(PickleOp::MARK);
  op(PickleOp::MARK).str("storage").global("torch", storage).str(key).str("cpu").integer(numel);
  op(PickleOp::TUPLE).op(PickleOp::BINPERSID);
  integer(offset).ints(size).ints(stride).op(PickleOp::NEWFALSE);
  global("collections", "OrderedDict").op(PickleOp::EMPTY_TUPLE).op(PickleOp::REDUCE);
  return op(PickleOp::TUPLE).op(PickleOp::REDUCE);
}

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& size) {
  std::vector<int64_t> stride(size.size(), 1);
  for (size_t i = size.size(); i-- > 1;) stride[i - 1] = stride[i] * size[i];
  return stride;
}

Bytes state_dict_pickle(const std::vector<TensorRow>& rows) {
  PickleBuilder p;
  p.proto().op(PickleOp::EMPTY_DICT).op(PickleOp::MARK);
  for (const auto& r : rows) {
    p.str(r.name).tensor_v2(r.storage, r.key, r.numel, 0, r.size, row_major_strides(r.size));
  }
  return p.op(PickleOp::SETITEMS).stop().bytes;
}

BuiltZip torch_zip(const std::string& prefix, const Bytes& pickle,
                   const std::vector<std::pair<std::string, Bytes>>& storages,
                   const ZipOptions& options) {
  std::vector<ZipFileSpec> files;
  files.push_back({prefix + "/data.pkl", pickle});
  files.push_back({prefix + "/byteorder", to_bytes("little")});
  const std::string data_folder = prefix + "/data/";
  for (const auto& [key, data] : storages) files.push_back({data_folder + key, data});
  files.push_back({prefix + "/version", to_bytes("3\n")});
  return build_zip(files, options);
}

}  // namespace qforge::torch_test
