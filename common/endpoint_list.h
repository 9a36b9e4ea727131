// Endpoint lists as carpool's flags and options take them: "tcp://a:1, tcp://b:2".
#ifndef CARPOOL_COMMON_ENDPOINT_LIST_H_
#define CARPOOL_COMMON_ENDPOINT_LIST_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace carpool {

// Splits `list` at every comma and strips ASCII white space around each entry. Empty entries
// stay in the result, as empty strings (",a" gives {"", "a"}; "" gives {""}), so that callers
// can refuse them with a message in their own words (worker --router, ClientOptions).
std::vector<std::string> SplitEndpointList(absl::string_view list);

}  // namespace carpool

#endif  // CARPOOL_COMMON_ENDPOINT_LIST_H_
