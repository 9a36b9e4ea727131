// Child processes for tests that run carpool's binaries for real.
#ifndef CARPOOL_TESTS_TESTING_SUBPROCESS_H_
#define CARPOOL_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace carpool::testing {

// Starts `argv` with stdout and stderr appended to `log_path`. The destructor sends SIGTERM,
// waits up to 5 s, then SIGKILLs: a test never leaves a process behind.
class Subprocess {
 public:
  Subprocess(std::vector<std::string> argv, std::string log_path);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  void Signal(int signo);
  // Sends SIGTERM and waits up to timeout_ms; returns the exit code (-signal if killed by one,
  // -1000 on timeout, after which the process is SIGKILLed).
  int Terminate(int timeout_ms = 5000);
  // Waits for exit up to timeout_ms; same return convention as Terminate.
  int Wait(int timeout_ms);
  // The log so far.
  std::string Log() const;
  // Polls the log until it contains `text` (true) or timeout_ms passes (false).
  bool WaitForLog(const std::string& text, int timeout_ms) const;

 private:
  pid_t pid_ = -1;
  int exit_code_ = 0;
  bool exited_ = false;
  std::string log_path_;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();

// The endpoints a carpool-router logs once bound ("frontend tcp://..., backend tcp://...").
struct RouterEndpoints {
  std::string frontend;
  std::string backend;
};
// Waits up to timeout_ms for `router` to log its endpoints and returns them; false when it does
// not (the router's log then says why).
bool WaitForRouterEndpoints(const Subprocess& router, RouterEndpoints* out,
                            int timeout_ms = 10000);

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_SUBPROCESS_H_
