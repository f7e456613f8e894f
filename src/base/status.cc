#include "refit/status.h"

namespace refit {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_unique<State>(State{code, std::move(message)});
  }
}

Status::Status(const Status& other)
    : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) {
    state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
  }
  return *this;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code()));
  out += ": ";
  out += message();
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return Status();
  std::string msg(context);
  msg += ": ";
  msg += message();
  return Status(code(), std::move(msg));
}

#define REFIT_DEFINE_ERROR_(Name, Code) \
  Status Name(std::string message) {   \
    return Status(StatusCode::Code, std::move(message)); \
  }
REFIT_DEFINE_ERROR_(CancelledError, kCancelled)
REFIT_DEFINE_ERROR_(UnknownError, kUnknown)
REFIT_DEFINE_ERROR_(InvalidArgumentError, kInvalidArgument)
REFIT_DEFINE_ERROR_(DeadlineExceededError, kDeadlineExceeded)
REFIT_DEFINE_ERROR_(NotFoundError, kNotFound)
REFIT_DEFINE_ERROR_(AlreadyExistsError, kAlreadyExists)
REFIT_DEFINE_ERROR_(PermissionDeniedError, kPermissionDenied)
REFIT_DEFINE_ERROR_(ResourceExhaustedError, kResourceExhausted)
REFIT_DEFINE_ERROR_(FailedPreconditionError, kFailedPrecondition)
REFIT_DEFINE_ERROR_(AbortedError, kAborted)
REFIT_DEFINE_ERROR_(OutOfRangeError, kOutOfRange)
REFIT_DEFINE_ERROR_(UnimplementedError, kUnimplemented)
REFIT_DEFINE_ERROR_(InternalError, kInternal)
REFIT_DEFINE_ERROR_(UnavailableError, kUnavailable)
REFIT_DEFINE_ERROR_(DataLossError, kDataLoss)
REFIT_DEFINE_ERROR_(UnauthenticatedError, kUnauthenticated)
#undef REFIT_DEFINE_ERROR_

}  // namespace refit
