#include "text/jinja/template.h"

#include <utility>

#include "common/status.h"
#include "text/jinja/ast.h"
#include "text/jinja/evaluator.h"
#include "text/jinja/parser.h"

namespace carpool::text::jinja {

struct Template::Impl {
  std::unique_ptr<Program> program;
};

Template::Template(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Template::~Template() = default;

absl::StatusOr<std::unique_ptr<Template>> Template::Parse(absl::string_view source) {
  auto impl = std::make_unique<Impl>();
  ASSIGN_OR_RETURN(impl->program, ParseProgram(source));
  return std::unique_ptr<Template>(new Template(std::move(impl)));
}

absl::StatusOr<std::string> Template::Render(const Value& context,
                                             const RenderOptions& options) const {
  return Evaluate(*impl_->program, context, options);
}

}  // namespace carpool::text::jinja
