// `carpool bench serve`: a serving benchmark against a carpool router (docs/client.md).
#ifndef CARPOOL_CLIENT_BENCH_SERVE_COMMAND_H_
#define CARPOOL_CLIENT_BENCH_SERVE_COMMAND_H_

namespace carpool::client {

// Entry point of `carpool bench`: argv[first] names the benchmark ("serve"), the rest are its
// flags. Returns the process exit code: 0 when the run completed at least one request; 1 when
// the router did not answer or every request failed; 2 for bad flags.
int RunBench(int argc, char** argv, int first);

}  // namespace carpool::client

#endif  // CARPOOL_CLIENT_BENCH_SERVE_COMMAND_H_
