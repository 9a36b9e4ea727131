// Why a generation ended, as the engine decides it and every process reports it.
#ifndef CARPOOL_COMMON_FINISH_REASON_H_
#define CARPOOL_COMMON_FINISH_REASON_H_

namespace carpool {

enum class FinishReason { kNone, kLength, kStop, kAborted };

// The wire and API name: "length", "stop", "abort"; "" for kNone.
const char* FinishReasonName(FinishReason reason);

}  // namespace carpool

#endif  // CARPOOL_COMMON_FINISH_REASON_H_
