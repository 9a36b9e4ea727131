// The values a chat template computes with, and their Python semantics: what Jinja2 does with a
// value is what Python does with the object (str(), repr(), ==, <, +, len(), `in`, slicing,
// truthiness), so each operation here is the Python one, byte for byte where it prints.
//
//   Jinja2 / Python          Value kind
//   Undefined                kUndefined (with a hint naming what was missing)
//   None, bool, int, float   kNone, kBool, kInt (int64; overflow is an error), kFloat (double)
//   str                      kString (UTF-8; lengths, indexes and slices count code points)
//   list, tuple              kList, kTuple
//   dict                     kDict (insertion-ordered, as Python's; keys are scalars)
//   namespace()              kNamespace (the one mutable value: `set ns.x = ...`)
//   macros, functions,
//   bound methods            kCallable
//
// Values are immutable and cheap to copy (containers and strings are shared), except a
// namespace, which all its copies share and see change.
//
// Thread safety: a Value is safe to read from several threads; a namespace is for one render.
#ifndef CARPOOL_TEXT_JINJA_VALUE_H_
#define CARPOOL_TEXT_JINJA_VALUE_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace carpool::text::jinja {

class Value;
using List = std::vector<Value>;

// A dict: entries in insertion order; setting an existing key keeps its place (as Python).
// Set keeps an index of the string keys once a dict has a few entries, so that building a big
// dict costs O(n); appending to `entries` directly is fine (Set and Find catch the index up), but
// change or erase a key only through a fresh Dict.
struct Dict {
  std::vector<std::pair<Value, Value>> entries;

  const Value* Find(const Value& key) const;
  // (Inline for the small dicts a template looks into at every message; FindIndexed for those
  // with an index.)
  inline const Value* Find(absl::string_view key) const;
  void Set(Value key, Value value);

  const Value* FindIndexed(absl::string_view key) const;

  // Set's index: string key -> position in `entries`, valid for entries[0, indexed_).
  absl::flat_hash_map<std::string, size_t> index_;
  size_t indexed_ = 0;
};

// What one render may still spend; the evaluator implements it (Limits in template.h). Filters
// and methods that loop or build strings charge it.
class Budget {
 public:
  virtual ~Budget() = default;
  // Counts `n` loop iterations; an error once the render passed its iteration or time limit.
  virtual absl::Status Iterate(int64_t n = 1) = 0;
  // An error when a string or list of `bytes` would pass the render's output limit.
  virtual absl::Status CheckSize(int64_t bytes) = 0;
};

struct CallArgs;  // below Value

using Function = std::function<absl::StatusOr<Value>(const CallArgs& args, Budget& budget)>;

struct Callable {
  std::string name;  // for errors and repr
  Function fn;
};

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kNamespace,
  kCallable,
};

// Python's type name of a kind, as Jinja2's messages print it: "str", "int", "dict", "list",
// "NoneType", "Undefined", ...
const char* KindName(Kind kind);

class Value {
 public:
  // Undefined, with the hint Jinja2 would give when it is used: "'x' is undefined" or
  // "'dict object' has no attribute 'x'". `unsafe`: an attribute the sandbox refuses
  // (list.append, ...): using it is "access to attribute 'append' of 'list' object is unsafe".
  static Value Undefined(std::string hint = "", bool unsafe = false);
  Value() = default;  // an Undefined without a hint
  Value(const Value& other) : kind_(other.kind_), generator_(other.generator_), boxed_(other.boxed_),
                              bits_(other.bits_) {
    if (boxed_) bits_.box->refs.fetch_add(1, std::memory_order_relaxed);
  }
  Value(Value&& other) noexcept
      : kind_(other.kind_), generator_(other.generator_), boxed_(other.boxed_), bits_(other.bits_) {
    other.kind_ = Kind::kNone;
    other.boxed_ = false;
  }
  Value& operator=(const Value& other) {
    if (other.boxed_) other.bits_.box->refs.fetch_add(1, std::memory_order_relaxed);
    Release();
    kind_ = other.kind_;
    generator_ = other.generator_;
    boxed_ = other.boxed_;
    bits_ = other.bits_;
    return *this;
  }
  Value& operator=(Value&& other) noexcept {
    if (this != &other) {
      Release();
      kind_ = other.kind_;
      generator_ = other.generator_;
      boxed_ = other.boxed_;
      bits_ = other.bits_;
      other.kind_ = Kind::kNone;
      other.boxed_ = false;
    }
    return *this;
  }
  ~Value() { Release(); }
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value MakeList(List items);
  // What Jinja2's lazy filters (map, select, reject, selectattr, rejectattr, unique, batch,
  // slice, items, reverse) give: a Python generator. It iterates as a list (kind kList) but is
  // always true, has no len(), no items by index, prints as "<generator object>" and is not
  // JSON; `|list` turns it into a list.
  static Value MakeGenerator(List items);
  static Value MakeTuple(List items);
  static Value MakeDict(Dict dict);
  // A namespace with these attributes; its copies share them.
  static Value Namespace(Dict attributes);
  static Value MakeCallable(std::string name, Function fn);

  // JSON as Python's json.loads gives it: objects are dicts in the document's key order (parse
  // with nlohmann::ordered_json to keep it), integers ints (outside int64: floats), other numbers
  // floats.
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_number() const { return kind() == Kind::kInt || kind() == Kind::kFloat; }
  // A list or a tuple.
  bool is_sequence() const { return kind() == Kind::kList || kind() == Kind::kTuple; }
  // A dict or a namespace (what has attributes by name).
  bool is_mapping() const { return kind() == Kind::kDict; }
  // A kList made by MakeGenerator.
  bool is_generator() const { return generator_; }

  // REQUIRES: the matching kind (kBool for bool_value; kInt or kBool for int_value; any number
  // or kBool for float_value).
  bool bool_value() const { return bits_.b; }
  int64_t int_value() const { return kind_ == Kind::kBool ? (bits_.b ? 1 : 0) : bits_.i; }
  double float_value() const {
    return kind_ == Kind::kFloat ? bits_.d : static_cast<double>(int_value());
  }
  const std::string& string_value() const { return Unbox<std::string>(); }
  const List& list_value() const { return Unbox<List>(); }  // kList or kTuple
  const Dict& dict_value() const { return Unbox<Dict>(); }  // kDict, or a namespace's attributes
  Dict& namespace_attributes() const { return Unbox<Dict>(); }  // kNamespace
  const Callable& callable_value() const { return Unbox<Callable>(); }
  const std::string& undefined_hint() const;
  bool undefined_is_unsafe() const;

  // Python truthiness (Undefined is false).
  bool Truthy() const;
  // str(): what {{ value }} prints. Undefined prints "".
  std::string Str() const;
  // repr(): how a value prints inside a list or dict: 'a', 1.0, None, True, [1, 'a'], {'k': 1},
  // (1,), <Namespace ...>.
  std::string Repr() const;

 private:
  struct UndefinedData {
    std::string hint;
    bool unsafe = false;
  };
  // What a string, container, callable or hinted Undefined keeps on the heap, shared by the
  // Value's copies. The count is atomic: a template's constants are read by concurrent renders.
  // (A hand-made box rather than std::shared_ptr in a std::variant: a Value is copied at
  // almost every step of a render, and this copy is one branch and one increment.)
  struct Box {
    std::atomic<int64_t> refs{1};
  };
  template <typename T>
  struct Boxed : Box {
    explicit Boxed(T v) : value(std::move(v)) {}
    T value;
  };
  template <typename T>
  T& Unbox() const {
    return static_cast<Boxed<T>*>(bits_.box)->value;
  }
  template <typename T>
  static Value MakeBoxed(T v, Kind kind) {
    Value out;
    out.kind_ = kind;
    out.boxed_ = true;
    out.bits_.box = new Boxed<T>(std::move(v));
    return out;
  }
  void Release() {
    if (boxed_ && bits_.box->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) Destroy();
  }
  // Deletes the box as the type kind_ says it holds.
  void Destroy();

  Kind kind_ = Kind::kUndefined;
  bool generator_ = false;
  bool boxed_ = false;  // bits_.box is set (and counted); else the value is in bits_ itself
  union Bits {
    bool b;
    int64_t i;
    double d;
    Box* box;
  } bits_{.i = 0};
};

// Whether the n bytes at a and b are the same. Up to 16 bytes (the keys and roles templates
// compare) it is two overlapping word compares, with no call and no loop to mispredict.
inline bool SameBytes(const char* a, const char* b, size_t n) {
  if (n >= 8) {
    if (n > 16) return std::memcmp(a, b, n) == 0;
    uint64_t x0, y0, x1, y1;
    std::memcpy(&x0, a, 8);
    std::memcpy(&y0, b, 8);
    std::memcpy(&x1, a + n - 8, 8);
    std::memcpy(&y1, b + n - 8, 8);
    return ((x0 ^ y0) | (x1 ^ y1)) == 0;
  }
  if (n >= 4) {
    uint32_t x0, y0, x1, y1;
    std::memcpy(&x0, a, 4);
    std::memcpy(&y0, b, 4);
    std::memcpy(&x1, a + n - 4, 4);
    std::memcpy(&y1, b + n - 4, 4);
    return ((x0 ^ y0) | (x1 ^ y1)) == 0;
  }
  if (n == 0) return true;
  return a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1];
}

inline const Value* Dict::Find(absl::string_view key) const {
  if (indexed_ > 0) return FindIndexed(key);
  for (const auto& [k, v] : entries) {
    if (!k.is_string()) continue;
    const std::string& name = k.string_value();
    if (name.size() == key.size() && SameBytes(name.data(), key.data(), key.size())) return &v;
  }
  return nullptr;
}

// A call's arguments.
struct CallArgs {
  // (Inline: most calls pass a few arguments, and a template makes calls at every message.)
  absl::InlinedVector<Value, 2> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Python's ==: 1 == 1.0 == True, [1] == [1.0], ('a',) != ['a'], Undefined == Undefined.
bool Equals(const Value& a, const Value& b);
// Python's <, for numbers, strings (by code point), lists and tuples (of the same kind);
// INVALID_ARGUMENT "'<' not supported between instances of 'str' and 'int'" otherwise.
absl::StatusOr<bool> Less(const Value& a, const Value& b);
// <, <=, >, >= as Python's (Less is Compare(kLt, ...)); the error names the operator written.
// Undefined operands are the error CheckDefined gives.
enum class CompareOp { kLt, kLe, kGt, kGe };
absl::StatusOr<bool> Compare(CompareOp op, const Value& a, const Value& b);

// The operators of Jinja2 expressions, as Python's: + (numbers; str + str; list + list),
// - * / // % ** and unary -, each INVALID_ARGUMENT with Python's TypeError or ZeroDivisionError
// message on types it does not take; `str * int` and `list * int` repeat (charged to `budget`).
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
absl::StatusOr<Value> Arithmetic(BinaryOp op, const Value& a, const Value& b, Budget& budget);
absl::StatusOr<Value> Negate(const Value& a);
// Jinja2's ~: str(a) + str(b).
absl::StatusOr<Value> Concat(const Value& a, const Value& b, Budget& budget);
// Python's `item in container`: substring for strings, membership for lists and tuples, keys
// for dicts. An Undefined container holds nothing (Jinja2's Undefined iterates as empty).
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

// Jinja2's lookups. `obj.name`: an attribute first (a string's or dict's method, bound; a
// namespace's attribute), then the item `name`. `obj[key]`: the item first (negative indexes
// count from the end), then, for a string key, the attribute. What neither finds is Undefined
// with Jinja2's hint; an attribute the sandbox refuses is an unsafe Undefined.
// An Undefined `obj` is returned as is: Jinja2 raises its error on x.attr and x[key] when x is
// undefined, so the evaluator calls CheckDefined(obj) first.
Value GetAttr(const Value& obj, absl::string_view name);
// Whether GetAttr(d, name) on a dict `d` may answer something other than the item `name` (a
// method, a method the sandbox refuses, a special name); for the other names it is the item.
bool DictAttributeIsSpecial(absl::string_view name);
Value GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] for strings, lists and tuples; a missing bound is nullopt.
absl::StatusOr<Value> Slice(const Value& obj, std::optional<int64_t> start,
                            std::optional<int64_t> stop, std::optional<int64_t> step);

// What `for x in value` walks: a list's or tuple's items, a dict's keys, a string's characters;
// Undefined walks nothing. INVALID_ARGUMENT "'int' object is not iterable" otherwise.
absl::StatusOr<List> Iterate(const Value& value);
// len(): INVALID_ARGUMENT "object of type 'int' has no len()" where Python has none.
absl::StatusOr<int64_t> Length(const Value& value);

// An error that using `value` raises when it is Undefined (hint, or the unsafe attribute
// message); OK for any other value.
// CheckDefined's error. REQUIRES: value is Undefined.
absl::Status UndefinedError(const Value& value);
inline absl::Status CheckDefined(const Value& value) {
  if (!value.is_undefined()) return absl::OkStatus();
  return UndefinedError(value);
}

}  // namespace carpool::text::jinja

#endif  // CARPOOL_TEXT_JINJA_VALUE_H_
