#include "router/tenants.h"

#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/codec.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "proto/carpool.pb.h"

namespace carpool::router {
namespace {

namespace pb = ::carpool::v1;

// Collects TextFormat's parse errors instead of logging them.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat("line ", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// FNV-1a 64: stable across processes and builds, so a restarted router salts alike.
uint64_t StableHash(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}


}  // namespace

absl::StatusOr<TenantTable> TenantTable::Parse(std::string_view textproto) {
  pb::TenantsFile file;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(textproto), &file)) {
    return absl::InvalidArgumentError(absl::StrCat("tenants file: ", errors.first()));
  }
  TenantTable table;
  absl::flat_hash_set<std::string> keys, names;
  for (int i = 0; i < file.tenant_size(); ++i) {
    const pb::Tenant& t = file.tenant(i);
    const std::string where = absl::StrCat("tenants file: tenant ", i + 1, " (", t.name(), ")");
    if (t.key().empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": key is empty"));
    if (t.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": name is empty"));
    }
    if (!keys.insert(t.key()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": key is used twice"));
    }
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": name is used twice"));
    }
    if (t.max_concurrent() < 0 || t.tokens_per_minute() < 0 || t.burst_tokens() < 0 ||
        t.batch_tokens_per_minute() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": limits must be >= 0"));
    }
    TenantConfig c;
    c.key = t.key();
    c.name = t.name();
    c.max_concurrent = t.max_concurrent();
    c.tokens_per_minute = t.tokens_per_minute();
    c.burst_tokens = t.burst_tokens() > 0 ? t.burst_tokens() : t.tokens_per_minute();
    c.max_priority = PriorityFromWire(t.max_priority());
    c.batch_tokens_per_minute = t.batch_tokens_per_minute();
    c.cache_salt = StableHash(absl::StrCat("carpool-tenant:", t.name()));
    if (c.cache_salt == 0) c.cache_salt = 1;
    table.tenants_.push_back(std::move(c));
  }
  return table;
}

absl::StatusOr<TenantTable> TenantTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the tenants file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str());
}

int TenantTable::Authenticate(std::string_view key) const {
  int found = -1;
  for (int i = 0; i < size(); ++i) {
    // No early exit: every key is compared, whether or not one matched already.
    const bool match = ConstantTimeEquals(tenants_[i].key, key);
    found = match ? i : found;
  }
  return found;
}

absl::StatusOr<std::vector<std::string>> LoadKeyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the key file ", path));
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    const absl::string_view key = absl::StripAsciiWhitespace(line);
    if (!key.empty() && key[0] != '#') keys.emplace_back(key);
  }
  if (keys.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no key"));
  return keys;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | (x ^ y);
  }
  return diff == 0;
}

bool PriorityAllowed(Priority requested, Priority highest) {
  // Lower enum value = higher class (kInteractive 0, kDefault 1, kBatch 2).
  return static_cast<int>(requested) >= static_cast<int>(highest);
}

Priority ResolvePriority(Priority requested, Priority highest) {
  if (requested == Priority::kDefault && !PriorityAllowed(requested, highest)) return highest;
  return requested;
}

}  // namespace carpool::router
