// Status and Result<T>: how every nopfs component reports an error.
//
// A Status is either ok or carries a code and a human-readable message that already says what went
// wrong and, where it can, what to do instead. Functions that can fail return [[nodiscard]] Status
// or Result<T>; exceptions are reserved for allocation failure and broken invariants. errno is
// translated in one place (Status::FromErrno).
//
// Thread safety: values; safe to copy and move between threads.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace nopfs {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller's input is wrong; the message says what to write instead
  kNotFound,         // a file, sample, peer or key does not exist
  kPermissionDenied,
  kIoError,            // the OS or a device failed
  kCorruption,         // bytes came back different from what was written
  kResourceExhausted,  // a budget (memory, instructions, capacity) ran out
  kUnavailable,        // a service or peer cannot be reached now; retrying may work
  kTimedOut,
  kFailedPrecondition,
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status TimedOut(std::string m) { return {StatusCode::kTimedOut, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  // "<context>: <strerror(err)>", with the code chosen from errno.
  static Status FromErrno(int err, std::string_view context) {
    StatusCode code = StatusCode::kIoError;
    switch (err) {
      case ENOENT:
      case ENOTDIR:
        code = StatusCode::kNotFound;
        break;
      case EACCES:
      case EPERM:
        code = StatusCode::kPermissionDenied;
        break;
      case EINVAL:
        code = StatusCode::kInvalidArgument;
        break;
      case ENOMEM:
      case ENOSPC:
      case EMFILE:
      case ENFILE:
        code = StatusCode::kResourceExhausted;
        break;
      case ETIMEDOUT:
        code = StatusCode::kTimedOut;
        break;
      case ECONNREFUSED:
      case ECONNRESET:
      case EPIPE:
      case EAGAIN:
        code = StatusCode::kUnavailable;
        break;
      default:
        break;
    }
    std::string msg(context);
    msg += ": ";
    msg += std::strerror(err);
    return {code, std::move(msg)};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "ok", or the message alone (it already names what failed).
  std::string ToString() const { return ok() ? std::string("ok") : message_; }

  // Prefixes the message with context ("loading config: " + message), keeping the code.
  Status WithContext(std::string_view context) const {
    if (ok()) return *this;
    std::string msg(context);
    msg += ": ";
    msg += message_;
    return {code_, std::move(msg)};
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kPermissionDenied:
      return "permission denied";
    case StatusCode::kIoError:
      return "I/O error";
    case StatusCode::kCorruption:
      return "corruption";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kTimedOut:
      return "timed out";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

// Result<T>: a T or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) v_ = Status::Internal("Result constructed from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace nopfs

// Returns early from the enclosing function if `expr` (a Status) is not ok.
#define NOPFS_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::nopfs::Status nopfs_status_ = (expr);        \
    if (!nopfs_status_.ok()) return nopfs_status_; \
  } while (0)
