#include "common/finish_reason.h"

namespace carpool {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kAborted:
      return "abort";
    case FinishReason::kNone:
      break;
  }
  return "";
}

}  // namespace carpool
