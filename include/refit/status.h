// Status and Result<T>: how every refit function reports failure.
//
// A Status is OK or carries a code from Abseil's canonical set plus a
// message that says what went wrong and what to do about it. An OK Status
// holds no allocation, so returning it costs nothing. The codes double as a
// retry policy:
//   kUnavailable        retry the call (transient I/O or network trouble)
//   kAborted            retry the whole transaction (a version, an apply)
//   kFailedPrecondition fix the state first (wrong base, partial apply)
//   kDataLoss           the input is corrupt or truncated; do not retry it
//   kInvalidArgument    the caller passed something malformed
//
// Result<T> holds either a T or a non-OK Status, with an interface close to
// C++23's std::expected. Both types are cheap to move and not thread-safe.
#ifndef REFIT_STATUS_H_
#define REFIT_STATUS_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace refit {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status Ok() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  std::string_view message() const {
    return state_ ? std::string_view(state_->message) : std::string_view();
  }
  // "CODE_NAME: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "context: message"; OK stays OK.
  Status WithContext(std::string_view context) const;

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<State> state_;
};

inline bool operator==(const Status& a, const Status& b) {
  return a.code() == b.code() && a.message() == b.message();
}

Status CancelledError(std::string message);
Status UnknownError(std::string message);
Status InvalidArgumentError(std::string message);
Status DeadlineExceededError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status PermissionDeniedError(std::string message);
Status ResourceExhaustedError(std::string message);
Status FailedPreconditionError(std::string message);
Status AbortedError(std::string message);
Status OutOfRangeError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status UnavailableError(std::string message);
Status DataLossError(std::string message);
Status UnauthenticatedError(std::string message);

// Holds a T or a non-OK Status. Constructing a Result from an OK Status is a
// programming error and yields kInternal.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(const T& value) : v_(value) {}  // NOLINT(runtime/explicit)
  Result(T&& value) : v_(std::move(value)) {}  // NOLINT(runtime/explicit)
  Result(Status status)  // NOLINT(runtime/explicit)
      : v_(status.ok() ? InternalError("Result built from an OK status")
                       : std::move(status)) {}

  bool ok() const { return v_.index() == 0; }
  bool has_value() const { return ok(); }
  explicit operator bool() const { return ok(); }

  // The error; OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<1>(v_); }
  const Status& error() const { return std::get<1>(v_); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

namespace internal {
inline Status ToStatus(const Status& s) { return s; }
template <typename T>
Status ToStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace refit

#define REFIT_CONCAT_INNER_(a, b) a##b
#define REFIT_CONCAT_(a, b) REFIT_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status or Result) failed.
#define REFIT_RETURN_IF_ERROR(expr)                                  \
  do {                                                               \
    ::refit::Status refit_status_ = ::refit::internal::ToStatus(expr); \
    if (!refit_status_.ok()) return refit_status_;                   \
  } while (0)

// `REFIT_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a Result's value
// or returns its error from the enclosing function.
#define REFIT_ASSIGN_OR_RETURN(lhs, expr) \
  REFIT_ASSIGN_OR_RETURN_IMPL_(REFIT_CONCAT_(refit_result_, __COUNTER__), lhs, expr)
#define REFIT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#endif  // REFIT_STATUS_H_
