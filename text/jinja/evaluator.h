// Renders a parsed Program over a context: scopes as Jinja2 has them (a for body, a macro, a
// call block's body, a block set and a with block are scopes; `if` is not; each loop iteration
// starts from a fresh scope), the globals range/namespace/dict/joiner/cycler/raise_exception/
// strftime_now, the loop object, macros and call blocks, and every Limits bound (it implements
// Budget for the filters it calls).
#ifndef CARPOOL_TEXT_JINJA_EVALUATOR_H_
#define CARPOOL_TEXT_JINJA_EVALUATOR_H_

#include <string>

#include "absl/status/statusor.h"
#include "text/jinja/ast.h"
#include "text/jinja/template.h"
#include "text/jinja/value.h"

namespace carpool::text::jinja {

// The deepest nesting of evaluation (expressions, statements and macro calls together) one
// render may reach: it keeps the C++ stack bounded whatever the template does.
inline constexpr int kMaxEvalDepth = 1000;

// Renders `program` over `context` (a dict; other kinds are INVALID_ARGUMENT).
absl::StatusOr<std::string> Evaluate(const Program& program, const Value& context,
                                     const RenderOptions& options);

}  // namespace carpool::text::jinja

#endif  // CARPOOL_TEXT_JINJA_EVALUATOR_H_
