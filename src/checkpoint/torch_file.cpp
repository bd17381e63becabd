// [Note: torch.save subset]
// torch.save(obj, path) writes a zip archive "<name>/data.pkl" + "<name>/data/<key>" (one record
// per storage) + "<name>/byteorder". For a state dict, data.pkl (pickle protocol 2 by default)
// builds an OrderedDict with REDUCE, fills it with SETITEMS of
//   key -> torch._utils._rebuild_tensor_v2(persistent storage, offset, size, stride,
//                                          requires_grad, OrderedDict() of hooks[, metadata])
// where the storage is the persistent id ('storage', torch.<Type>Storage, key, location, numel),
// and ends with BUILD {'_metadata': ...} (the module versions, not weights). export_full writes a
// plain dict of the same tensors. The small machine below runs these opcodes (and the protocol-4
// framing ones) and nothing else: any other global, opcode or shape of data is an fsdp::Error that
// names it, never an assert.
#include "torch_file.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <caffe2/serialize/versions.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <variant>

#include "io.h"
#include "zip_reader.h"

namespace fsdp::checkpoint {

namespace {

struct Value;
using ValuePtr = std::shared_ptr<Value>;
struct Global {
  std::string module, name;
};
struct Storage {
  std::string key;
  c10::ScalarType dtype;
};
struct Mark {};
using List = std::vector<ValuePtr>;                    // tuples and lists
using Dict = std::vector<std::pair<ValuePtr, ValuePtr>>;  // in insertion order
struct Value {
  std::variant<std::monostate, bool, int64_t, double, std::string, List, Dict, Global, Storage,
               at::Tensor, Mark>
      v;
  bool is_tuple = false;
};

ValuePtr make(decltype(Value::v) v, bool tuple = false) {
  auto p = std::make_shared<Value>();
  p->v = std::move(v);
  p->is_tuple = tuple;
  return p;
}

const char* kind_of(const Value& x) {
  static const char* kNames[] = {"None",   "bool",   "int",    "float",   "str",  "tuple/list",
                                 "dict",   "global", "storage", "tensor", "mark"};
  return kNames[x.v.index()];
}

c10::ScalarType storage_dtype(const std::string& name, const ErrorContext& who) {
  static const std::vector<std::pair<const char*, c10::ScalarType>> kTypes = {
      {"FloatStorage", at::kFloat}, {"DoubleStorage", at::kDouble}, {"HalfStorage", at::kHalf},
      {"BFloat16Storage", at::kBFloat16}, {"LongStorage", at::kLong}, {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort}, {"CharStorage", at::kChar}, {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool}};
  for (const auto& [n, t] : kTypes) {
    if (name == n) return t;
  }
  throw Error(ErrorKind::kUnsupported, who, "storage type torch." + name + " is not supported");
}

// Runs the pickle in `pkl`; tensors' bytes come from the records `dir`data/<key> of `zip`.
class MiniUnpickler {
 public:
  MiniUnpickler(const std::string& pkl, const ZipArchive& zip, std::string dir, ErrorContext who)
      : p_(pkl), zip_(zip), dir_(std::move(dir)), who_(std::move(who)) {}

  ValuePtr run() {
    while (true) {
      const uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;                       // PROTO
        case 0x95: take(8); break;                      // FRAME
        case 'c': {                                     // GLOBAL
          std::string m = line(), n = line();
          push(make(Global{m, n}));
          break;
        }
        case 0x93: {                                    // STACK_GLOBAL
          ValuePtr n = pop(), m = pop();
          push(make(Global{str(*m), str(*n)}));
          break;
        }
        case 'q': memo_put(byte()); break;              // BINPUT
        case 'r': memo_put(u32()); break;               // LONG_BINPUT
        case 0x94: memo_put(memo_.size()); break;       // MEMOIZE
        case 'h': push(memo_get(byte())); break;        // BINGET
        case 'j': push(memo_get(u32())); break;         // LONG_BINGET
        case '(': push(make(Mark{})); break;            // MARK
        case ')': push(make(List{}, true)); break;      // EMPTY_TUPLE
        case ']': push(make(List{})); break;            // EMPTY_LIST
        case '}': push(make(Dict{})); break;            // EMPTY_DICT
        case 't': push(make(since_mark(), true)); break;  // TUPLE
        case 0x85: case 0x86: case 0x87: {              // TUPLE1..3
          List items(op - 0x84);
          for (size_t i = items.size(); i-- > 0;) items[i] = pop();
          push(make(std::move(items), true));
          break;
        }
        case 'a': { ValuePtr x = pop(); list_of(*top()).push_back(x); break; }  // APPEND
        case 'e': { List xs = since_mark(); for (auto& x : xs) list_of(*top()).push_back(x); break; }
        case 's': { ValuePtr v = pop(), k = pop(); dict_of(*top()).emplace_back(k, v); break; }
        case 'u': {                                     // SETITEMS
          List xs = since_mark();
          if (xs.size() % 2) fail("SETITEMS with an odd number of items");
          for (size_t i = 0; i < xs.size(); i += 2) dict_of(*top()).emplace_back(xs[i], xs[i + 1]);
          break;
        }
        case 'X': push(make(take(u32()))); break;       // BINUNICODE
        case 0x8c: push(make(take(byte()))); break;     // SHORT_BINUNICODE
        case 'K': push(make(int64_t(byte()))); break;   // BININT1
        case 'M': { int64_t lo = byte(); push(make(lo | (int64_t(byte()) << 8))); break; }
        case 'J': push(make(int64_t(static_cast<int32_t>(u32())))); break;
        case 0x8a: push(make(long1())); break;          // LONG1
        case 'G': push(make(binfloat())); break;        // BINFLOAT
        case 'N': push(make(std::monostate{})); break;
        case 0x88: push(make(true)); break;
        case 0x89: push(make(false)); break;
        case '0': pop(); break;                         // POP
        case 'Q': push(persistent(*pop())); break;      // BINPERSID
        case 'R': { ValuePtr args = pop(), fn = pop(); push(reduce(*fn, *args)); break; }
        case 'b': {                                     // BUILD: a dict's attributes (_metadata)
          pop();
          if (!std::holds_alternative<Dict>(top()->v)) fail(str_cat("BUILD of a ", kind_of(*top())));
          break;
        }
        case '.': return pop();                         // STOP
        default: fail(str_cat("pickle opcode ", int(op), " is not one torch.save writes for a "
                              "state dict"));
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorKind::kCorruptData, who_, "not a state dict of tensors: " + why);
  }
  uint8_t byte() {
    if (pos_ >= p_.size()) fail("the pickle ends early");
    return static_cast<uint8_t>(p_[pos_++]);
  }
  std::string take(size_t n) {
    if (n > p_.size() - pos_) fail("the pickle ends early");
    pos_ += n;
    return p_.substr(pos_ - n, n);
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(byte()) << (8 * i);
    return v;
  }
  int64_t long1() {
    const size_t n = byte();
    if (n > 8) fail("an integer wider than 64 bits");
    const std::string b = take(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t(static_cast<uint8_t>(b[i])) << (8 * i);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) v |= ~uint64_t(0) << (8 * n);
    return static_cast<int64_t>(v);
  }
  double binfloat() {
    const std::string b = take(8);
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(b[i]);
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  std::string line() {
    const size_t end = p_.find('\n', pos_);
    if (end == std::string::npos) fail("the pickle ends early");
    std::string s = p_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  ValuePtr pop() {
    if (stack_.empty()) fail("the pickle pops an empty stack");
    ValuePtr v = stack_.back();
    stack_.pop_back();
    return v;
  }
  ValuePtr top() {
    if (stack_.empty()) fail("the pickle reads an empty stack");
    return stack_.back();
  }
  List since_mark() {
    List out;
    while (!std::holds_alternative<Mark>(top()->v)) out.insert(out.begin(), pop());
    pop();
    return out;
  }
  void memo_put(size_t i) { memo_[i] = top(); }
  ValuePtr memo_get(size_t i) {
    auto it = memo_.find(i);
    if (it == memo_.end()) fail("the pickle reads an unset memo entry");
    return it->second;
  }
  const std::string& str(const Value& x) {
    if (!std::holds_alternative<std::string>(x.v)) fail(str_cat("expected a str, got a ", kind_of(x)));
    return std::get<std::string>(x.v);
  }
  int64_t integer(const Value& x) {
    if (!std::holds_alternative<int64_t>(x.v)) fail(str_cat("expected an int, got a ", kind_of(x)));
    return std::get<int64_t>(x.v);
  }
  List& list_of(Value& x) {
    if (!std::holds_alternative<List>(x.v)) fail(str_cat("expected a list, got a ", kind_of(x)));
    return std::get<List>(x.v);
  }
  Dict& dict_of(Value& x) {
    if (!std::holds_alternative<Dict>(x.v)) fail(str_cat("items added to a ", kind_of(x)));
    return std::get<Dict>(x.v);
  }
  std::vector<int64_t> ints(Value& x) {
    std::vector<int64_t> out;
    for (const auto& e : list_of(x)) out.push_back(integer(*e));
    return out;
  }

  ValuePtr persistent(Value& pid) {
    List& t = list_of(pid);
    if (t.size() != 5 || str(*t[0]) != "storage" || !std::holds_alternative<Global>(t[1]->v)) {
      fail("a persistent id that is not a tensor storage");
    }
    return make(Storage{str(*t[2]), storage_dtype(std::get<Global>(t[1]->v).name, who_)});
  }

  ValuePtr reduce(Value& fn, Value& args) {
    if (!std::holds_alternative<Global>(fn.v)) fail(str_cat("a call of a ", kind_of(fn)));
    const Global& g = std::get<Global>(fn.v);
    List& a = list_of(args);
    if (g.module == "collections" && g.name == "OrderedDict") return make(Dict{});
    // libtorch's C++ torch::save of a typed container wraps it with its type string.
    if (g.module == "torch.jit._pickle" && g.name == "restore_type_tag" && a.size() == 2 &&
        std::holds_alternative<Dict>(a[0]->v)) {
      return a[0];
    }
    if (g.module == "torch._utils" && g.name == "_rebuild_parameter" && a.size() >= 1 &&
        std::holds_alternative<at::Tensor>(a[0]->v)) {
      return a[0];
    }
    if (g.module == "torch._utils" && g.name == "_rebuild_tensor_v2" && a.size() >= 4 &&
        std::holds_alternative<Storage>(a[0]->v)) {
      return make(rebuild_tensor(std::get<Storage>(a[0]->v), integer(*a[1]), ints(*a[2]), ints(*a[3])));
    }
    fail("the file holds a Python object " + g.module + "." + g.name +
         " (only tensors in a dict or OrderedDict are read)");
  }

  at::Tensor rebuild_tensor(const Storage& s, int64_t offset, const std::vector<int64_t>& size,
                            const std::vector<int64_t>& stride) {
    if (size.size() != stride.size()) fail("a tensor whose size and stride differ in length");
    const std::string record = "data/" + s.key;
    if (!zip_.has(dir_ + record)) fail("the archive has no record '" + record + "'");
    const std::string data = zip_.read(dir_ + record);
    const size_t nbytes = data.size();
    const int64_t elem = static_cast<int64_t>(c10::elementSize(s.dtype));
    int64_t last = offset;  // the last element the view touches
    for (size_t i = 0; i < size.size(); ++i) {
      if (size[i] < 0 || stride[i] < 0) fail("a tensor with a negative size or stride");
      if (size[i] == 0) last = -1;
      if (last >= 0) last += (size[i] - 1) * stride[i];
    }
    if (offset < 0 || (last >= 0 && (last + 1) * elem > static_cast<int64_t>(nbytes))) {
      fail(str_cat("record '", record, "' has ", nbytes, " bytes, too few for its tensor of size ",
                   c10::IntArrayRef(size)));
    }
    c10::Allocator* cpu = c10::GetCPUAllocator();
    c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(nbytes), cpu->allocate(nbytes),
                         cpu, false);
    if (nbytes > 0) std::memcpy(storage.mutable_data(), data.data(), nbytes);
    at::Tensor t = at::empty({0}, at::TensorOptions().dtype(s.dtype));
    t.set_(storage, offset, size, stride);
    return t;
  }

  const std::string& p_;
  size_t pos_ = 0;
  const ZipArchive& zip_;
  std::string dir_;
  ErrorContext who_;
  std::vector<ValuePtr> stack_;
  std::map<size_t, ValuePtr> memo_;
};

// The folder ("<name>/") that holds the records of a torch.save archive, after checking the
// layout that torch.save writes and torch.load requires: every record in one folder, a data.pkl
// and a version record whose format version libtorch supports.
std::string torch_save_folder(const ZipArchive& zip, const ErrorContext& who) {
  const auto& names = zip.names();
  FSDP_CHECK(!names.empty() && names[0].find('/') != std::string::npos, ErrorKind::kCorruptData, who,
             "not a torch.save file: its entries are not in one folder (a numpy .npz or another zip?)");
  const std::string dir = names[0].substr(0, names[0].find('/') + 1);
  for (const auto& n : names) {
    FSDP_CHECK(n.compare(0, dir.size(), dir) == 0, ErrorKind::kCorruptData, who,
               "not a torch.save file: its entries are not in one folder");
  }
  const std::string version_record = zip.has(dir + ".data/version") ? dir + ".data/version" : dir + "version";
  FSDP_CHECK(zip.has(dir + "data.pkl") && zip.has(version_record), ErrorKind::kCorruptData, who,
             "not a torch.save file: the zip archive has no data.pkl or version record");
  const std::string text = zip.read(version_record);
  uint64_t version = 0;
  try {
    version = std::stoull(text);  // as libtorch parses it
  } catch (const std::exception&) {
    throw Error(ErrorKind::kCorruptData, who,
                "not a torch.save file: its version record '" + text.substr(0, 16) + "' is not a number");
  }
  FSDP_CHECK(version >= caffe2::serialize::kMinSupportedFileFormatVersion &&
                 version <= caffe2::serialize::kMaxSupportedFileFormatVersion,
             ErrorKind::kUnsupported, who, "the file's format version ", version, " is not in [",
             caffe2::serialize::kMinSupportedFileFormatVersion, ", ",
             caffe2::serialize::kMaxSupportedFileFormatVersion, "], the versions this libtorch reads");
  return dir;
}

// c10::Error's message without its backtrace, on one line.
std::string first_line(const c10::Error& e) {
  std::string s = e.what_without_backtrace();
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> read_torch_tensor_dict(const std::string& path,
                                                                       const ErrorContext& who) {
  std::string bytes = io::read_file(path);  // kIo when unreadable
  FSDP_CHECK(bytes.size() >= 4 && bytes.compare(0, 4, "PK\x03\x04") == 0, ErrorKind::kCorruptData, who,
             "not a torch.save file: not a zip archive (torch.save writes one since PyTorch 1.6; a "
             "file saved with _use_new_zipfile_serialization=False is not supported)");
  const ZipArchive zip(std::move(bytes), who, "not a torch.save file");
  const std::string dir = torch_save_folder(zip, who);
  if (zip.has(dir + "byteorder")) {
    const std::string order = zip.read(dir + "byteorder");
    FSDP_CHECK(order == "little", ErrorKind::kUnsupported, who, "the file is ", order,
               "-endian; only little-endian files are read");
  }
  const std::string pkl = zip.read(dir + "data.pkl");
  ValuePtr root;
  try {
    root = MiniUnpickler(pkl, zip, dir, who).run();
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kCorruptData, who, "cannot rebuild a tensor: " + first_line(e));
  }
  FSDP_CHECK(std::holds_alternative<Dict>(root->v), ErrorKind::kCorruptData, who,
             expected_actual("file contents", "a dict of name -> tensor", kind_of(*root)));
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [k, v] : std::get<Dict>(root->v)) {
    FSDP_CHECK(std::holds_alternative<std::string>(k->v) && std::holds_alternative<at::Tensor>(v->v),
               ErrorKind::kCorruptData, who,
               expected_actual("dict entry", "str -> tensor", str_cat(kind_of(*k), " -> ", kind_of(*v))),
               std::holds_alternative<std::string>(k->v) ? " for key '" + std::get<std::string>(k->v) + "'" : "");
    out.emplace_back(std::get<std::string>(k->v), std::get<at::Tensor>(v->v));
  }
  return out;
}

}  // namespace fsdp::checkpoint
