#include "text/jinja/evaluator.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "text/jinja/builtins.h"

namespace carpool::text::jinja {
namespace {

// Payloads that keep an error's message as it is: a limit, raise_exception, or one that
// already names its line.
constexpr absl::string_view kAsIs = "carpool.jinja/as-is";

absl::Status AsIs(absl::Status status) {
  status.SetPayload(kAsIs, absl::Cord("1"));
  return status;
}

ABSL_ATTRIBUTE_NOINLINE absl::Status LocatedError(const absl::Status& status, int line) {
  if (status.GetPayload(kAsIs).has_value()) return status;
  return AsIs(absl::Status(status.code(), absl::StrCat("line ", line, ": ", status.message())));
}

// `status`, its message prefixed with "line N: " unless it is OK or already as it should read.
inline absl::Status Located(absl::Status status, int line) {
  if (ABSL_PREDICT_TRUE(status.ok())) return status;
  return LocatedError(status, line);
}

// The deepest nesting of lists, dicts and namespaces a namespace attribute may hold.
constexpr int kMaxValueDepth = 200;

// Evaluates `expr` into `const Value* ptr`, through `tmp` when it is not a stored value.
// (An optional, since a default Value is an Undefined that allocates.)
#define CARPOOL_JINJA_EVAL_REF(ptr, tmp, expr) \
  const Value* ptr = TryRef(expr);             \
  std::optional<Value> tmp;                    \
  if (ptr == nullptr) {                        \
    ASSIGN_OR_RETURN(tmp, Eval(expr));         \
    ptr = &*tmp;                               \
  }

// Python's sandboxed range() refuses more items than this.
constexpr int64_t kMaxRange = 100000;

struct Frame;

struct LoopState {
  const Stmt* stmt = nullptr;  // the for statement (loop(items) reruns it when recursive)
  Frame* outer = nullptr;      // the scope around the for statement
  int64_t depth = 1;           // loop.depth: 1, and one more in each loop(items)
  const List* items = nullptr;
  bool reversed = false;  // the loop walks `items` from the end (for x in xs[::-1])
  int64_t index0 = 0;
  int64_t length = 0;

  // The item of iteration i.
  const Value& Item(int64_t i) const {
    return (*items)[static_cast<size_t>(reversed ? length - 1 - i : i)];
  }
  bool has_changed = false;
  Value last_changed = Value::None();
};

// One scope: a for iteration, a macro call, a block. The root scope is Renderer::root_.
struct Frame {
  Frame* parent = nullptr;
  std::vector<std::pair<int, Value>> vars;
  LoopState* loop = nullptr;
  // A for iteration's loop variable (a plain name): the item itself, which the loop's list
  // keeps alive, rather than a counted copy in `vars`. A `set` of the same name in the body
  // goes to `vars`, which Find reads first.
  int item_id = -1;
  const Value* item = nullptr;
  bool item_shadowed = false;  // `vars` holds item_id too (and wins)

  const Value* Find(int id) const {
    if (id == item_id && !item_shadowed) return item;
    for (const auto& [k, v] : vars) {
      if (k == id) return &v;
    }
    return nullptr;
  }
  // Empties the scope for the next iteration.
  void Clear() {
    vars.clear();
    item_shadowed = false;
  }
  void Set(int id, Value v) {
    if (id == item_id) item_shadowed = true;
    for (auto& [k, old] : vars) {
      if (k == id) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(id, std::move(v));
  }
};

class Renderer final : public Budget {
 public:
  Renderer(const Program& program, const RenderOptions& options)
      : p_(program), limits_(options.limits), now_(options.now_unix_micros) {
    // (None placeholders: a default Value is an Undefined, which allocates.)
    root_.resize(p_.names.size(), Value::None());
    root_set_.resize(p_.names.size(), 0);
    start_ = std::chrono::steady_clock::now();
  }
  ~Renderer() override {
    // Namespaces may hold themselves (set ns.x = ns): empty them so no cycle outlives the render.
    for (Value& ns : namespaces_) ns.namespace_attributes().entries.clear();
  }

  absl::StatusOr<std::string> Run(const Value& context) {
    if (context.kind() != Kind::kDict) {
      return absl::InvalidArgumentError("the template context must be a dict");
    }
    for (const auto& [key, value] : context.dict_value().entries) {
      if (!key.is_string()) continue;
      auto it = p_.ids.find(key.string_value());
      if (it == p_.ids.end()) continue;
      root_[it->second] = value;
      root_set_[it->second] = 1;
    }
    std::string out;
    out.reserve(std::min<size_t>(p_.output_size_hint.load(std::memory_order_relaxed),
                                 static_cast<size_t>(limits_.max_output_bytes)));
    out_ = &out;
    RETURN_IF_ERROR(ExecBody(p_.body));
    p_.output_size_hint.store(std::max<size_t>(out.size(), 4096), std::memory_order_relaxed);
    return out;
  }

  absl::Status Iterate(int64_t n) override {
    iterations_ += n;
    if (iterations_ > limits_.max_loop_iterations) {
      return AsIs(absl::InvalidArgumentError(absl::StrCat(
          "the template ran more than ", limits_.max_loop_iterations, " loop iterations")));
    }
    steps_ += n;
    if (steps_ >= 256) return CheckTime();
    return absl::OkStatus();
  }

  absl::Status CheckSize(int64_t bytes) override {
    if (bytes > limits_.max_output_bytes) {
      return AsIs(absl::InvalidArgumentError(absl::StrCat(
          "the template built a string of more than ", limits_.max_output_bytes, " bytes")));
    }
    return absl::OkStatus();
  }

 private:
  enum class Control { kNone, kBreak, kContinue };

  absl::Status CheckTime() {
    steps_ = 0;
    const auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - start_);
    if (elapsed.count() > limits_.max_run_time_us) {
      return AsIs(absl::InvalidArgumentError(
          absl::StrCat("the template ran longer than ", limits_.max_run_time_us, " microseconds")));
    }
    return absl::OkStatus();
  }

  absl::Status Append(absl::string_view s) {
    if (static_cast<int64_t>(out_->size() + s.size()) > limits_.max_output_bytes) {
      return AsIs(absl::InvalidArgumentError(absl::StrCat(
          "the template wrote more than ", limits_.max_output_bytes, " bytes of output")));
    }
    out_->append(s.data(), s.size());
    return absl::OkStatus();
  }
  absl::Status AppendValue(const Value& v) {
    if (v.is_string()) return Append(v.string_value());
    if (v.is_undefined()) return absl::OkStatus();
    return Append(v.Str());
  }

  // ---- scopes ----
  Value Lookup(int id) {
    for (Frame* f = frame_; f != nullptr; f = f->parent) {
      if (const Value* v = f->Find(id)) return *v;
      if (id == p_.loop_id && f->loop != nullptr) return LoopValue(*f->loop);
    }
    if (root_set_[id]) return root_[id];
    const Global g = p_.globals[id];
    if (g != Global::kNone) return GlobalValue(g);
    return Value::Undefined(absl::StrCat("'", p_.names[id], "' is undefined"));
  }
  // The variable `id` where it is stored (a scope or the root), or nullptr when it is a global,
  // the loop object or undefined. Valid while the expression being evaluated runs (no statement
  // assigns to the scopes around an expression meanwhile).
  const Value* LookupRef(int id) const {
    for (const Frame* f = frame_; f != nullptr; f = f->parent) {
      if (const Value* v = f->Find(id)) return v;
      if (id == p_.loop_id && f->loop != nullptr) return nullptr;
    }
    if (root_set_[id]) return &root_[id];
    return nullptr;
  }
  // Whether the name `id`, which LookupRef did not find, is undefined (rather than the loop
  // object or a global).
  bool IsUndefinedName(int id) const { return id != p_.loop_id && p_.globals[id] == Global::kNone; }
  // `e`'s value without a copy when it is a constant or a stored variable, or an item of one
  // found by name or index (message.role, messages[0]); nullptr otherwise.
  const Value* TryRef(const Expr& e) const {
    if (e.kind == ExprKind::kConst) return &e.value;
    if (e.kind == ExprKind::kName) return LookupRef(e.name);
    if (e.kind == ExprKind::kGetAttr) {
      const Value* found = nullptr;
      if (ProbeAttr(e, &found) == Probe::kFound) return found;
    }
    if (e.kind == ExprKind::kGetItem) return ProbeItem(e);
    return nullptr;
  }
  // `obj[key]` where GetItem would return a stored item: an int index in range of a stored list
  // or tuple, a string key a stored dict has; nullptr otherwise (ask GetItem).
  const Value* ProbeItem(const Expr& e) const {
    const Value* obj = TryRef(*e.a[0]);
    if (obj == nullptr) return nullptr;
    if (obj->is_sequence() && !obj->is_generator()) {
      int64_t i = 0;
      if (!TryInt(*e.a[1], &i)) return nullptr;
      const List& items = obj->list_value();
      const int64_t n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return nullptr;
      return &items[static_cast<size_t>(i)];
    }
    if (obj->kind() != Kind::kDict) return nullptr;
    const Value* key = TryRef(*e.a[1]);
    if (key == nullptr || !key->is_string()) return nullptr;
    return obj->dict_value().Find(absl::string_view(key->string_value()));
  }
  // `obj.name` on a stored dict without building anything: kFound (*out is the item, which
  // GetAttr would return), kMissing (GetAttr would return an Undefined), or kSlow (ask GetAttr).
  enum class Probe { kFound, kMissing, kSlow };
  Probe ProbeAttr(const Expr& e, const Value** out) const {
    if (e.dict_method) return Probe::kSlow;
    // (The object's name is on this node: no visit to the operand's for `message.role`.)
    const Value* obj = nullptr;
    if (e.name >= 0) {
      obj = LookupRef(e.name);
    } else if (e.a[0]->kind == ExprKind::kGetAttr || e.a[0]->kind == ExprKind::kGetItem) {
      obj = TryRef(*e.a[0]);
    }
    // (A namespace's attribute is its item, as a dict's whose name is no method.)
    if (obj == nullptr || (obj->kind() != Kind::kDict && obj->kind() != Kind::kNamespace)) {
      return Probe::kSlow;
    }
    *out = obj->dict_value().Find(absl::string_view(e.str));
    return *out != nullptr ? Probe::kFound : Probe::kMissing;
  }
  LoopState* FindLoop() const {
    for (const Frame* f = frame_; f != nullptr; f = f->parent) {
      if (f->Find(p_.loop_id) != nullptr) return nullptr;
      if (f->loop != nullptr) return f->loop;
    }
    return nullptr;
  }
  // `e`'s value when it is an int that needs no error path: an int constant or stored variable,
  // one of the loop's counters, `x|length` of a stored list or dict, and sums and differences of
  // those that do not overflow. False when it is not (ask Eval, which does what Python does).
  bool TryInt(const Expr& e, int64_t* out) const {
    switch (e.kind) {
      case ExprKind::kBinary: {
        if (e.op != BinaryOp::kAdd && e.op != BinaryOp::kSub) return false;
        int64_t a = 0, b = 0;
        if (!TryInt(*e.a[0], &a) || !TryInt(*e.a[1], &b)) return false;
        return e.op == BinaryOp::kAdd ? !__builtin_add_overflow(a, b, out)
                                      : !__builtin_sub_overflow(a, b, out);
      }
      case ExprKind::kFilter: {
        if (!e.length_filter) return false;
        const Value* v = TryRef(*e.a[0]);
        if (v == nullptr) return false;
        if (v->is_sequence() && !v->is_generator()) {
          *out = static_cast<int64_t>(v->list_value().size());
          return true;
        }
        if (v->kind() != Kind::kDict) return false;
        *out = static_cast<int64_t>(v->dict_value().entries.size());
        return true;
      }
      case ExprKind::kGetAttr:
        if (e.loop_attr != LoopAttr::kNone) {
          if (const LoopState* loop = FindLoop()) return LoopInt(*loop, e.loop_attr, out);
        }
        break;
      default:
        break;
    }
    const Value* v = TryRef(e);
    if (v == nullptr || v->kind() != Kind::kInt) return false;
    *out = v->int_value();
    return true;
  }
  // bool(e) for the leaves conditions are made of, when it needs no error path: a stored value,
  // loop.first and loop.last, `is defined` / `undefined` / `none` / `string` of a stored value
  // or of a dict's missing item, ==, != and `in` of stored strings, comparisons of TryInt's ints.
  // False when `e` is none of these (ask Test). Leaves only: Test walks `not`, `and` and `or`,
  // so that no node is tried twice.
  bool QuickTest(const Expr& e, bool* out) const {
    switch (e.kind) {
      case ExprKind::kConst:
        *out = e.value.Truthy();
        return true;
      case ExprKind::kName: {
        const Value* v = LookupRef(e.name);
        if (v == nullptr) {
          if (!IsUndefinedName(e.name)) return false;
          *out = false;  // `if tools` without tools
          return true;
        }
        *out = v->Truthy();
        return true;
      }
      case ExprKind::kGetAttr: {
        if (e.loop_attr == LoopAttr::kFirst || e.loop_attr == LoopAttr::kLast) {
          if (const LoopState* loop = FindLoop()) {
            *out = e.loop_attr == LoopAttr::kFirst ? loop->index0 == 0
                                                   : loop->index0 == loop->length - 1;
            return true;
          }
        }
        const Value* found = nullptr;
        switch (ProbeAttr(e, &found)) {
          case Probe::kFound:
            *out = found->Truthy();
            return true;
          case Probe::kMissing:
            *out = false;  // an Undefined is false
            return true;
          case Probe::kSlow:
            return false;
        }
        return false;
      }
      case ExprKind::kCompare:
        return e.compare_ops.size() == 1 && QuickCompare(e.compare_ops[0], *e.a[0], *e.a[1], out);
      case ExprKind::kTest:
        return QuickIs(e, out);
      default:
        return false;
    }
  }
  bool QuickCompare(CmpOp op, const Expr& left, const Expr& right, bool* out) const {
    const Value* a = TryRef(left);
    const Value* b = a != nullptr && a->is_string() ? TryRef(right) : nullptr;
    if (b != nullptr && b->is_string()) {
      const std::string& x = a->string_value();
      const std::string& y = b->string_value();
      switch (op) {
        case CmpOp::kEq:
          *out = x.size() == y.size() && SameBytes(x.data(), y.data(), x.size());
          return true;
        case CmpOp::kNe:
          *out = !(x.size() == y.size() && SameBytes(x.data(), y.data(), x.size()));
          return true;
        case CmpOp::kIn:
          *out = y.find(x) != std::string::npos;
          return true;
        case CmpOp::kNotIn:
          *out = y.find(x) == std::string::npos;
          return true;
        default:
          return false;
      }
    }
    int64_t i = 0, j = 0;
    if (op == CmpOp::kIn || op == CmpOp::kNotIn || !TryInt(left, &i) || !TryInt(right, &j)) {
      return false;
    }
    switch (op) {
      case CmpOp::kEq:
        *out = i == j;
        break;
      case CmpOp::kNe:
        *out = i != j;
        break;
      case CmpOp::kLt:
        *out = i < j;
        break;
      case CmpOp::kLe:
        *out = i <= j;
        break;
      case CmpOp::kGt:
        *out = i > j;
        break;
      case CmpOp::kGe:
        *out = i >= j;
        break;
      default:
        return false;
    }
    return true;
  }
  // `x is defined` and the other FastTests over a stored value or a dict's missing item.
  bool QuickIs(const Expr& e, bool* out) const {
    if (e.fast_test == FastTest::kNone) return false;
    const Expr& operand = *e.a[0];
    const Value* v = nullptr;
    if (operand.kind == ExprKind::kGetAttr) {
      switch (ProbeAttr(operand, &v)) {
        case Probe::kFound:
          break;
        case Probe::kMissing:
          *out = e.fast_test == FastTest::kUndefined;
          return true;
        case Probe::kSlow:
          return false;
      }
    } else {
      v = TryRef(operand);
      if (v == nullptr) {
        if (operand.kind != ExprKind::kName || !IsUndefinedName(operand.name)) return false;
        *out = e.fast_test == FastTest::kUndefined;  // `enable_thinking is defined` without it
        return true;
      }
    }
    switch (e.fast_test) {
      case FastTest::kDefined:
        *out = !v->is_undefined();
        return true;
      case FastTest::kUndefined:
        *out = v->is_undefined();
        return true;
      case FastTest::kIsNone:
        *out = v->is_none();
        return true;
      case FastTest::kString:
        *out = v->is_string();
        return true;
      case FastTest::kTrue:
        *out = v->kind() == Kind::kBool && v->bool_value();
        return true;
      case FastTest::kFalse:
        *out = v->kind() == Kind::kBool && !v->bool_value();
        return true;
      case FastTest::kNone:
        break;
    }
    return false;
  }
  void SetVar(int id, Value v) {
    if (frame_ != nullptr) {
      frame_->Set(id, std::move(v));
    } else {
      root_[id] = std::move(v);
      root_set_[id] = 1;
    }
  }
  absl::Status Assign(const Target& t, Value v);
  // What `set ns.attr = v` may store: no value that holds `ns` (Values are reference counted,
  // so a cycle would outlive the render) and no nesting deeper than kMaxValueDepth (what
  // prints, serializes or frees a value recurses through it).
  absl::Status CheckStorable(const Value& v, const Dict* ns, int depth);
  // A copy of every variable the current scopes see (for a closure that may outlive them).
  Frame* Snapshot();

  // ---- statements ----
  absl::Status ExecBody(const Body& body) {
    for (const StmtPtr& s : body) {
      RETURN_IF_ERROR(Exec(*s));
      if (control_ != Control::kNone) break;
    }
    return absl::OkStatus();
  }
  absl::Status Exec(const Stmt& s);
  ABSL_ATTRIBUTE_NOINLINE absl::Status ExecRare(const Stmt& s);
  absl::Status ExecFor(const Stmt& s);
  absl::Status RunLoop(const Stmt& s, const Value& iterable, int64_t depth, Frame* outer,
                       bool reversed = false);
  absl::Status ExecScoped(const Body& body, std::string* capture);
  ABSL_ATTRIBUTE_NOINLINE absl::Status PrintSum(const std::vector<const Expr*>& terms);
  absl::StatusOr<Value> CallMacro(const MacroDef& def, Frame* closure, const CallArgs& args);
  Value MakeMacro(std::shared_ptr<const MacroDef> def, Frame* closure);

  // ---- expressions ----
  absl::StatusOr<Value> Eval(const Expr& e) {
    if (ABSL_PREDICT_FALSE(++depth_ > kMaxEvalDepth)) {
      --depth_;
      return DepthError();
    }
    absl::StatusOr<Value> r = EvalImpl(e);
    --depth_;
    if (ABSL_PREDICT_FALSE(!r.ok())) return LocatedError(r.status(), e.line);
    return r;
  }
  ABSL_ATTRIBUTE_NOINLINE static absl::Status DepthError() {
    return AsIs(absl::InvalidArgumentError(
        absl::StrCat("the template nested evaluation deeper than ", kMaxEvalDepth, " levels")));
  }
  absl::StatusOr<Value> EvalImpl(const Expr& e);
  // bool(e), without building the values of `and`, `or`, `not`, comparisons and tests.
  absl::StatusOr<bool> Test(const Expr& e) {
    bool quick = false;
    if (QuickTest(e, &quick)) return quick;
    if (ABSL_PREDICT_FALSE(++depth_ > kMaxEvalDepth)) {
      --depth_;
      return DepthError();
    }
    absl::StatusOr<bool> r = TestImpl(e);
    --depth_;
    if (ABSL_PREDICT_FALSE(!r.ok())) return LocatedError(r.status(), e.line);
    return r;
  }
  absl::StatusOr<bool> TestImpl(const Expr& e);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<Value> EvalLookup(const Expr& e);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<Value> EvalFilter(const Expr& e);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<Value> EvalTest(const Expr& e);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<Value> EvalArithmetic(const Expr& e);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<Value> EvalConcat(const Expr& e);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<Value> EvalCompare(const Expr& e);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<Value> EvalCollection(const Expr& e);
  ABSL_ATTRIBUTE_NOINLINE Value MissingElse(int line);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<Value> EvalCall(const Expr& e);
  absl::StatusOr<Value> EvalNamespace(const CallSpec& spec);
  // callee(args): Python's error when callee is not callable.
  absl::StatusOr<Value> CallValue(const Value& callee, const CallArgs& args);
  absl::StatusOr<Value> EvalLoopCall(const Expr& e, LoopState& loop);
  absl::StatusOr<Value> EvalRecursiveLoop(const Expr& e, const LoopState& loop);
  absl::Status EvalArgs(const CallSpec& spec, CallArgs* args);
  absl::StatusOr<bool> Compare(CmpOp op, const Value& a, const Value& b);
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<Value> EvalSlice(const Expr& e);

  Value LoopValue(const LoopState& loop);
  // loop.<attr>; `name` spells it (for kOther's error).
  Value LoopAttrValue(const LoopState& loop, LoopAttr attr, absl::string_view name);
  // loop.<attr> when it is an int (index, index0, length, revindex, revindex0, depth, depth0).
  static bool LoopInt(const LoopState& loop, LoopAttr attr, int64_t* out);
  Value GlobalValue(Global g);
  absl::StatusOr<Value> CallGlobal(Global g, const CallArgs& args);

  const Program& p_;
  const Limits limits_;
  const std::function<int64_t()> now_;
  std::vector<Value> root_;
  std::vector<uint8_t> root_set_;
  Frame* frame_ = nullptr;
  std::string* out_ = nullptr;
  Control control_ = Control::kNone;
  int64_t iterations_ = 0;
  int64_t steps_ = 0;
  int depth_ = 0;
  int macro_depth_ = 0;
  std::chrono::steady_clock::time_point start_;
  Value block_value_ = Value::None();
  std::vector<Value> global_values_;
  std::vector<std::unique_ptr<Frame>> snapshots_;
  std::vector<Value> namespaces_;
};

// ---------------------------------------------------------------------------------------------
// Statements

absl::Status Renderer::Exec(const Stmt& s) {
  if (++steps_ >= 256) RETURN_IF_ERROR(CheckTime());
  switch (s.kind) {
    case StmtKind::kText:
      return Append(s.text);
    case StmtKind::kPrint: {
      if (!s.sum_terms.empty()) return Located(PrintSum(s.sum_terms), s.line);
      CARPOOL_JINJA_EVAL_REF(v, tmp, *s.expr);
      return AppendValue(*v);
    }
    case StmtKind::kIf:
      for (const auto& [cond, body] : s.branches) {
        ASSIGN_OR_RETURN(const bool c, Test(*cond));
        if (c) return ExecBody(body);
      }
      return ExecBody(s.else_body);
    case StmtKind::kFor:
      return ExecFor(s);
    case StmtKind::kSet: {
      if (s.target.kind == Target::Kind::kName) {
        // `set content = message.content`, `set index = (messages|length - 1) - loop.index0`:
        // a stored value or an int, with nothing to build.
        if (const Value* v = TryRef(*s.expr)) {
          SetVar(s.target.name, *v);
          return absl::OkStatus();
        }
        int64_t i = 0;
        if (TryInt(*s.expr, &i)) {
          SetVar(s.target.name, Value::Int(i));
          return absl::OkStatus();
        }
      }
      ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
      return Located(Assign(s.target, std::move(v)), s.line);
    }
    case StmtKind::kSetBlock:
    case StmtKind::kFilterBlock:
    case StmtKind::kMacro:
    case StmtKind::kCallBlock:
    case StmtKind::kWith:
      return ExecRare(s);
    case StmtKind::kBreak:
      control_ = Control::kBreak;
      return absl::OkStatus();
    case StmtKind::kContinue:
      control_ = Control::kContinue;
      return absl::OkStatus();
    case StmtKind::kScope:
      return ExecScoped(s.body, nullptr);
  }
  return absl::OkStatus();
}

// The statements chat templates use rarely, apart so that Exec's frame stays small.
absl::Status Renderer::ExecRare(const Stmt& s) {
  switch (s.kind) {
    case StmtKind::kSetBlock: {
      std::string captured;
      RETURN_IF_ERROR(ExecScoped(s.body, &captured));
      Value v = Value::String(std::move(captured));
      if (s.filter != nullptr) {
        block_value_ = std::move(v);
        ASSIGN_OR_RETURN(v, Eval(*s.filter));
      }
      return Located(Assign(s.target, std::move(v)), s.line);
    }
    case StmtKind::kFilterBlock: {
      std::string captured;
      RETURN_IF_ERROR(ExecScoped(s.body, &captured));
      block_value_ = Value::String(std::move(captured));
      ASSIGN_OR_RETURN(Value v, Eval(*s.filter));
      return AppendValue(v);
    }
    case StmtKind::kMacro:
      SetVar(s.target.name, MakeMacro(s.macro, frame_ == nullptr ? nullptr : Snapshot()));
      return absl::OkStatus();
    case StmtKind::kCallBlock: {
      const Expr& call = *s.expr;
      ASSIGN_OR_RETURN(Value callee, Eval(*call.a[0]));
      if (callee.kind() != Kind::kCallable) {
        RETURN_IF_ERROR(Located(CheckDefined(callee), s.line));
        return Located(absl::InvalidArgumentError(
                           absl::StrCat("'", KindName(callee.kind()), "' object is not callable")),
                       s.line);
      }
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(call.call, &args));
      args.keyword.emplace_back("caller",
                                MakeMacro(s.macro, frame_ == nullptr ? nullptr : Snapshot()));
      absl::StatusOr<Value> v = callee.callable_value().fn(args, *this);
      if (!v.ok()) return Located(v.status(), s.line);
      return AppendValue(*v);
    }
    case StmtKind::kWith: {
      Frame frame;
      frame.parent = frame_;
      std::vector<Value> values;
      for (const ExprPtr& v : s.with_values) {
        ASSIGN_OR_RETURN(Value value, Eval(*v));
        values.push_back(std::move(value));
      }
      Frame* saved = frame_;
      frame_ = &frame;
      for (size_t i = 0; i < values.size(); ++i) {
        RETURN_IF_ERROR(Located(Assign(s.with_targets[i], std::move(values[i])), s.line));
      }
      RETURN_IF_ERROR(ExecBody(s.body));
      frame_ = saved;
      return absl::OkStatus();
    }
    default:
      break;
  }
  return absl::OkStatus();
}

// {{ a + b + c }}: while the operands are strings, writes them without building the sum
// (Python would only concatenate them); from the first other operand on, computes as Python.
absl::Status Renderer::PrintSum(const std::vector<const Expr*>& terms) {
  {
    // The common case: every term a stored string (a constant or a message's field), written
    // as it is, with nothing to evaluate.
    absl::InlinedVector<const std::string*, 16> strings;
    for (const Expr* term : terms) {
      const Value* v = TryRef(*term);
      if (v == nullptr || !v->is_string()) break;
      strings.push_back(&v->string_value());
    }
    if (strings.size() == terms.size()) {
      size_t bytes = 0;
      for (const std::string* piece : strings) bytes += piece->size();
      RETURN_IF_ERROR(CheckSize(static_cast<int64_t>(bytes)));
      if (static_cast<int64_t>(out_->size() + bytes) <= limits_.max_output_bytes) {
        for (const std::string* piece : strings) out_->append(*piece);  // (all within the limit)
        return absl::OkStatus();
      }
      for (const std::string* piece : strings) RETURN_IF_ERROR(Append(*piece));
      return absl::OkStatus();
    }
  }
  // Stored values are pointed to; computed ones live in `temps` (sized up front: no moves).
  absl::InlinedVector<std::optional<Value>, 16> temps(terms.size());
  absl::InlinedVector<const Value*, 16> pieces;
  size_t bytes = 0;
  for (size_t k = 0; k < terms.size(); ++k) {
    const Value* v = TryRef(*terms[k]);
    if (v == nullptr) {
      ASSIGN_OR_RETURN(temps[k], Eval(*terms[k]));
      v = &*temps[k];
    }
    if (v->is_string()) {
      bytes += v->string_value().size();
      pieces.push_back(v);
      continue;
    }
    // Not all strings: the sum so far (strings), then Python's + for the rest.
    Value current = *v;
    if (!pieces.empty()) {
      RETURN_IF_ERROR(Located(CheckSize(static_cast<int64_t>(bytes)), terms[k]->line));
      std::string prefix;
      prefix.reserve(bytes);
      for (const Value* piece : pieces) prefix += piece->string_value();
      absl::StatusOr<Value> r =
          Arithmetic(BinaryOp::kAdd, Value::String(std::move(prefix)), current, *this);
      if (!r.ok()) return Located(r.status(), terms[k]->line);
      current = *std::move(r);
    }
    for (size_t m = k + 1; m < terms.size(); ++m) {
      const Expr& next = *terms[m];
      CARPOOL_JINJA_EVAL_REF(w, wtmp, next);
      if (current.is_string() && w->is_string()) {
        RETURN_IF_ERROR(Located(CheckSize(static_cast<int64_t>(current.string_value().size() +
                                                               w->string_value().size())),
                                next.line));
      }
      absl::StatusOr<Value> r = Arithmetic(BinaryOp::kAdd, current, *w, *this);
      if (!r.ok()) return Located(r.status(), next.line);
      current = *std::move(r);
    }
    return AppendValue(current);
  }
  RETURN_IF_ERROR(CheckSize(static_cast<int64_t>(bytes)));
  for (const Value* piece : pieces) RETURN_IF_ERROR(Append(piece->string_value()));
  return absl::OkStatus();
}

absl::Status Renderer::ExecScoped(const Body& body, std::string* capture) {
  Frame frame;
  frame.parent = frame_;
  Frame* saved = frame_;
  std::string* saved_out = out_;
  frame_ = &frame;
  if (capture != nullptr) out_ = capture;
  RETURN_IF_ERROR(ExecBody(body));
  frame_ = saved;
  out_ = saved_out;
  return absl::OkStatus();
}

// `-1` as the parser gives it (the negation of the constant 1), or a constant -1.
bool IsMinusOne(const Expr& e) {
  const Expr& c = e.kind == ExprKind::kNeg ? *e.a[0] : e;
  if (c.kind != ExprKind::kConst || c.value.kind() != Kind::kInt) return false;
  return c.value.int_value() == (e.kind == ExprKind::kNeg ? 1 : -1);
}

absl::Status Renderer::ExecFor(const Stmt& s) {
  const Expr& e = *s.expr;
  if (e.kind == ExprKind::kSlice && e.a[1] == nullptr && e.a[2] == nullptr && e.a[3] != nullptr &&
      IsMinusOne(*e.a[3]) && s.test == nullptr) {
    // for x in xs[::-1]: xs walked from its end, without the reversed copy. (A counted copy of
    // xs: the body may assign to where xs is stored.)
    const Value* seq = TryRef(*e.a[0]);
    if (seq != nullptr && seq->is_sequence() && !seq->is_generator()) {
      const Value held = *seq;
      return RunLoop(s, held, 1, frame_, /*reversed=*/true);
    }
  }
  ASSIGN_OR_RETURN(Value iterable, Eval(e));
  return RunLoop(s, iterable, 1, frame_);
}

absl::Status Renderer::RunLoop(const Stmt& s, const Value& iterable, int64_t depth, Frame* outer,
                               bool reversed) {
  List storage;
  const List* items;
  if (iterable.is_sequence()) {
    items = &iterable.list_value();
  } else {
    absl::StatusOr<List> walked = jinja::Iterate(iterable);
    if (!walked.ok()) return Located(walked.status(), s.line);
    storage = *std::move(walked);
    items = &storage;
  }
  Frame frame;
  frame.parent = outer;
  frame.vars.reserve(4);
  Frame* saved = frame_;
  frame_ = &frame;
  List filtered;
  if (s.test != nullptr) {
    for (const Value& item : *items) {
      RETURN_IF_ERROR(Iterate(1));
      frame.vars.clear();
      RETURN_IF_ERROR(Located(Assign(s.target, item), s.line));
      ASSIGN_OR_RETURN(Value keep, Eval(*s.test));
      if (keep.Truthy()) filtered.push_back(item);
    }
    items = &filtered;
  }
  LoopState loop;
  loop.stmt = &s;
  loop.outer = outer;
  loop.depth = depth;
  loop.items = items;
  loop.reversed = reversed;
  loop.length = static_cast<int64_t>(items->size());
  frame.loop = &loop;
  const bool bind_item = s.target.kind == Target::Kind::kName;
  if (bind_item) frame.item_id = s.target.name;
  // As Jinja2: the else body runs unless some iteration reached the end of the body (an
  // iteration left by break or continue does not count).
  bool completed = false;
  for (int64_t i = 0; i < loop.length; ++i) {
    RETURN_IF_ERROR(Iterate(1));
    loop.index0 = i;
    frame.Clear();
    if (bind_item) {
      frame.item = &loop.Item(i);
    } else {
      RETURN_IF_ERROR(Located(Assign(s.target, loop.Item(i)), s.line));
    }
    RETURN_IF_ERROR(ExecBody(s.body));
    if (control_ == Control::kBreak) {
      control_ = Control::kNone;
      break;
    }
    if (control_ == Control::kNone) completed = true;
    control_ = Control::kNone;
  }
  frame_ = saved;
  if (!completed) return ExecBody(s.else_body);
  return absl::OkStatus();
}

absl::Status Renderer::Assign(const Target& t, Value v) {
  switch (t.kind) {
    case Target::Kind::kName:
      SetVar(t.name, std::move(v));
      return absl::OkStatus();
    case Target::Kind::kTuple: {
      ASSIGN_OR_RETURN(List items, jinja::Iterate(v));
      if (items.size() < t.items.size()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "not enough values to unpack (expected %d, got %d)", t.items.size(), items.size()));
      }
      if (items.size() > t.items.size()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("too many values to unpack (expected %d)", t.items.size()));
      }
      for (size_t i = 0; i < items.size(); ++i) {
        RETURN_IF_ERROR(Assign(t.items[i], std::move(items[i])));
      }
      return absl::OkStatus();
    }
    case Target::Kind::kNamespaceAttr: {
      Value ns = Lookup(t.name);
      if (ns.kind() != Kind::kNamespace) {
        return absl::InvalidArgumentError("cannot assign attribute on non-namespace object");
      }
      RETURN_IF_ERROR(CheckStorable(v, &ns.namespace_attributes(), 0));
      ns.namespace_attributes().Set(Value::String(t.attr), std::move(v));
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status Renderer::CheckStorable(const Value& v, const Dict* ns, int depth) {
  const Kind k = v.kind();
  if (k != Kind::kList && k != Kind::kTuple && k != Kind::kDict && k != Kind::kNamespace) {
    return absl::OkStatus();
  }
  if (depth >= kMaxValueDepth) {
    return AsIs(absl::InvalidArgumentError(
        absl::StrCat("the template nested lists, dicts and namespaces deeper than ", kMaxValueDepth,
                     " levels")));
  }
  if (++steps_ >= 4096) RETURN_IF_ERROR(CheckTime());
  if (k == Kind::kNamespace) {
    if (&v.namespace_attributes() == ns) {
      return absl::InvalidArgumentError("a namespace cannot hold itself (a reference cycle)");
    }
    for (const auto& [key, item] : v.namespace_attributes().entries) {
      RETURN_IF_ERROR(CheckStorable(item, ns, depth + 1));
    }
  } else if (k == Kind::kDict) {
    for (const auto& [key, item] : v.dict_value().entries) {
      RETURN_IF_ERROR(CheckStorable(item, ns, depth + 1));
    }
  } else {
    for (const Value& item : v.list_value()) RETURN_IF_ERROR(CheckStorable(item, ns, depth + 1));
  }
  return absl::OkStatus();
}

Frame* Renderer::Snapshot() {
  auto copy = std::make_unique<Frame>();
  for (Frame* f = frame_; f != nullptr; f = f->parent) {
    for (const auto& [id, v] : f->vars) {
      if (copy->Find(id) == nullptr) copy->vars.emplace_back(id, v);
    }
    if (f->item != nullptr && copy->Find(f->item_id) == nullptr) {
      copy->vars.emplace_back(f->item_id, *f->item);
    }
  }
  snapshots_.push_back(std::move(copy));
  return snapshots_.back().get();
}

Value Renderer::MakeMacro(std::shared_ptr<const MacroDef> def, Frame* closure) {
  std::string name = def->name;
  return Value::MakeCallable(std::move(name),
                             [this, def = std::move(def), closure](const CallArgs& args, Budget&) {
                               return CallMacro(*def, closure, args);
                             });
}

absl::StatusOr<Value> Renderer::CallMacro(const MacroDef& def, Frame* closure,
                                          const CallArgs& args) {
  if (macro_depth_ >= limits_.max_recursion_depth) {
    return AsIs(absl::InvalidArgumentError(absl::StrCat(
        "the template nested macro calls deeper than ", limits_.max_recursion_depth, " levels")));
  }
  const size_t n = def.params.size();
  if (args.positional.size() > n && !def.catch_varargs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("macro '%s' takes not more than %d argument(s)", def.name, n));
  }
  Frame frame;
  frame.parent = closure;
  Frame* saved = frame_;
  std::string* saved_out = out_;
  frame_ = &frame;
  std::vector<bool> used(args.keyword.size(), false);
  const size_t first_default = n - def.defaults.size();
  for (size_t i = 0; i < n; ++i) {
    if (i < args.positional.size()) {
      frame.Set(def.params[i], args.positional[i]);
      continue;
    }
    bool found = false;
    for (size_t k = 0; k < args.keyword.size(); ++k) {
      if (!used[k] && args.keyword[k].first == def.param_names[i]) {
        frame.Set(def.params[i], args.keyword[k].second);
        used[k] = true;
        found = true;
        break;
      }
    }
    if (found) continue;
    if (i >= first_default) {
      ASSIGN_OR_RETURN(Value d, Eval(*def.defaults[i - first_default]));
      frame.Set(def.params[i], std::move(d));
    } else {
      frame.Set(def.params[i], Value::Undefined(absl::StrCat("parameter '", def.param_names[i],
                                                             "' was not provided")));
    }
  }
  if (def.uses_caller) {
    Value caller = Value::Undefined("No caller defined");
    for (size_t k = 0; k < args.keyword.size(); ++k) {
      if (!used[k] && args.keyword[k].first == "caller") {
        caller = args.keyword[k].second;
        used[k] = true;
      }
    }
    frame.Set(p_.caller_id, std::move(caller));
  }
  Dict extra_kwargs;
  for (size_t k = 0; k < args.keyword.size(); ++k) {
    if (used[k]) continue;
    if (!def.catch_kwargs) {
      frame_ = saved;
      return absl::InvalidArgumentError(absl::StrFormat("macro '%s' takes no keyword argument '%s'",
                                                        def.name, args.keyword[k].first));
    }
    extra_kwargs.Set(Value::String(args.keyword[k].first), args.keyword[k].second);
  }
  if (def.catch_varargs) {
    List rest;
    for (size_t i = n; i < args.positional.size(); ++i) rest.push_back(args.positional[i]);
    frame.Set(p_.varargs_id, Value::MakeTuple(std::move(rest)));
  }
  if (def.catch_kwargs) frame.Set(p_.kwargs_id, Value::MakeDict(std::move(extra_kwargs)));
  std::string out;
  out_ = &out;
  const Control saved_control = control_;
  // A macro call costs the C++ stack several evaluation levels: count it so.
  constexpr int kMacroCallDepth = 8;
  if (depth_ + kMacroCallDepth > kMaxEvalDepth) {
    frame_ = saved;
    out_ = saved_out;
    return DepthError();
  }
  ++macro_depth_;
  depth_ += kMacroCallDepth;
  absl::Status st = ExecBody(def.body);
  depth_ -= kMacroCallDepth;
  --macro_depth_;
  control_ = saved_control;
  frame_ = saved;
  out_ = saved_out;
  RETURN_IF_ERROR(st);
  return Value::String(std::move(out));
}

// ---------------------------------------------------------------------------------------------
// Expressions

absl::Status Renderer::EvalArgs(const CallSpec& spec, CallArgs* args) {
  args->positional.reserve(spec.args.size());
  for (const ExprPtr& a : spec.args) {
    ASSIGN_OR_RETURN(Value v, Eval(*a));
    args->positional.push_back(std::move(v));
  }
  for (const auto& [name, expr] : spec.kwargs) {
    ASSIGN_OR_RETURN(Value v, Eval(*expr));
    args->keyword.emplace_back(name, std::move(v));
  }
  if (spec.dyn_args != nullptr) {
    ASSIGN_OR_RETURN(Value v, Eval(*spec.dyn_args));
    ASSIGN_OR_RETURN(List items, jinja::Iterate(v));
    for (Value& item : items) args->positional.push_back(std::move(item));
  }
  if (spec.dyn_kwargs != nullptr) {
    ASSIGN_OR_RETURN(Value v, Eval(*spec.dyn_kwargs));
    if (!v.is_mapping()) {
      return absl::InvalidArgumentError(
          absl::StrCat("argument after ** must be a mapping, not ", KindName(v.kind())));
    }
    for (const auto& [key, value] : v.dict_value().entries) {
      if (!key.is_string()) return absl::InvalidArgumentError("keywords must be strings");
      args->keyword.emplace_back(key.string_value(), value);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Renderer::Compare(CmpOp op, const Value& a, const Value& b) {
  if (a.is_string() && b.is_string()) {  // message.role == "user"
    if (op == CmpOp::kEq) return a.string_value() == b.string_value();
    if (op == CmpOp::kNe) return a.string_value() != b.string_value();
  }
  switch (op) {
    case CmpOp::kEq:
      return Equals(a, b);
    case CmpOp::kNe:
      return !Equals(a, b);
    case CmpOp::kIn:
      return Contains(b, a);
    case CmpOp::kNotIn: {
      ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return !in;
    }
    case CmpOp::kLt:
      return jinja::Compare(CompareOp::kLt, a, b);
    case CmpOp::kLe:
      return jinja::Compare(CompareOp::kLe, a, b);
    case CmpOp::kGt:
      return jinja::Compare(CompareOp::kGt, a, b);
    case CmpOp::kGe:
      return jinja::Compare(CompareOp::kGe, a, b);
  }
  return false;
}

absl::StatusOr<Value> Renderer::EvalSlice(const Expr& e) {
  ASSIGN_OR_RETURN(Value obj, Eval(*e.a[0]));
  RETURN_IF_ERROR(CheckDefined(obj));
  std::optional<int64_t> bounds[3];
  for (int i = 0; i < 3; ++i) {
    if (e.a[i + 1] == nullptr) continue;
    ASSIGN_OR_RETURN(Value b, Eval(*e.a[i + 1]));
    if (b.is_none()) continue;
    if (b.kind() != Kind::kInt && b.kind() != Kind::kBool) {
      return absl::InvalidArgumentError(
          "slice indices must be integers or None or have an __index__ method");
    }
    bounds[i] = b.int_value();
  }
  if (bounds[2].has_value() && *bounds[2] == 0) {
    return absl::InvalidArgumentError("slice step cannot be zero");
  }
  return Slice(obj, bounds[0], bounds[1], bounds[2]);
}

absl::StatusOr<Value> Renderer::EvalImpl(const Expr& e) {
  // The cases that need more than a Value of stack live in functions of their own, so this
  // frame (one per nesting level) stays small.
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName:
      return Lookup(e.name);
    case ExprKind::kBlockValue:
      return block_value_;
    case ExprKind::kGetAttr:
    case ExprKind::kGetItem:
      return EvalLookup(e);
    case ExprKind::kSlice:
      return EvalSlice(e);
    case ExprKind::kCall:
      return EvalCall(e);
    case ExprKind::kFilter:
      return EvalFilter(e);
    case ExprKind::kTest:
      return EvalTest(e);
    case ExprKind::kNeg:
    case ExprKind::kPos:
    case ExprKind::kBinary:
      return EvalArithmetic(e);
    case ExprKind::kNot: {
      ASSIGN_OR_RETURN(const bool v, Test(*e.a[0]));
      return Value::Bool(!v);
    }
    case ExprKind::kConcat:
      return EvalConcat(e);
    case ExprKind::kAnd: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.a[0]));
      if (!a.Truthy()) return a;
      return Eval(*e.a[1]);
    }
    case ExprKind::kOr: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.a[0]));
      if (a.Truthy()) return a;
      return Eval(*e.a[1]);
    }
    case ExprKind::kCompare:
      return EvalCompare(e);
    case ExprKind::kCondExpr: {
      ASSIGN_OR_RETURN(const bool c, Test(*e.a[0]));
      if (c) return Eval(*e.a[1]);
      if (e.a[2] != nullptr) return Eval(*e.a[2]);
      return MissingElse(e.line);
    }
    case ExprKind::kList:
    case ExprKind::kTuple:
    case ExprKind::kDict:
      return EvalCollection(e);
  }
  return Value::Undefined();
}

absl::StatusOr<bool> Renderer::TestImpl(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kNot: {
      ASSIGN_OR_RETURN(const bool v, Test(*e.a[0]));
      return !v;
    }
    case ExprKind::kAnd: {
      ASSIGN_OR_RETURN(const bool a, Test(*e.a[0]));
      if (!a) return false;
      return Test(*e.a[1]);
    }
    case ExprKind::kOr: {
      ASSIGN_OR_RETURN(const bool a, Test(*e.a[0]));
      if (a) return true;
      return Test(*e.a[1]);
    }
    case ExprKind::kCompare:
      if (e.compare_ops.size() == 1) {
        CARPOOL_JINJA_EVAL_REF(left, left_tmp, *e.a[0]);
        CARPOOL_JINJA_EVAL_REF(right, right_tmp, *e.a[1]);
        if (e.compare_ops[0] == CmpOp::kEq && left->is_string() && right->is_string()) {
          return left->string_value() == right->string_value();  // message.role == "user"
        }
        return Compare(e.compare_ops[0], *left, *right);
      }
      break;
    case ExprKind::kGetAttr: {
      const Value* found = nullptr;
      switch (ProbeAttr(e, &found)) {
        case Probe::kFound:
          return found->Truthy();
        case Probe::kMissing:
          return false;  // an Undefined is false
        case Probe::kSlow:
          break;
      }
      break;
    }
    default:
      break;
  }
  CARPOOL_JINJA_EVAL_REF(v, tmp, e);
  return v->Truthy();
}

Value Renderer::MissingElse(int line) {
  return Value::Undefined(absl::StrCat("the inline if-expression on line ", line,
                                       " evaluated to false and no else section was defined."));
}

absl::StatusOr<Value> Renderer::EvalLookup(const Expr& e) {
  const Expr& obj_expr = *e.a[0];
  if (e.loop_attr != LoopAttr::kNone) {
    if (LoopState* loop = FindLoop()) return LoopAttrValue(*loop, e.loop_attr, e.str);
  }
  CARPOOL_JINJA_EVAL_REF(obj, tmp, obj_expr);
  RETURN_IF_ERROR(CheckDefined(*obj));
  if (e.kind == ExprKind::kGetAttr) {
    if (obj->kind() == Kind::kDict && !e.dict_method) {
      // No dict method has this name: the item, as GetAttr would find it.
      if (const Value* item = obj->dict_value().Find(absl::string_view(e.str))) return *item;
    }
    return GetAttr(*obj, e.str);
  }
  CARPOOL_JINJA_EVAL_REF(key, key_tmp, *e.a[1]);
  return GetItem(*obj, *key);
}

absl::StatusOr<Value> Renderer::EvalFilter(const Expr& e) {
  CARPOOL_JINJA_EVAL_REF(input_ref, input_tmp, *e.a[0]);
  const Value& input = *input_ref;
  if (!e.known)
    return absl::InvalidArgumentError(absl::StrCat("No filter named '", e.str, "' found."));
  CallArgs args;
  RETURN_IF_ERROR(EvalArgs(e.call, &args));
  return e.filter(input, args, *this);
}

absl::StatusOr<Value> Renderer::EvalTest(const Expr& e) {
  if (e.fast_test != FastTest::kNone && e.a[0]->kind == ExprKind::kGetAttr) {
    // `message.tool_calls is defined` on a message without one: no Undefined to build.
    const Value* found = nullptr;
    if (ProbeAttr(*e.a[0], &found) == Probe::kMissing) {
      return Value::Bool(e.fast_test == FastTest::kUndefined);
    }
  }
  CARPOOL_JINJA_EVAL_REF(input_ref, input_tmp, *e.a[0]);
  const Value& input = *input_ref;
  switch (e.fast_test) {
    case FastTest::kDefined:
      return Value::Bool(!input.is_undefined());
    case FastTest::kUndefined:
      return Value::Bool(input.is_undefined());
    case FastTest::kIsNone:
      return Value::Bool(input.is_none());
    case FastTest::kString:
      return Value::Bool(input.is_string());
    case FastTest::kTrue:
      return Value::Bool(input.kind() == Kind::kBool && input.bool_value());
    case FastTest::kFalse:
      return Value::Bool(input.kind() == Kind::kBool && !input.bool_value());
    case FastTest::kNone:
      break;
  }
  if (!e.known)
    return absl::InvalidArgumentError(absl::StrCat("No test named '", e.str, "' found."));
  CallArgs args;
  RETURN_IF_ERROR(EvalArgs(e.call, &args));
  ASSIGN_OR_RETURN(bool r, ApplyTest(e.str, input, args, *this));
  return Value::Bool(r);
}

absl::StatusOr<Value> Renderer::EvalArithmetic(const Expr& e) {
  int64_t sum = 0;
  if (e.kind == ExprKind::kBinary && TryInt(e, &sum)) return Value::Int(sum);
  CARPOOL_JINJA_EVAL_REF(a_ref, a_tmp, *e.a[0]);
  const Value& a = *a_ref;
  if (e.kind == ExprKind::kNeg) {
    RETURN_IF_ERROR(CheckDefined(a));
    return Negate(a);
  }
  if (e.kind == ExprKind::kPos) {
    RETURN_IF_ERROR(CheckDefined(a));
    if (a.is_number()) return a;
    if (a.kind() == Kind::kBool) return Value::Int(a.int_value());
    return absl::InvalidArgumentError(
        absl::StrCat("bad operand type for unary +: '", KindName(a.kind()), "'"));
  }
  CARPOOL_JINJA_EVAL_REF(b_ref, b_tmp, *e.a[1]);
  const Value& b = *b_ref;
  if (a.kind() == Kind::kInt && b.kind() == Kind::kInt) {
    // (messages|length - 1) - loop.index0 and the like: no trip through Arithmetic.
    int64_t r = 0;
    if (e.op == BinaryOp::kAdd && !__builtin_add_overflow(a.int_value(), b.int_value(), &r)) {
      return Value::Int(r);
    }
    if (e.op == BinaryOp::kSub && !__builtin_sub_overflow(a.int_value(), b.int_value(), &r)) {
      return Value::Int(r);
    }
  }
  if (e.op == BinaryOp::kAdd) {
    if (a.is_string() && b.is_string()) {
      RETURN_IF_ERROR(
          CheckSize(static_cast<int64_t>(a.string_value().size() + b.string_value().size())));
    } else if (a.is_sequence() && b.is_sequence()) {
      RETURN_IF_ERROR(CheckSize(
          static_cast<int64_t>((a.list_value().size() + b.list_value().size()) * sizeof(Value))));
    }
  }
  return Arithmetic(e.op, a, b, *this);
}

absl::StatusOr<Value> Renderer::EvalConcat(const Expr& e) {
  std::string s;
  for (const ExprPtr& part : e.a) {
    ASSIGN_OR_RETURN(Value v, Eval(*part));
    if (v.is_string()) {
      s += v.string_value();
    } else if (!v.is_undefined()) {
      s += v.Str();
    }
    RETURN_IF_ERROR(CheckSize(static_cast<int64_t>(s.size())));
  }
  return Value::String(std::move(s));
}

absl::StatusOr<Value> Renderer::EvalCompare(const Expr& e) {
  CARPOOL_JINJA_EVAL_REF(first, first_tmp, *e.a[0]);
  if (e.compare_ops.size() == 1) {
    CARPOOL_JINJA_EVAL_REF(right, right_tmp, *e.a[1]);
    ASSIGN_OR_RETURN(bool ok, Compare(e.compare_ops[0], *first, *right));
    return Value::Bool(ok);
  }
  Value left = *first;
  for (size_t i = 0; i < e.compare_ops.size(); ++i) {
    ASSIGN_OR_RETURN(Value right, Eval(*e.a[i + 1]));
    ASSIGN_OR_RETURN(bool ok, Compare(e.compare_ops[i], left, right));
    if (!ok) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> Renderer::EvalCollection(const Expr& e) {
  if (e.kind != ExprKind::kDict) {
    List items;
    items.reserve(e.a.size());
    for (const ExprPtr& item : e.a) {
      ASSIGN_OR_RETURN(Value v, Eval(*item));
      items.push_back(std::move(v));
    }
    if (e.kind == ExprKind::kList) return Value::MakeList(std::move(items));
    return Value::MakeTuple(std::move(items));
  }
  // Python's dict literal: a repeated key keeps its first place and takes the last value.
  // Keys are indexed by a canonical form (1, 1.0 and True are one key) so a large literal is
  // linear; tuples, which have no canonical form here, go through Dict::Set.
  Dict d;
  absl::flat_hash_map<std::string, size_t> index;
  for (size_t i = 0; i + 1 < e.a.size(); i += 2) {
    ASSIGN_OR_RETURN(Value k, Eval(*e.a[i]));
    ASSIGN_OR_RETURN(Value v, Eval(*e.a[i + 1]));
    std::string canonical;
    switch (k.kind()) {
      case Kind::kString:
        canonical = absl::StrCat("s", k.string_value());
        break;
      case Kind::kNone:
        canonical.push_back('n');
        break;
      case Kind::kBool:
      case Kind::kInt:
        canonical = absl::StrCat("i", k.int_value());
        break;
      case Kind::kFloat: {
        const double f = k.float_value();
        if (f == static_cast<double>(static_cast<int64_t>(f)) && f > -9.2e18 && f < 9.2e18) {
          canonical = absl::StrCat("i", static_cast<int64_t>(f));
        } else {
          canonical = absl::StrCat("f", k.Repr());
        }
        break;
      }
      case Kind::kTuple:
        d.Set(std::move(k), std::move(v));
        continue;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("unhashable type: '", KindName(k.kind()), "'"));
    }
    auto [it, inserted] = index.try_emplace(std::move(canonical), d.entries.size());
    if (inserted) {
      d.entries.emplace_back(std::move(k), std::move(v));
    } else {
      d.entries[it->second].second = std::move(v);
    }
  }
  return Value::MakeDict(std::move(d));
}

absl::StatusOr<Value> Renderer::EvalCall(const Expr& e) {
  const Expr& callee_expr = *e.a[0];
  if (callee_expr.kind == ExprKind::kGetAttr &&
      (callee_expr.loop_attr == LoopAttr::kCycle ||
       (callee_expr.loop_attr == LoopAttr::kOther && callee_expr.str == "changed"))) {
    if (LoopState* loop = FindLoop()) return EvalLoopCall(e, *loop);
  }
  if (callee_expr.kind == ExprKind::kName && callee_expr.name == p_.loop_id) {
    if (LoopState* loop = FindLoop()) return EvalRecursiveLoop(e, *loop);
  }
  if (callee_expr.kind == ExprKind::kName && p_.globals[callee_expr.name] != Global::kNone) {
    const int id = callee_expr.name;
    bool shadowed = root_set_[id] != 0;
    for (Frame* f = frame_; f != nullptr && !shadowed; f = f->parent) {
      shadowed = f->Find(id) != nullptr;
    }
    if (!shadowed) {
      if (p_.globals[id] == Global::kNamespace && e.call.args.empty() &&
          e.call.dyn_args == nullptr && e.call.dyn_kwargs == nullptr) {
        return EvalNamespace(e.call);
      }
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(e.call, &args));
      return CallGlobal(p_.globals[id], args);
    }
  }
  if (callee_expr.kind == ExprKind::kGetAttr && callee_expr.str_method != nullptr) {
    // s.strip(...) and the like: on a string, the method runs without being bound first.
    CARPOOL_JINJA_EVAL_REF(obj, obj_tmp, *callee_expr.a[0]);
    if (obj->is_string()) {
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(e.call, &args));
      return callee_expr.str_method(callee_expr.str, obj->string_value(), args, *this);
    }
    RETURN_IF_ERROR(CheckDefined(*obj));
    const Value callee = GetAttr(*obj, callee_expr.str);
    CallArgs args;
    if (callee.kind() == Kind::kCallable) RETURN_IF_ERROR(EvalArgs(e.call, &args));
    return CallValue(callee, args);
  }
  ASSIGN_OR_RETURN(Value callee, Eval(callee_expr));
  if (callee.kind() != Kind::kCallable) {
    RETURN_IF_ERROR(CheckDefined(callee));
    return absl::InvalidArgumentError(
        absl::StrCat("'", KindName(callee.kind()), "' object is not callable"));
  }
  CallArgs args;
  RETURN_IF_ERROR(EvalArgs(e.call, &args));
  return callee.callable_value().fn(args, *this);
}

// namespace(a=..., b=...): the keywords' values under the names the parser made Values of,
// with no CallArgs and no string built (what CallGlobal's namespace makes of them).
absl::StatusOr<Value> Renderer::EvalNamespace(const CallSpec& spec) {
  Dict d;
  d.entries.reserve(spec.kwargs.size());
  for (size_t k = 0; k < spec.kwargs.size(); ++k) {
    ASSIGN_OR_RETURN(Value v, Eval(*spec.kwargs[k].second));
    d.Set(spec.kwarg_keys[k], std::move(v));
  }
  Value ns = Value::Namespace(std::move(d));
  namespaces_.push_back(ns);
  return ns;
}

absl::StatusOr<Value> Renderer::CallValue(const Value& callee, const CallArgs& args) {
  if (callee.kind() != Kind::kCallable) {
    RETURN_IF_ERROR(CheckDefined(callee));
    return absl::InvalidArgumentError(
        absl::StrCat("'", KindName(callee.kind()), "' object is not callable"));
  }
  return callee.callable_value().fn(args, *this);
}

absl::StatusOr<Value> Renderer::EvalLoopCall(const Expr& e, LoopState& loop) {
  CallArgs args;
  RETURN_IF_ERROR(EvalArgs(e.call, &args));
  if (e.a[0]->str == "cycle") {
    if (args.positional.empty()) return absl::InvalidArgumentError("no items for cycling given");
    return args.positional[loop.index0 % static_cast<int64_t>(args.positional.size())];
  }
  Value current = Value::MakeTuple(List(args.positional.begin(), args.positional.end()));
  const bool changed = !loop.has_changed || !Equals(current, loop.last_changed);
  loop.has_changed = true;
  loop.last_changed = std::move(current);
  return Value::Bool(changed);
}

// loop(items) in a recursive for: the loop over `items` one level deeper, as a string.
absl::StatusOr<Value> Renderer::EvalRecursiveLoop(const Expr& e, const LoopState& loop) {
  if (!loop.stmt->recursive) {
    return absl::InvalidArgumentError(
        "The loop must have the 'recursive' marker to be called recursively.");
  }
  CallArgs args;
  RETURN_IF_ERROR(EvalArgs(e.call, &args));
  if (args.positional.size() != 1 || !args.keyword.empty()) {
    return absl::InvalidArgumentError("loop() takes exactly one argument (the items)");
  }
  if (macro_depth_ >= limits_.max_recursion_depth) {
    return AsIs(absl::InvalidArgumentError(absl::StrCat(
        "the template nested macro calls deeper than ", limits_.max_recursion_depth, " levels")));
  }
  constexpr int kLoopCallDepth = 8;  // as a macro call
  if (depth_ + kLoopCallDepth > kMaxEvalDepth) return DepthError();
  std::string out;
  std::string* saved_out = out_;
  Frame* saved_frame = frame_;
  const Control saved_control = control_;
  out_ = &out;
  ++macro_depth_;
  depth_ += kLoopCallDepth;
  absl::Status st = RunLoop(*loop.stmt, args.positional[0], loop.depth + 1, loop.outer);
  depth_ -= kLoopCallDepth;
  --macro_depth_;
  out_ = saved_out;
  frame_ = saved_frame;
  control_ = saved_control;
  RETURN_IF_ERROR(st);
  return Value::String(std::move(out));
}

bool Renderer::LoopInt(const LoopState& loop, LoopAttr attr, int64_t* out) {
  const int64_t i = loop.index0, n = loop.length;
  switch (attr) {
    case LoopAttr::kIndex:
      *out = i + 1;
      return true;
    case LoopAttr::kIndex0:
      *out = i;
      return true;
    case LoopAttr::kLength:
      *out = n;
      return true;
    case LoopAttr::kRevindex:
      *out = n - i;
      return true;
    case LoopAttr::kRevindex0:
      *out = n - i - 1;
      return true;
    case LoopAttr::kDepth:
      *out = loop.depth;
      return true;
    case LoopAttr::kDepth0:
      *out = loop.depth - 1;
      return true;
    default:
      return false;
  }
}

Value Renderer::LoopAttrValue(const LoopState& loop, LoopAttr attr, absl::string_view name) {
  const int64_t i = loop.index0, n = loop.length;
  int64_t counter = 0;
  if (LoopInt(loop, attr, &counter)) return Value::Int(counter);
  switch (attr) {
    case LoopAttr::kFirst:
      return Value::Bool(i == 0);
    case LoopAttr::kLast:
      return Value::Bool(i == n - 1);
    case LoopAttr::kPrevitem:
      if (i > 0) return loop.Item(i - 1);
      return Value::Undefined("there is no previous item");
    case LoopAttr::kNextitem:
      if (i + 1 < n) return loop.Item(i + 1);
      return Value::Undefined("there is no next item");
    case LoopAttr::kCycle:
      return Value::MakeCallable(
          "cycle", [i](const CallArgs& args, Budget&) -> absl::StatusOr<Value> {
            if (args.positional.empty())
              return absl::InvalidArgumentError("no items for cycling given");
            return args.positional[i % static_cast<int64_t>(args.positional.size())];
          });
    default:
      break;
  }
  return Value::Undefined(absl::StrCat("'LoopContext' object has no attribute '", name, "'"));
}

Value Renderer::LoopValue(const LoopState& loop) {
  Dict d;
  for (int k = 1; k < static_cast<int>(LoopAttr::kOther); ++k) {
    const absl::string_view name = kLoopAttrNames[k];
    Value v = LoopAttrValue(loop, static_cast<LoopAttr>(k), name);
    if (!v.is_undefined()) d.Set(Value::String(std::string(name)), std::move(v));
  }
  return Value::MakeDict(std::move(d));
}

Value Renderer::GlobalValue(Global g) {
  const size_t k = static_cast<size_t>(g);
  if (global_values_.size() <= k) global_values_.resize(k + 1, Value::None());
  if (global_values_[k].is_none()) {
    static constexpr const char* kNames[] = {
        "", "range", "namespace", "dict", "raise_exception", "strftime_now", "joiner", "cycler"};
    global_values_[k] = Value::MakeCallable(
        kNames[k], [this, g](const CallArgs& args, Budget&) { return CallGlobal(g, args); });
  }
  return global_values_[k];
}

absl::StatusOr<int64_t> IntArg(const Value& v) {
  if (v.kind() == Kind::kInt || v.kind() == Kind::kBool) return v.int_value();
  RETURN_IF_ERROR(CheckDefined(v));
  return absl::InvalidArgumentError(
      absl::StrCat("'", KindName(v.kind()), "' object cannot be interpreted as an integer"));
}

// dict(...) and namespace(...): a mapping or a list of pairs, then keyword arguments.
absl::StatusOr<Dict> DictFromArgs(const CallArgs& args, absl::string_view name) {
  Dict d;
  if (args.positional.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s expected at most 1 argument, got %d", name, args.positional.size()));
  }
  if (args.positional.size() == 1) {
    const Value& src = args.positional[0];
    if (src.is_mapping() || src.kind() == Kind::kNamespace) {
      d = src.dict_value();
    } else {
      ASSIGN_OR_RETURN(List items, Iterate(src));
      for (const Value& item : items) {
        ASSIGN_OR_RETURN(List pair, Iterate(item));
        if (pair.size() != 2) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "dictionary update sequence element has length %d; 2 is required", pair.size()));
        }
        d.Set(pair[0], pair[1]);
      }
    }
  }
  for (const auto& [key, value] : args.keyword) d.Set(Value::String(key), value);
  return d;
}

absl::StatusOr<std::string> StrftimeNow(const std::string& fmt, int64_t micros) {
  const std::time_t secs =
      static_cast<std::time_t>(micros >= 0 ? micros / 1000000 : (micros - 999999) / 1000000);
  const int64_t frac = micros - static_cast<int64_t>(secs) * 1000000;
  std::tm tm{};
  localtime_r(&secs, &tm);
  // Python's %f (microseconds), %z and %Z (empty for a naive datetime) are not C's: expand them.
  std::string f;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '%' && i + 1 < fmt.size()) {
      if (fmt[i + 1] == 'f') {
        absl::StrAppendFormat(&f, "%06d", frac);
      } else if (fmt[i + 1] == 'z' || fmt[i + 1] == 'Z') {
        // datetime.now() is naive: it has no offset or zone name to print.
      } else {
        f.push_back('%');
        f.push_back(fmt[i + 1]);
      }
      ++i;
    } else {
      f.push_back(fmt[i]);
    }
  }
  if (f.empty()) return std::string();
  std::string out(f.size() * 4 + 64, '\0');
  for (int attempt = 0; attempt < 4; ++attempt) {
    const size_t n = std::strftime(out.data(), out.size(), f.c_str(), &tm);
    if (n > 0) {
      out.resize(n);
      return out;
    }
    out.resize(out.size() * 4);
  }
  return std::string();
}

absl::StatusOr<Value> Renderer::CallGlobal(Global g, const CallArgs& args) {
  switch (g) {
    case Global::kRange: {
      if (args.positional.empty() || args.positional.size() > 3 || !args.keyword.empty()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "range expected 1 to 3 integer arguments, got %d", args.positional.size()));
      }
      int64_t v[3] = {0, 0, 1};
      for (size_t i = 0; i < args.positional.size(); ++i) {
        ASSIGN_OR_RETURN(v[i], IntArg(args.positional[i]));
      }
      int64_t start = 0, stop = 0, step = 1;
      if (args.positional.size() == 1) {
        stop = v[0];
      } else {
        start = v[0];
        stop = v[1];
        step = args.positional.size() == 3 ? v[2] : 1;
      }
      if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
      __int128 count = 0;
      if (step > 0 && stop > start) count = (static_cast<__int128>(stop) - start + step - 1) / step;
      if (step < 0 && stop < start) {
        count = (static_cast<__int128>(start) - stop - step - 1) / (-static_cast<__int128>(step));
      }
      if (count > kMaxRange) {
        return AsIs(absl::InvalidArgumentError(absl::StrCat(
            "Range too big. The sandbox blocks ranges larger than MAX_RANGE (", kMaxRange, ").")));
      }
      RETURN_IF_ERROR(Iterate(static_cast<int64_t>(count)));
      List items;
      items.reserve(static_cast<size_t>(count));
      for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
        items.push_back(Value::Int(start + i * step));
      }
      return Value::MakeList(std::move(items));
    }
    case Global::kDict: {
      ASSIGN_OR_RETURN(Dict d, DictFromArgs(args, "dict"));
      return Value::MakeDict(std::move(d));
    }
    case Global::kNamespace: {
      ASSIGN_OR_RETURN(Dict d, DictFromArgs(args, "namespace"));
      Value ns = Value::Namespace(std::move(d));
      namespaces_.push_back(ns);
      return ns;
    }
    case Global::kRaiseException: {
      std::string message;
      if (!args.positional.empty()) {
        const Value& m = args.positional[0];
        message = m.is_string() ? m.string_value() : m.Str();
      }
      return AsIs(absl::InvalidArgumentError(message));
    }
    case Global::kStrftimeNow: {
      if (args.positional.size() != 1 || !args.positional[0].is_string()) {
        return absl::InvalidArgumentError("strftime_now() takes one string argument");
      }
      int64_t micros;
      if (now_) {
        micros = now_();
      } else {
        micros = std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
      }
      ASSIGN_OR_RETURN(std::string s, StrftimeNow(args.positional[0].string_value(), micros));
      RETURN_IF_ERROR(CheckSize(static_cast<int64_t>(s.size())));
      return Value::String(std::move(s));
    }
    case Global::kJoiner: {
      std::string sep = ", ";
      if (!args.positional.empty()) sep = args.positional[0].Str();
      for (const auto& [k, v] : args.keyword) {
        if (k == "sep") sep = v.Str();
      }
      auto used = std::make_shared<bool>(false);
      return Value::MakeCallable("joiner", [sep, used](const CallArgs&, Budget&) {
        const bool first = !*used;
        *used = true;
        return absl::StatusOr<Value>(Value::String(first ? "" : sep));
      });
    }
    case Global::kCycler: {
      if (args.positional.empty()) {
        return absl::InvalidArgumentError("at least one item has to be provided");
      }
      auto items = std::make_shared<List>(args.positional.begin(), args.positional.end());
      auto pos = std::make_shared<size_t>(0);
      Dict attrs;
      attrs.Set(Value::String("current"), (*items)[0]);
      Value ns = Value::Namespace(std::move(attrs));
      namespaces_.push_back(ns);
      Dict* shared = &ns.namespace_attributes();
      ns.namespace_attributes().Set(
          Value::String("next"),
          Value::MakeCallable("next", [items, pos, shared](const CallArgs&, Budget&) {
            Value v = (*items)[*pos];
            *pos = (*pos + 1) % items->size();
            shared->Set(Value::String("current"), (*items)[*pos]);
            return absl::StatusOr<Value>(v);
          }));
      ns.namespace_attributes().Set(
          Value::String("reset"),
          Value::MakeCallable("reset", [items, pos, shared](const CallArgs&, Budget&) {
            *pos = 0;
            shared->Set(Value::String("current"), (*items)[0]);
            return absl::StatusOr<Value>(Value::None());
          }));
      return ns;
    }
    case Global::kNone:
      break;
  }
  return Value::Undefined();
}

}  // namespace

absl::StatusOr<std::string> Evaluate(const Program& program, const Value& context,
                                     const RenderOptions& options) {
  Renderer renderer(program, options);
  absl::StatusOr<std::string> out = renderer.Run(context);
  // The payloads are the evaluator's bookkeeping: the caller gets the code and the message.
  if (!out.ok()) return absl::Status(out.status().code(), out.status().message());
  return out;
}

}  // namespace carpool::text::jinja
