// Tenants: API keys with quotas, from `carpool-router --tenants FILE` (a carpool.v1.TenantsFile
// in protobuf text format; docs/cluster.md has an example).
//
// Immutable after loading; safe to share between threads.
#ifndef CARPOOL_ROUTER_TENANTS_H_
#define CARPOOL_ROUTER_TENANTS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/messages.h"

namespace carpool::router {

struct TenantConfig {
  std::string key;
  std::string name;
  int max_concurrent = 0;          // 0: no limit
  int64_t tokens_per_minute = 0;   // 0: no limit
  int64_t burst_tokens = 0;        // bucket size; tokens_per_minute when 0 in the file
  Priority max_priority = Priority::kDefault;
  // Batch jobs' requests draw on a bucket of their own at this rate (a minute of it at most),
  // never on tokens_per_minute's. 0: no limit.
  int64_t batch_tokens_per_minute = 0;
  uint64_t cache_salt = 0;         // from the name; never 0 (0 is the anonymous tenant's)
};

class TenantTable {
 public:
  // No tenants: every request is anonymous and unlimited.
  TenantTable() = default;

  // Parses a TenantsFile. INVALID_ARGUMENT naming the problem: a syntax error, an empty or
  // duplicate key or name, a negative limit.
  static absl::StatusOr<TenantTable> Parse(std::string_view textproto);
  // Parse() of the file's contents; NOT_FOUND when it cannot be read.
  static absl::StatusOr<TenantTable> Load(const std::string& path);

  // True when a tenants file was given: requests must then carry a known key.
  bool enabled() const { return !tenants_.empty(); }
  int size() const { return static_cast<int>(tenants_.size()); }
  const TenantConfig& at(int index) const { return tenants_[index]; }

  // The index of the tenant whose key is `key`, or -1. Every tenant's key is compared in full
  // with ConstantTimeEquals, so the time taken does not depend on how much of a key matched.
  int Authenticate(std::string_view key) const;

 private:
  std::vector<TenantConfig> tenants_;
};

// API keys from a file: one per line; blank lines and lines starting with '#' are skipped,
// surrounding whitespace trimmed. NOT_FOUND when it cannot be read, INVALID_ARGUMENT when it
// holds no key.
absl::StatusOr<std::vector<std::string>> LoadKeyFile(const std::string& path);

// a == b, in time that depends only on the lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// True when a request of class `requested` is allowed for a tenant whose highest class is
// `highest` (interactive > default > batch).
bool PriorityAllowed(Priority requested, Priority highest);

// The class a request of a tenant whose highest class is `highest` runs at: `requested`, except
// that a request naming no class (PRIORITY_DEFAULT, what a client that knows no classes sends,
// such as a stock OpenAI client through the HTTP gateway) from a tenant whose highest class is
// below default runs at that highest class instead of being refused.
Priority ResolvePriority(Priority requested, Priority highest);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_TENANTS_H_
