#include "text/jinja/parser.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "text/jinja/builtins.h"
#include "text/jinja/lexer.h"

namespace carpool::text::jinja {
namespace {

// Jinja2 3.1's filters and tests: a name here that carpool lacks is "unsupported" (refused
// always); a name in neither list is "unknown" (refused as Jinja2 refuses it).
const absl::flat_hash_set<absl::string_view>& Jinja2Filters() {
  static const auto* names = new absl::flat_hash_set<absl::string_view>{
      "abs",    "attr",       "batch",       "capitalize", "center",   "count",
      "d",      "default",    "dictsort",    "e",          "escape",   "filesizeformat",
      "first",  "float",      "forceescape", "format",     "groupby",  "indent",
      "int",    "items",      "join",        "last",       "length",   "list",
      "lower",  "map",        "max",         "min",        "pprint",   "random",
      "reject", "rejectattr", "replace",     "reverse",    "round",    "safe",
      "select", "selectattr", "slice",       "sort",       "string",   "striptags",
      "sum",    "title",      "tojson",      "trim",       "truncate", "unique",
      "upper",  "urlencode",  "urlize",      "wordcount",  "wordwrap", "xmlattr"};
  return *names;
}

const absl::flat_hash_set<absl::string_view>& Jinja2Tests() {
  static const auto* names = new absl::flat_hash_set<absl::string_view>{
      "!=",       "<",        "<=",          "==",       ">",           ">=",       "boolean",
      "callable", "defined",  "divisibleby", "eq",       "equalto",     "escaped",  "even",
      "false",    "filter",   "float",       "ge",       "greaterthan", "gt",       "in",
      "integer",  "iterable", "le",          "lessthan", "lower",       "lt",       "mapping",
      "ne",       "none",     "number",      "odd",      "sameas",      "sequence", "string",
      "test",     "true",     "undefined",   "upper"};
  return *names;
}

Global GlobalFor(absl::string_view name) {
  if (name == "range") return Global::kRange;
  if (name == "namespace") return Global::kNamespace;
  if (name == "dict") return Global::kDict;
  if (name == "raise_exception") return Global::kRaiseException;
  if (name == "strftime_now") return Global::kStrftimeNow;
  if (name == "joiner") return Global::kJoiner;
  if (name == "cycler") return Global::kCycler;
  return Global::kNone;
}

// The terms of a print's `a + b + c ...` (left to right, at most 64: a longer sum's first terms
// stay one), which the evaluator writes one by one while they are strings; empty for other
// expressions.
std::vector<const Expr*> SumTerms(const Expr& e) {
  std::vector<const Expr*> terms;
  if (e.kind != ExprKind::kBinary || e.op != BinaryOp::kAdd) return terms;
  const Expr* left = &e;
  while (left->kind == ExprKind::kBinary && left->op == BinaryOp::kAdd && terms.size() < 64) {
    terms.push_back(left->a[1].get());
    left = left->a[0].get();
  }
  terms.push_back(left);
  std::reverse(terms.begin(), terms.end());
  return terms;
}

std::string Describe(const Token& t) {
  switch (t.type) {
    case TokenType::kEof:
      return "end of template";
    case TokenType::kData:
      return "template data";
    case TokenType::kVariableBegin:
      return "begin of print statement";
    case TokenType::kVariableEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "begin of statement block";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kString:
      return "string";
    case TokenType::kInteger:
      return "integer";
    case TokenType::kFloat:
      return "float";
    case TokenType::kName:
    case TokenType::kOperator:
      return t.text;
  }
  return "token";
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, Program* program)
      : toks_(std::move(tokens)), program_(program) {
    program_->loop_id = Intern("loop");
    program_->caller_id = Intern("caller");
    program_->varargs_id = Intern("varargs");
    program_->kwargs_id = Intern("kwargs");
  }

  absl::Status Run() {
    ASSIGN_OR_RETURN(program_->body, Subparse({}));
    if (cur().type != TokenType::kEof) return Unexpected(cur());
    return absl::OkStatus();
  }

 private:
  using Ends = std::initializer_list<absl::string_view>;

  // Bounds the parser's recursion (and so the tree's depth).
  class DepthGuard {
   public:
    explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
    ~DepthGuard() { --*depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    int* depth_;
  };

  const Token& cur() const { return toks_[i_]; }
  const Token& peek() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
  void Next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool IsOp(absl::string_view op) const { return cur().IsOperator(op); }
  bool IsName(absl::string_view name) const { return cur().IsName(name); }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(absl::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  absl::Status Fail(int line, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", message));
  }
  absl::Status Unexpected(const Token& t) const {
    return Fail(t.line, absl::StrCat("unexpected '", Describe(t), "'"));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!SkipOp(op)) {
      return Fail(cur().line, absl::StrCat("expected '", op, "', got '", Describe(cur()), "'"));
    }
    return absl::OkStatus();
  }
  absl::Status Expect(TokenType type, absl::string_view what) {
    if (cur().type != type) {
      return Fail(cur().line, absl::StrCat("expected ", what, ", got '", Describe(cur()), "'"));
    }
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (cur().type != TokenType::kName) {
      return Fail(cur().line, absl::StrCat("expected a name, got '", Describe(cur()), "'"));
    }
    std::string name = cur().text;
    Next();
    return name;
  }
  absl::Status Deeper() const {
    if (depth_ > kMaxParseDepth) {
      return Fail(cur().line,
                  absl::StrCat("the template nests deeper than ", kMaxParseDepth, " levels"));
    }
    return absl::OkStatus();
  }

  int Intern(const std::string& name) {
    auto [it, inserted] = program_->ids.try_emplace(name, static_cast<int>(program_->names.size()));
    if (inserted) {
      program_->names.push_back(name);
      program_->globals.push_back(GlobalFor(name));
    }
    return it->second;
  }

  absl::StatusOr<ExprPtr> Make(ExprKind kind, int line, std::vector<ExprPtr> a) {
    Operands operands;
    for (ExprPtr& x : a) operands.push_back(std::move(x));
    return Make(kind, line, std::move(operands));
  }
  absl::StatusOr<ExprPtr> Make(ExprKind kind, int line, Operands a) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->a = std::move(a);
    int depth = 0;
    for (const ExprPtr& c : e->a) {
      if (c != nullptr) depth = std::max(depth, c->depth);
    }
    e->depth = depth + 1;
    if (e->depth > kMaxParseDepth) {
      return Fail(line,
                  absl::StrCat("an expression nests deeper than ", kMaxParseDepth, " levels"));
    }
    return e;
  }
  static Operands Ptrs(ExprPtr x) {
    Operands v;
    v.push_back(std::move(x));
    return v;
  }
  static Operands Ptrs(ExprPtr x, ExprPtr y) {
    Operands v;
    v.push_back(std::move(x));
    v.push_back(std::move(y));
    return v;
  }
  static ExprPtr Const(Value v, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = ExprKind::kConst;
    e->line = line;
    e->value = std::move(v);
    return e;
  }

  // ---- statements ----
  absl::StatusOr<Body> Subparse(Ends ends);
  absl::StatusOr<Body> ParseBody(Ends ends, std::string* matched);
  absl::Status ParseStatement(Body* body);
  absl::Status ParseFor(Body* body, int line);
  absl::Status ParseIf(Body* body, int line);
  absl::Status ParseSet(Body* body, int line);
  absl::Status ParseMacro(Body* body, int line);
  absl::Status ParseCallBlock(Body* body, int line);
  absl::Status ParseFilterBlock(Body* body, int line);
  absl::Status ParseWith(Body* body, int line);
  absl::Status ParseSignature(MacroDef* def);
  absl::StatusOr<Target> ToTarget(const Expr& e);
  absl::StatusOr<Target> ParseAssignTarget(bool with_namespace, Ends extra_end);
  // Whether `t` assigns the name `loop` (Jinja2 refuses that in a for body and as a for target).
  bool NamesLoop(const Target& t) const;

  // ---- expressions ----
  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr = true);
  absl::StatusOr<ExprPtr> ParseCondExpr();
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  absl::StatusOr<ExprPtr> ParseMath1();
  absl::StatusOr<ExprPtr> ParseConcat();
  absl::StatusOr<ExprPtr> ParseMath2();
  absl::StatusOr<ExprPtr> ParsePow();
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter);
  absl::StatusOr<ExprPtr> ParsePrimary();
  absl::StatusOr<ExprPtr> ParseTuple(bool simplified, bool with_condexpr, Ends extra_end,
                                     bool explicit_parentheses);
  absl::StatusOr<ExprPtr> ParseList();
  absl::StatusOr<ExprPtr> ParseDict();
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseSubscribed();
  absl::Status ParseCallArgs(CallSpec* call);
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr node, bool start_inline);
  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node);
  bool IsTupleEnd(Ends extra_end) const;

  std::vector<Token> toks_;
  size_t i_ = 0;
  Program* program_;
  int depth_ = 0;
  bool soft_ = false;      // inside an `if` or an inline if (Jinja2's soft frame)
  int loop_depth_ = 0;     // for bodies around (break/continue are legal)
  std::vector<int> refs_;  // names loaded, in order (macros look for varargs/kwargs/caller)
  std::vector<std::vector<absl::string_view>> end_stack_;
  // Unknown filters and tests outside an `if`: refused once their statement is parsed (an inline
  // if around them, which Jinja2 treats as an `if`, is known only then).
  std::vector<absl::Status> pending_;
};

// ---------------------------------------------------------------------------------------------
// Statements

absl::StatusOr<Body> Parser::Subparse(Ends ends) {
  Body body;
  end_stack_.emplace_back(ends);
  for (;;) {
    const Token& t = cur();
    if (t.type == TokenType::kEof) break;
    if (t.type == TokenType::kData) {
      if (!body.empty() && body.back()->kind == StmtKind::kText) {
        body.back()->text += t.text;
      } else {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
      }
      Next();
    } else if (t.type == TokenType::kVariableBegin) {
      const int line = t.line;
      Next();
      auto s = std::make_unique<Stmt>();
      s->kind = StmtKind::kPrint;
      s->line = line;
      ASSIGN_OR_RETURN(s->expr, ParseTuple(false, true, {}, false));
      RETURN_IF_ERROR(Expect(TokenType::kVariableEnd, "end of print statement"));
      if (!pending_.empty()) return pending_.front();
      s->sum_terms = SumTerms(*s->expr);
      body.push_back(std::move(s));
    } else if (t.type == TokenType::kBlockBegin) {
      Next();
      if (cur().type == TokenType::kName &&
          std::find(ends.begin(), ends.end(), cur().text) != ends.end()) {
        end_stack_.pop_back();
        return body;
      }
      RETURN_IF_ERROR(ParseStatement(&body));
      RETURN_IF_ERROR(Expect(TokenType::kBlockEnd, "end of statement block"));
      if (!pending_.empty()) return pending_.front();
    } else {
      return Unexpected(t);
    }
  }
  end_stack_.pop_back();
  if (ends.size() > 0) {
    std::vector<std::string> quoted;
    for (absl::string_view e : ends) quoted.push_back(absl::StrCat("'", e, "'"));
    return Fail(cur().line, absl::StrCat("unexpected end of template, expected ",
                                         absl::StrJoin(quoted, " or ")));
  }
  return body;
}

// Parses `%}` body up to one of `ends`; leaves the stream after the end tag's name.
absl::StatusOr<Body> Parser::ParseBody(Ends ends, std::string* matched) {
  SkipOp(":");
  RETURN_IF_ERROR(Expect(TokenType::kBlockEnd, "end of statement block"));
  if (!pending_.empty()) return pending_.front();
  ASSIGN_OR_RETURN(Body body, Subparse(ends));
  if (matched != nullptr) *matched = cur().text;
  Next();
  return body;
}

absl::Status Parser::ParseStatement(Body* body) {
  DepthGuard guard(&depth_);
  RETURN_IF_ERROR(Deeper());
  const Token& t = cur();
  if (t.type != TokenType::kName) return Fail(t.line, "tag name expected");
  const std::string tag = t.text;
  const int line = t.line;
  if (tag == "for") return ParseFor(body, line);
  if (tag == "if") return ParseIf(body, line);
  if (tag == "set") return ParseSet(body, line);
  if (tag == "macro") return ParseMacro(body, line);
  if (tag == "call") return ParseCallBlock(body, line);
  if (tag == "filter") return ParseFilterBlock(body, line);
  if (tag == "with") return ParseWith(body, line);
  if (tag == "print") {
    Next();
    bool first = true;
    while (cur().type != TokenType::kBlockEnd) {
      if (!first) RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      auto s = std::make_unique<Stmt>();
      s->kind = StmtKind::kPrint;
      s->line = line;
      ASSIGN_OR_RETURN(s->expr, ParseExpression());
      s->sum_terms = SumTerms(*s->expr);
      body->push_back(std::move(s));
    }
    return absl::OkStatus();
  }
  if (tag == "break" || tag == "continue") {
    if (loop_depth_ == 0) return Fail(line, absl::StrCat("'", tag, "' outside of a loop"));
    Next();
    auto s = std::make_unique<Stmt>();
    s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    s->line = line;
    body->push_back(std::move(s));
    return absl::OkStatus();
  }
  if (tag == "generation") {
    Next();
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kScope;
    s->line = line;
    ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, nullptr));
    body->push_back(std::move(s));
    return absl::OkStatus();
  }
  static constexpr absl::string_view kUnsupported[] = {
      "extends", "block", "include", "import", "from", "autoescape", "raw", "endraw"};
  for (absl::string_view u : kUnsupported) {
    if (tag == u) return Fail(line, absl::StrCat("unsupported tag '", tag, "'"));
  }
  for (auto it = end_stack_.rbegin(); it != end_stack_.rend(); ++it) {
    if (std::find(it->begin(), it->end(), tag) != it->end()) {
      return Fail(line, absl::StrCat("unexpected '", tag, "'"));
    }
  }
  if (absl::StartsWith(tag, "end") || tag == "elif" || tag == "else") {
    return Fail(line, absl::StrCat("unexpected '", tag, "'"));
  }
  return Fail(line, absl::StrCat("unknown tag '", tag, "'"));
}

absl::StatusOr<Target> Parser::ToTarget(const Expr& e) {
  Target t;
  if (e.kind == ExprKind::kName) {
    t.kind = Target::Kind::kName;
    t.name = e.name;
    return t;
  }
  if (e.kind == ExprKind::kTuple) {
    t.kind = Target::Kind::kTuple;
    for (const ExprPtr& item : e.a) {
      ASSIGN_OR_RETURN(Target sub, ToTarget(*item));
      t.items.push_back(std::move(sub));
    }
    return t;
  }
  return Fail(e.line, "can't assign to this expression");
}

bool Parser::NamesLoop(const Target& t) const {
  if (t.kind == Target::Kind::kName) return t.name == program_->loop_id;
  for (const Target& item : t.items) {
    if (NamesLoop(item)) return true;
  }
  return false;
}

absl::StatusOr<Target> Parser::ParseAssignTarget(bool with_namespace, Ends extra_end) {
  if (with_namespace && cur().type == TokenType::kName && peek().IsOperator(".")) {
    Target t;
    t.kind = Target::Kind::kNamespaceAttr;
    t.name = Intern(cur().text);
    Next();
    Next();
    ASSIGN_OR_RETURN(t.attr, ExpectName());
    return t;
  }
  ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true, true, extra_end, false));
  return ToTarget(*e);
}

absl::Status Parser::ParseFor(Body* body, int line) {
  Next();
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kFor;
  s->line = line;
  ASSIGN_OR_RETURN(s->target, ParseAssignTarget(false, {"in"}));
  if (NamesLoop(s->target)) {
    return Fail(line, "can't assign to special loop variable in for-loop target");
  }
  if (!SkipName("in")) {
    return Fail(cur().line, absl::StrCat("expected 'in', got '", Describe(cur()), "'"));
  }
  ASSIGN_OR_RETURN(s->expr, ParseTuple(false, false, {"recursive"}, false));
  const bool outer_soft = soft_;
  soft_ = false;
  if (SkipName("if")) {
    ASSIGN_OR_RETURN(s->test, ParseExpression());
  }
  if (SkipName("recursive")) s->recursive = true;
  ++loop_depth_;
  std::string matched;
  ASSIGN_OR_RETURN(s->body, ParseBody({"endfor", "else"}, &matched));
  --loop_depth_;
  if (matched == "else") {
    ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, nullptr));
  }
  soft_ = outer_soft;
  body->push_back(std::move(s));
  return absl::OkStatus();
}

absl::Status Parser::ParseIf(Body* body, int line) {
  Next();
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kIf;
  s->line = line;
  const bool outer_soft = soft_;
  soft_ = true;
  for (;;) {
    ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false, false, {}, false));
    std::string matched;
    ASSIGN_OR_RETURN(Body branch, ParseBody({"elif", "else", "endif"}, &matched));
    s->branches.emplace_back(std::move(cond), std::move(branch));
    if (matched == "elif") continue;
    if (matched == "else") {
      ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}, nullptr));
    }
    break;
  }
  soft_ = outer_soft;
  body->push_back(std::move(s));
  return absl::OkStatus();
}

absl::Status Parser::ParseSet(Body* body, int line) {
  Next();
  auto s = std::make_unique<Stmt>();
  s->line = line;
  ASSIGN_OR_RETURN(s->target, ParseAssignTarget(true, {}));
  if (loop_depth_ > 0 && NamesLoop(s->target)) {
    return Fail(line, "can't assign to special loop variable in for-loop target");
  }
  if (SkipOp("=")) {
    s->kind = StmtKind::kSet;
    ASSIGN_OR_RETURN(s->expr, ParseTuple(false, true, {}, false));
    body->push_back(std::move(s));
    return absl::OkStatus();
  }
  s->kind = StmtKind::kSetBlock;
  const bool outer_soft = soft_;
  soft_ = false;
  if (IsOp("|")) {
    ASSIGN_OR_RETURN(ExprPtr input, Make(ExprKind::kBlockValue, line, Operands()));
    ASSIGN_OR_RETURN(s->filter, ParseFilter(std::move(input), false));
  }
  ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, nullptr));
  soft_ = outer_soft;
  body->push_back(std::move(s));
  return absl::OkStatus();
}

absl::Status Parser::ParseSignature(MacroDef* def) {
  RETURN_IF_ERROR(ExpectOp("("));
  while (!IsOp(")")) {
    if (!def->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
    const int line = cur().line;
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    def->params.push_back(Intern(name));
    def->param_names.push_back(name);
    if (SkipOp("=")) {
      ASSIGN_OR_RETURN(ExprPtr d, ParseExpression());
      def->defaults.push_back(std::move(d));
    } else if (!def->defaults.empty()) {
      return Fail(line, "non-default argument follows default argument");
    }
  }
  Next();
  return absl::OkStatus();
}

absl::Status Parser::ParseMacro(Body* body, int line) {
  Next();
  auto def = std::make_shared<MacroDef>();
  ASSIGN_OR_RETURN(def->name, ExpectName());
  const int name_id = Intern(def->name);
  RETURN_IF_ERROR(ParseSignature(def.get()));
  const size_t refs_start = refs_.size();
  const bool outer_soft = soft_;
  const int outer_loops = loop_depth_;
  soft_ = false;
  loop_depth_ = 0;
  ASSIGN_OR_RETURN(def->body, ParseBody({"endmacro"}, nullptr));
  soft_ = outer_soft;
  loop_depth_ = outer_loops;
  for (size_t k = refs_start; k < refs_.size(); ++k) {
    def->catch_varargs |= refs_[k] == program_->varargs_id;
    def->catch_kwargs |= refs_[k] == program_->kwargs_id;
    def->uses_caller |= refs_[k] == program_->caller_id;
  }
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kMacro;
  s->line = line;
  s->target.name = name_id;
  s->macro = std::move(def);
  body->push_back(std::move(s));
  return absl::OkStatus();
}

absl::Status Parser::ParseCallBlock(Body* body, int line) {
  Next();
  auto def = std::make_shared<MacroDef>();
  def->name = "caller";
  if (IsOp("(")) RETURN_IF_ERROR(ParseSignature(def.get()));
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kCallBlock;
  s->line = line;
  ASSIGN_OR_RETURN(s->expr, ParseExpression());
  if (s->expr->kind != ExprKind::kCall) return Fail(line, "expected call");
  const size_t refs_start = refs_.size();
  const bool outer_soft = soft_;
  const int outer_loops = loop_depth_;
  soft_ = false;
  loop_depth_ = 0;
  ASSIGN_OR_RETURN(def->body, ParseBody({"endcall"}, nullptr));
  soft_ = outer_soft;
  loop_depth_ = outer_loops;
  for (size_t k = refs_start; k < refs_.size(); ++k) {
    def->catch_varargs |= refs_[k] == program_->varargs_id;
    def->catch_kwargs |= refs_[k] == program_->kwargs_id;
  }
  s->macro = std::move(def);
  body->push_back(std::move(s));
  return absl::OkStatus();
}

absl::Status Parser::ParseFilterBlock(Body* body, int line) {
  Next();
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kFilterBlock;
  s->line = line;
  const bool outer_soft = soft_;
  soft_ = false;
  ASSIGN_OR_RETURN(ExprPtr input, Make(ExprKind::kBlockValue, line, Operands()));
  ASSIGN_OR_RETURN(s->filter, ParseFilter(std::move(input), true));
  ASSIGN_OR_RETURN(s->body, ParseBody({"endfilter"}, nullptr));
  soft_ = outer_soft;
  body->push_back(std::move(s));
  return absl::OkStatus();
}

absl::Status Parser::ParseWith(Body* body, int line) {
  Next();
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kWith;
  s->line = line;
  while (cur().type != TokenType::kBlockEnd) {
    if (!s->with_targets.empty()) RETURN_IF_ERROR(ExpectOp(","));
    ASSIGN_OR_RETURN(Target t, ParseAssignTarget(false, {}));
    RETURN_IF_ERROR(ExpectOp("="));
    ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
    s->with_targets.push_back(std::move(t));
    s->with_values.push_back(std::move(v));
  }
  const bool outer_soft = soft_;
  soft_ = false;
  ASSIGN_OR_RETURN(s->body, ParseBody({"endwith"}, nullptr));
  soft_ = outer_soft;
  body->push_back(std::move(s));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Expressions

absl::StatusOr<ExprPtr> Parser::ParseExpression(bool with_condexpr) {
  if (with_condexpr) return ParseCondExpr();
  return ParseOr();
}

absl::StatusOr<ExprPtr> Parser::ParseCondExpr() {
  const int line = cur().line;
  const bool outer_soft = soft_;
  const size_t pending_mark = pending_.size();
  ASSIGN_OR_RETURN(ExprPtr expr1, ParseOr());
  while (IsName("if")) {
    // An inline if is a soft frame for its value too: unknown filters there fail when run.
    pending_.resize(pending_mark);
    Next();
    soft_ = true;
    ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
    ExprPtr expr3;
    if (SkipName("else")) {
      ASSIGN_OR_RETURN(expr3, ParseCondExpr());
    }
    soft_ = outer_soft;
    std::vector<ExprPtr> a;
    a.push_back(std::move(cond));
    a.push_back(std::move(expr1));
    a.push_back(std::move(expr3));
    ASSIGN_OR_RETURN(expr1, Make(ExprKind::kCondExpr, line, std::move(a)));
  }
  return expr1;
}

absl::StatusOr<ExprPtr> Parser::ParseOr() {
  const int line = cur().line;
  ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
  while (SkipName("or")) {
    ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
    ASSIGN_OR_RETURN(left, Make(ExprKind::kOr, line, Ptrs(std::move(left), std::move(right))));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseAnd() {
  const int line = cur().line;
  ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
  while (SkipName("and")) {
    ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
    ASSIGN_OR_RETURN(left, Make(ExprKind::kAnd, line, Ptrs(std::move(left), std::move(right))));
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseNot() {
  if (IsName("not")) {
    DepthGuard guard(&depth_);
    RETURN_IF_ERROR(Deeper());
    const int line = cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    return Make(ExprKind::kNot, line, Ptrs(std::move(operand)));
  }
  return ParseCompare();
}

absl::StatusOr<ExprPtr> Parser::ParseCompare() {
  const int line = cur().line;
  ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
  std::vector<ExprPtr> operands;
  std::vector<CmpOp> ops;
  operands.push_back(std::move(first));
  for (;;) {
    CmpOp op;
    if (IsOp("==")) {
      op = CmpOp::kEq;
    } else if (IsOp("!=")) {
      op = CmpOp::kNe;
    } else if (IsOp("<")) {
      op = CmpOp::kLt;
    } else if (IsOp("<=")) {
      op = CmpOp::kLe;
    } else if (IsOp(">")) {
      op = CmpOp::kGt;
    } else if (IsOp(">=")) {
      op = CmpOp::kGe;
    } else if (IsName("in")) {
      op = CmpOp::kIn;
    } else if (IsName("not") && peek().IsName("in")) {
      op = CmpOp::kNotIn;
      Next();
    } else {
      break;
    }
    Next();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
    operands.push_back(std::move(operand));
    ops.push_back(op);
  }
  if (ops.empty()) return std::move(operands[0]);
  ASSIGN_OR_RETURN(ExprPtr e, Make(ExprKind::kCompare, line, std::move(operands)));
  e->compare_ops.assign(ops.begin(), ops.end());
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseMath1() {
  const int line = cur().line;
  ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
  while (IsOp("+") || IsOp("-")) {
    const BinaryOp op = IsOp("+") ? BinaryOp::kAdd : BinaryOp::kSub;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
    ASSIGN_OR_RETURN(left, Make(ExprKind::kBinary, line, Ptrs(std::move(left), std::move(right))));
    left->op = op;
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseConcat() {
  const int line = cur().line;
  ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
  if (!IsOp("~")) return first;
  std::vector<ExprPtr> parts;
  parts.push_back(std::move(first));
  while (SkipOp("~")) {
    ASSIGN_OR_RETURN(ExprPtr part, ParseMath2());
    parts.push_back(std::move(part));
  }
  return Make(ExprKind::kConcat, line, std::move(parts));
}

absl::StatusOr<ExprPtr> Parser::ParseMath2() {
  const int line = cur().line;
  ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
  for (;;) {
    BinaryOp op;
    if (IsOp("*")) {
      op = BinaryOp::kMul;
    } else if (IsOp("/")) {
      op = BinaryOp::kDiv;
    } else if (IsOp("//")) {
      op = BinaryOp::kFloorDiv;
    } else if (IsOp("%")) {
      op = BinaryOp::kMod;
    } else {
      break;
    }
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
    ASSIGN_OR_RETURN(left, Make(ExprKind::kBinary, line, Ptrs(std::move(left), std::move(right))));
    left->op = op;
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParsePow() {
  const int line = cur().line;
  ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
  while (SkipOp("**")) {
    ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
    ASSIGN_OR_RETURN(left, Make(ExprKind::kBinary, line, Ptrs(std::move(left), std::move(right))));
    left->op = BinaryOp::kPow;
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseUnary(bool with_filter) {
  DepthGuard guard(&depth_);
  RETURN_IF_ERROR(Deeper());
  const int line = cur().line;
  ExprPtr node;
  if (IsOp("-") || IsOp("+")) {
    const ExprKind kind = IsOp("-") ? ExprKind::kNeg : ExprKind::kPos;
    Next();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
    ASSIGN_OR_RETURN(node, Make(kind, line, Ptrs(std::move(operand))));
  } else {
    ASSIGN_OR_RETURN(node, ParsePrimary());
  }
  ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
  if (with_filter) {
    ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
  }
  return node;
}

absl::StatusOr<ExprPtr> Parser::ParsePrimary() {
  DepthGuard guard(&depth_);
  RETURN_IF_ERROR(Deeper());
  const Token& t = cur();
  const int line = t.line;
  switch (t.type) {
    case TokenType::kName: {
      ExprPtr e;
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
        e = Const(Value::Bool(t.text == "true" || t.text == "True"), line);
      } else if (t.text == "none" || t.text == "None") {
        e = Const(Value::None(), line);
      } else {
        e = std::make_unique<Expr>();
        e->kind = ExprKind::kName;
        e->line = line;
        e->name = Intern(t.text);
        e->str = t.text;
        refs_.push_back(e->name);
      }
      Next();
      return e;
    }
    case TokenType::kString: {
      std::string s = t.text;
      Next();
      while (cur().type == TokenType::kString) {
        s += cur().text;
        Next();
      }
      return Const(Value::String(std::move(s)), line);
    }
    case TokenType::kInteger: {
      ExprPtr e = Const(Value::Int(t.integer_value), line);
      Next();
      return e;
    }
    case TokenType::kFloat: {
      ExprPtr e = Const(Value::Float(t.float_value), line);
      Next();
      return e;
    }
    case TokenType::kOperator:
      if (t.text == "(") {
        Next();
        ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, true));
        RETURN_IF_ERROR(ExpectOp(")"));
        return e;
      }
      if (t.text == "[") return ParseList();
      if (t.text == "{") return ParseDict();
      break;
    default:
      break;
  }
  return Unexpected(t);
}

bool Parser::IsTupleEnd(Ends extra_end) const {
  const Token& t = cur();
  if (t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd || t.IsOperator(")")) {
    return true;
  }
  if (t.type == TokenType::kName) {
    for (absl::string_view e : extra_end) {
      if (t.text == e) return true;
    }
  }
  return false;
}

absl::StatusOr<ExprPtr> Parser::ParseTuple(bool simplified, bool with_condexpr, Ends extra_end,
                                           bool explicit_parentheses) {
  const int line = cur().line;
  std::vector<ExprPtr> args;
  bool is_tuple = false;
  for (;;) {
    if (!args.empty()) RETURN_IF_ERROR(ExpectOp(","));
    if (IsTupleEnd(extra_end)) break;
    ExprPtr item;
    if (simplified) {
      ASSIGN_OR_RETURN(item, ParsePrimary());
    } else {
      ASSIGN_OR_RETURN(item, ParseExpression(with_condexpr));
    }
    args.push_back(std::move(item));
    if (IsOp(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parentheses) {
      return Fail(cur().line, absl::StrCat("expected an expression, got '", Describe(cur()), "'"));
    }
  }
  return Make(ExprKind::kTuple, line, std::move(args));
}

absl::StatusOr<ExprPtr> Parser::ParseList() {
  const int line = cur().line;
  Next();
  std::vector<ExprPtr> items;
  while (!IsOp("]")) {
    if (!items.empty()) RETURN_IF_ERROR(ExpectOp(","));
    if (IsOp("]")) break;
    ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
    items.push_back(std::move(item));
  }
  RETURN_IF_ERROR(ExpectOp("]"));
  return Make(ExprKind::kList, line, std::move(items));
}

absl::StatusOr<ExprPtr> Parser::ParseDict() {
  const int line = cur().line;
  Next();
  std::vector<ExprPtr> items;
  while (!IsOp("}")) {
    if (!items.empty()) RETURN_IF_ERROR(ExpectOp(","));
    if (IsOp("}")) break;
    ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
    RETURN_IF_ERROR(ExpectOp(":"));
    ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
    items.push_back(std::move(key));
    items.push_back(std::move(value));
  }
  RETURN_IF_ERROR(ExpectOp("}"));
  return Make(ExprKind::kDict, line, std::move(items));
}

absl::StatusOr<ExprPtr> Parser::ParsePostfix(ExprPtr node) {
  for (;;) {
    if (IsOp(".") || IsOp("[")) {
      ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
    } else if (IsOp("(")) {
      const int line = cur().line;
      ASSIGN_OR_RETURN(ExprPtr call, Make(ExprKind::kCall, line, Ptrs(std::move(node))));
      RETURN_IF_ERROR(ParseCallArgs(&call->call));
      node = std::move(call);
    } else {
      return node;
    }
  }
}

absl::StatusOr<ExprPtr> Parser::ParseFilterExpr(ExprPtr node) {
  for (;;) {
    if (IsOp("|")) {
      ASSIGN_OR_RETURN(node, ParseFilter(std::move(node), false));
    } else if (IsName("is")) {
      ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
    } else if (IsOp("(")) {
      const int line = cur().line;
      ASSIGN_OR_RETURN(ExprPtr call, Make(ExprKind::kCall, line, Ptrs(std::move(node))));
      RETURN_IF_ERROR(ParseCallArgs(&call->call));
      node = std::move(call);
    } else {
      return node;
    }
  }
}

absl::StatusOr<ExprPtr> Parser::ParseSubscript(ExprPtr node) {
  const Token t = cur();
  Next();
  if (t.text == ".") {
    const Token attr = cur();
    Next();
    if (attr.type == TokenType::kName) {
      ASSIGN_OR_RETURN(ExprPtr e, Make(ExprKind::kGetAttr, t.line, Ptrs(std::move(node))));
      e->dict_method = DictAttributeIsSpecial(attr.text);
      e->str_method = FindStrMethod(attr.text);
      if (e->a[0]->kind == ExprKind::kName) e->name = e->a[0]->name;
      if (e->a[0]->kind == ExprKind::kName && e->a[0]->name == program_->loop_id) {
        e->loop_attr = LoopAttr::kOther;
        for (int k = 1; k < static_cast<int>(LoopAttr::kOther); ++k) {
          if (attr.text == kLoopAttrNames[k]) e->loop_attr = static_cast<LoopAttr>(k);
        }
      }
      e->str = attr.text;
      return e;
    }
    if (attr.type != TokenType::kInteger) return Fail(attr.line, "expected name or number");
    return Make(ExprKind::kGetItem, t.line,
                Ptrs(std::move(node), Const(Value::Int(attr.integer_value), attr.line)));
  }
  std::vector<ExprPtr> args;
  while (!IsOp("]")) {
    if (!args.empty()) RETURN_IF_ERROR(ExpectOp(","));
    ASSIGN_OR_RETURN(ExprPtr arg, ParseSubscribed());
    args.push_back(std::move(arg));
  }
  RETURN_IF_ERROR(ExpectOp("]"));
  if (args.size() == 1 && args[0]->kind == ExprKind::kSlice) {
    ExprPtr slice = std::move(args[0]);
    slice->a[0] = std::move(node);
    slice->depth = std::max(slice->depth, slice->a[0]->depth + 1);
    if (slice->depth > kMaxParseDepth) return Fail(t.line, "an expression nests too deeply");
    return slice;
  }
  ExprPtr key;
  if (args.size() == 1) {
    key = std::move(args[0]);
  } else {
    for (const ExprPtr& a : args) {
      if (a->kind == ExprKind::kSlice) {
        return Fail(t.line, "a subscript with several slices is not supported");
      }
    }
    ASSIGN_OR_RETURN(key, Make(ExprKind::kTuple, t.line, std::move(args)));
  }
  return Make(ExprKind::kGetItem, t.line, Ptrs(std::move(node), std::move(key)));
}

absl::StatusOr<ExprPtr> Parser::ParseSubscribed() {
  const int line = cur().line;
  std::vector<ExprPtr> a(4);
  if (!IsOp(":")) {
    ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
    if (!IsOp(":")) return e;
    a[1] = std::move(e);
  }
  Next();  // the first ':'
  if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
    ASSIGN_OR_RETURN(a[2], ParseExpression());
  }
  if (SkipOp(":")) {
    if (!IsOp("]") && !IsOp(",")) {
      ASSIGN_OR_RETURN(a[3], ParseExpression());
    }
  }
  return Make(ExprKind::kSlice, line, std::move(a));
}

absl::Status Parser::ParseCallArgs(CallSpec* call) {
  const int line = cur().line;
  RETURN_IF_ERROR(ExpectOp("("));
  auto ensure = [&](bool ok) {
    return ok ? absl::OkStatus() : Fail(line, "invalid syntax for function call expression");
  };
  bool require_comma = false;
  while (!IsOp(")")) {
    if (require_comma) {
      RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
    }
    if (IsOp("*")) {
      RETURN_IF_ERROR(ensure(call->dyn_args == nullptr && call->dyn_kwargs == nullptr));
      Next();
      ASSIGN_OR_RETURN(call->dyn_args, ParseExpression());
    } else if (IsOp("**")) {
      RETURN_IF_ERROR(ensure(call->dyn_kwargs == nullptr));
      Next();
      ASSIGN_OR_RETURN(call->dyn_kwargs, ParseExpression());
    } else if (cur().type == TokenType::kName && peek().IsOperator("=")) {
      RETURN_IF_ERROR(ensure(call->dyn_kwargs == nullptr));
      std::string key = cur().text;
      Next();
      Next();
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      call->kwarg_keys.push_back(Value::String(key));
      call->kwargs.emplace_back(std::move(key), std::move(value));
    } else {
      RETURN_IF_ERROR(
          ensure(call->dyn_args == nullptr && call->dyn_kwargs == nullptr && call->kwargs.empty()));
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      call->args.push_back(std::move(value));
    }
    require_comma = true;
  }
  Next();
  return absl::OkStatus();
}

absl::StatusOr<ExprPtr> Parser::ParseFilter(ExprPtr node, bool start_inline) {
  while (IsOp("|") || start_inline) {
    if (!start_inline) Next();
    start_inline = false;
    const int line = cur().line;
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (SkipOp(".")) {
      ASSIGN_OR_RETURN(std::string part, ExpectName());
      absl::StrAppend(&name, ".", part);
    }
    ASSIGN_OR_RETURN(ExprPtr f, Make(ExprKind::kFilter, line, Ptrs(std::move(node))));
    if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(&f->call));
    f->filter = FindFilter(name);
    if (f->filter == nullptr) {
      if (Jinja2Filters().contains(name)) {
        return Fail(line, absl::StrCat("unsupported filter '", name, "'"));
      }
      if (!soft_) pending_.push_back(Fail(line, absl::StrCat("unknown filter '", name, "'")));
      f->known = false;
    }
    f->length_filter = (name == "length" || name == "count") && f->call.args.empty() &&
                       f->call.kwargs.empty() && f->call.dyn_args == nullptr &&
                       f->call.dyn_kwargs == nullptr;
    f->str = std::move(name);
    node = std::move(f);
  }
  return node;
}

absl::StatusOr<ExprPtr> Parser::ParseTest(ExprPtr node) {
  const int line = cur().line;
  Next();  // is
  const bool negated = SkipName("not");
  ASSIGN_OR_RETURN(std::string name, ExpectName());
  while (SkipOp(".")) {
    ASSIGN_OR_RETURN(std::string part, ExpectName());
    absl::StrAppend(&name, ".", part);
  }
  ASSIGN_OR_RETURN(ExprPtr t, Make(ExprKind::kTest, line, Ptrs(std::move(node))));
  const Token& c = cur();
  if (c.IsOperator("(")) {
    RETURN_IF_ERROR(ParseCallArgs(&t->call));
  } else if ((c.type == TokenType::kName || c.type == TokenType::kString ||
              c.type == TokenType::kInteger || c.type == TokenType::kFloat || c.IsOperator("[") ||
              c.IsOperator("{")) &&
             !c.IsName("else") && !c.IsName("or") && !c.IsName("and")) {
    if (c.IsName("is")) return Fail(c.line, "you cannot chain multiple tests with is");
    ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
    ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
    t->call.args.push_back(std::move(arg));
  }
  if (!HasTest(name)) {
    if (Jinja2Tests().contains(name)) {
      return Fail(line, absl::StrCat("unsupported test '", name, "'"));
    }
    if (!soft_) pending_.push_back(Fail(line, absl::StrCat("unknown test '", name, "'")));
    t->known = false;
  }
  const bool no_args = t->call.args.empty() && t->call.kwargs.empty() &&
                       t->call.dyn_args == nullptr && t->call.dyn_kwargs == nullptr;
  if (no_args) {
    if (name == "defined") t->fast_test = FastTest::kDefined;
    if (name == "undefined") t->fast_test = FastTest::kUndefined;
    if (name == "none") t->fast_test = FastTest::kIsNone;
    if (name == "string") t->fast_test = FastTest::kString;
    if (name == "true") t->fast_test = FastTest::kTrue;
    if (name == "false") t->fast_test = FastTest::kFalse;
  }
  t->str = std::move(name);
  if (negated) return Make(ExprKind::kNot, line, Ptrs(std::move(t)));
  return t;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Program>> ParseProgram(absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  auto program = std::make_unique<Program>();
  Parser parser(std::move(tokens), program.get());
  RETURN_IF_ERROR(parser.Run());
  return program;
}

}  // namespace carpool::text::jinja
