// The syntax tree the parser builds and the evaluator walks. Names are interned at parse time
// (Program::names) so scope lookups compare integers; constants hold ready Values.
#ifndef CARPOOL_TEXT_JINJA_AST_H_
#define CARPOOL_TEXT_JINJA_AST_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "text/jinja/builtins.h"
#include "text/jinja/value.h"

namespace carpool::text::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;
using Operands = absl::InlinedVector<ExprPtr, 2>;

enum class ExprKind : uint8_t {
  kConst,       // value
  kName,        // name
  kBlockValue,  // the rendered body a filter block or block set filters
  kGetAttr,     // a[0].str
  kGetItem,     // a[0][a[1]]
  kSlice,       // a[0][a[1]:a[2]:a[3]] (missing bounds are null)
  kCall,        // a[0](call)
  kFilter,      // a[0] | str(call)
  kTest,        // a[0] is str(call)
  kNeg,         // -a[0]
  kPos,         // +a[0]
  kNot,         // not a[0]
  kBinary,      // a[0] op a[1]
  kConcat,      // a[0] ~ a[1] ~ ...
  kAnd,         // a[0] and a[1]
  kOr,          // a[0] or a[1]
  kCompare,     // a[0] compare_ops[0] a[1] compare_ops[1] a[2] ...
  kCondExpr,    // a[1] if a[0] else a[2] (a[2] may be null)
  kList,        // [a...]
  kTuple,       // (a...)
  kDict,        // {a[0]: a[1], a[2]: a[3], ...}
};

enum class CmpOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };
using CmpOps = absl::InlinedVector<CmpOp, 4>;

// A filter or test the evaluator handles itself (the rest go to builtins by name).
enum class FastTest : uint8_t { kNone, kDefined, kUndefined, kIsNone, kString, kTrue, kFalse };

// The attributes of Jinja2's loop object, resolved when parsing `loop.<name>` (kOther: a name
// the loop object lacks). kLoopAttrNames spells them, in this order.
enum class LoopAttr : uint8_t {
  kNone,  // not an attribute of `loop`
  kIndex,
  kIndex0,
  kFirst,
  kLast,
  kLength,
  kRevindex,
  kRevindex0,
  kDepth,
  kDepth0,
  kPrevitem,
  kNextitem,
  kCycle,
  kOther,
};
inline constexpr const char* kLoopAttrNames[] = {
    "",          "index", "index0", "first",    "last",     "length", "revindex",
    "revindex0", "depth", "depth0", "previtem", "nextitem", "cycle"};

struct CallSpec {
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<Value> kwarg_keys;  // kwargs' names as string Values (namespace(...)'s keys)
  ExprPtr dyn_args;               // *args
  ExprPtr dyn_kwargs;             // **kwargs
};

// (The fields a render reads at most nodes come first, so that a node's first cache line or
// two hold them, and operands up to two live in the node.)
struct Expr {
  ExprKind kind = ExprKind::kConst;
  FastTest fast_test = FastTest::kNone;  // kTest
  bool known = true;                     // kFilter, kTest: false = "No filter named" at run
  bool dict_method = false;              // kGetAttr: DictAttributeIsSpecial(str) (items, pop...)
  LoopAttr loop_attr = LoopAttr::kNone;  // kGetAttr on the name `loop`: which attribute
  bool length_filter = false;            // kFilter: `length` or `count`, without arguments
  BinaryOp op = BinaryOp::kAdd;          // kBinary
  int name = -1;                         // kName: the interned name; kGetAttr: a[0]'s if a kName
  int line = 0;
  int depth = 1;                     // of this subtree (the parser bounds it)
  Operands a;                        // operands (see ExprKind)
  Value value;                       // kConst
  std::string str;                   // kGetAttr: the attribute; kFilter, kTest: the name
  CmpOps compare_ops;                // kCompare
  StrMethodFn str_method = nullptr;  // kGetAttr: str names a string method of FindStrMethod
  FilterFn filter = nullptr;         // kFilter: the filter, when known
  CallSpec call;                     // kCall, kFilter, kTest
};

// What `set` or `for` assigns to.
struct Target {
  enum class Kind : uint8_t { kName, kTuple, kNamespaceAttr };
  Kind kind = Kind::kName;
  int name = -1;              // kName; kNamespaceAttr: the namespace variable
  std::string attr;           // kNamespaceAttr
  std::vector<Target> items;  // kTuple
};

// A macro's or a call block's signature and body.
struct MacroDef {
  std::string name;
  std::vector<int> params;
  std::vector<std::string> param_names;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool catch_varargs = false;  // the body uses `varargs`
  bool catch_kwargs = false;   // the body uses `kwargs`
  bool uses_caller = false;    // the body uses `caller`
};

enum class StmtKind : uint8_t {
  kText,         // text
  kPrint,        // expr
  kIf,           // branches (cond, body)..., else_body
  kFor,          // target in expr [if test] body [else else_body]
  kSet,          // target = expr
  kSetBlock,     // target = body, through filter (may be null)
  kMacro,        // macro
  kCallBlock,    // expr (a call) with macro as caller
  kFilterBlock,  // body through filter
  kWith,         // with_targets = with_values, body
  kBreak,
  kContinue,
  kScope,  // body as is ({% generation %})
};

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  ExprPtr expr;
  // kPrint of a sum `a + b + c ...`: its terms, left to right (the nodes of `expr`).
  std::vector<const Expr*> sum_terms;
  std::string text;
  ExprPtr test;            // kFor: the `if` filter
  bool recursive = false;  // kFor: `recursive` (the body may call loop(items))
  ExprPtr filter;          // kSetBlock, kFilterBlock: a filter chain over a kBlockValue
  Target target;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::shared_ptr<const MacroDef> macro;
  std::vector<Target> with_targets;
  std::vector<ExprPtr> with_values;
};

// A globally available function a name may resolve to when neither a local nor the context
// defines it.
enum class Global : uint8_t {
  kNone,
  kRange,
  kNamespace,
  kDict,
  kRaiseException,
  kStrftimeNow,
  kJoiner,
  kCycler,
};

struct Program {
  Body body;
  std::vector<std::string> names;             // by id
  std::vector<Global> globals;                // by id
  absl::flat_hash_map<std::string, int> ids;  // name -> id
  int loop_id = -1;                           // the id of `loop`
  int caller_id = -1;
  int varargs_id = -1;
  int kwargs_id = -1;
  // The size of the last render's output: the next render reserves it up front, so a long
  // prompt is not copied at every doubling of its buffer. (Only a hint: renders on several
  // threads may race on it harmlessly.)
  mutable std::atomic<size_t> output_size_hint{4096};
};

}  // namespace carpool::text::jinja

#endif  // CARPOOL_TEXT_JINJA_AST_H_
