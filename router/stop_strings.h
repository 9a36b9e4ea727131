// Stop strings on a generate request's output text (GenerateInput::stop): text in, the text
// safe to send out. Text that could still be the start of a stop string is held back until it
// no longer can; when a stop string completes, the text ends at it (the stop string removed, or
// kept with include_stop), and everything after is dropped. The output does not depend on how
// the input was split, so a streamed answer equals the whole one.
//
// Thread-compatible.
#ifndef CARPOOL_ROUTER_STOP_STRINGS_H_
#define CARPOOL_ROUTER_STOP_STRINGS_H_

#include <string>
#include <string_view>
#include <vector>

namespace carpool::router {

class StopStrings {
 public:
  // Empty strings in `stops` are ignored.
  StopStrings(std::vector<std::string> stops, bool include_stop);

  bool empty() const { return stops_.empty(); }
  // Text now safe to emit. The stop string that starts earliest wins (the first listed on a
  // tie). After it: "" always.
  std::string Feed(std::string_view text);
  // The text held back (no stop string can complete any more); "" once stopped.
  std::string Flush();
  bool stopped() const { return stopped_; }
  // The stop string that ended the text; "" while none.
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_STOP_STRINGS_H_
