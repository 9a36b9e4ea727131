#include "client/chat_template_command.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "text/chat_template.h"

namespace carpool::client {
namespace {

constexpr char kName[] = "carpool chat-template";

// The whole file, or NOT_FOUND naming it.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A file of the model folder that may be absent: "" then.
absl::StatusOr<std::string> ReadOptional(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::string();
  return ReadFile(path.string());
}

absl::StatusOr<std::shared_ptr<const text::ChatTemplate>> LoadTemplate(
    const std::string& model, const std::string& chat_template_flag) {
  absl::StatusOr<text::ChatTemplateOptions> options =
      text::ChatTemplateOptionsFromFlag(chat_template_flag);
  if (!options.ok()) return options.status();
  if (absl::StartsWith(model, "synthetic:")) {
    if (options->override_source.empty() && options->override_name.empty()) {
      return text::ChatTemplate::Builtin();
    }
    return text::ChatTemplate::FromModelFiles("", "", *options);
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(model, ec)) {
    return absl::NotFoundError(absl::StrCat(
        "--model ", model, " is not a folder (a Hugging Face model folder or synthetic:<preset>)"));
  }
  const std::filesystem::path dir(model);
  absl::StatusOr<std::string> config = ReadOptional(dir / "tokenizer_config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<std::string> jinja = ReadOptional(dir / "chat_template.jinja");
  if (!jinja.ok()) return jinja.status();
  return text::ChatTemplate::FromModelFiles(*config, *jinja, *options);
}

struct Flags {
  std::string model;
  std::string messages_file;
  std::string tools_file;
  bool generation_prompt = true;
  std::string kwargs;
  std::string chat_template;
  bool help = false;
};

}  // namespace

int RunChatTemplate(int argc, char** argv, int first, std::ostream& out, std::ostream& err) {
  Flags f;
  FlagParser parser;
  parser.AddString("model", &f.model,
                   "a Hugging Face model folder (tokenizer_config.json, chat_template.jinja) or "
                   "synthetic:<preset> (the built-in template); required");
  parser.AddString("messages-file", &f.messages_file,
                   "a JSON file holding the OpenAI messages array; required");
  parser.AddString("tools-file", &f.tools_file, "a JSON file holding the OpenAI tools array");
  parser.AddBool("generation-prompt", &f.generation_prompt,
                 "open the assistant's turn at the end (add_generation_prompt); "
                 "--no-generation-prompt: the conversation as it stands");
  parser.AddString("kwargs", &f.kwargs,
                   "a JSON object whose keys become template variables (chat_template_kwargs)");
  parser.AddString("chat-template", &f.chat_template,
                   "a template file to use instead of the model's, or the name of one of the "
                   "model's named templates");
  parser.AddBool("help", &f.help, "show this help");
  if (absl::Status s = parser.Parse(argc, argv, first); !s.ok()) {
    err << kName << ": " << s.message() << "\n";
    return 2;
  }
  if (f.help) {
    out << "usage: " << kName
        << " --model DIR --messages-file F.json [--tools-file T.json] [--no-generation-prompt] "
           "[--kwargs JSON] [--chat-template FILE|NAME]\n"
           "  prints the prompt the model's chat template makes of the conversation, exactly\n"
        << parser.Help();
    return 0;
  }
  if (!parser.positionals().empty()) {
    err << kName << ": unexpected argument '" << parser.positionals()[0] << "'\n";
    return 2;
  }
  if (f.model.empty() || f.messages_file.empty()) {
    err << kName << ": --model and --messages-file are required\n";
    return 2;
  }
  text::ChatRequest request;
  request.add_generation_prompt = f.generation_prompt;
  request.chat_template_kwargs_json = f.kwargs;
  absl::StatusOr<std::string> messages = ReadFile(f.messages_file);
  if (!messages.ok()) {
    err << kName << ": --messages-file: " << messages.status().message() << "\n";
    return 2;
  }
  request.messages_json = std::move(*messages);
  if (!f.tools_file.empty()) {
    absl::StatusOr<std::string> tools = ReadFile(f.tools_file);
    if (!tools.ok()) {
      err << kName << ": --tools-file: " << tools.status().message() << "\n";
      return 2;
    }
    request.tools_json = std::move(*tools);
  }
  absl::StatusOr<std::shared_ptr<const text::ChatTemplate>> chat_template =
      LoadTemplate(f.model, f.chat_template);
  if (!chat_template.ok()) {
    err << kName << ": " << chat_template.status().message();
    if (chat_template.status().message() == "the model has no chat template") {
      err << " (its tokenizer_config.json has no chat_template and the folder no "
             "chat_template.jinja): give one with --chat-template FILE";
    }
    err << "\n";
    return 1;
  }
  absl::StatusOr<std::string> prompt = (*chat_template)->Render(request);
  if (!prompt.ok()) {
    err << kName << ": " << prompt.status().message() << "\n";
    return 1;
  }
  out << *prompt;
  out.flush();
  return 0;
}

int RunChatTemplate(int argc, char** argv, int first) {
  return RunChatTemplate(argc, argv, first, std::cout, std::cerr);
}

}  // namespace carpool::client
