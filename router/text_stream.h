// The HTTP gateway's text check for one request: the router's text bytes in, valid UTF-8 out.
// (The router detokenizes and applies stop strings: router/stop_strings.h.)
//
//   Utf8Stream    bytes -> valid UTF-8. Invalid bytes become U+FFFD; an incomplete sequence at the
//                 end is held until more bytes (or Flush) decide it. The output does not depend on
//                 how the input was split, so a streamed answer equals the non-streamed one.
//
// Thread-compatible.
#ifndef CARPOOL_ROUTER_TEXT_STREAM_H_
#define CARPOOL_ROUTER_TEXT_STREAM_H_

#include <string>
#include <string_view>

namespace carpool::router {

class Utf8Stream {
 public:
  // The valid UTF-8 that `bytes` completes.
  std::string Feed(std::string_view bytes);
  // What is held, as U+FFFD (it can no longer complete).
  std::string Flush();

 private:
  std::string held_;
};

// `text` as valid UTF-8 (Utf8Stream's Feed + Flush).
std::string SanitizeUtf8(std::string_view text);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_TEXT_STREAM_H_
