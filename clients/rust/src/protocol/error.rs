//! Typed errors on the wire: clients match on [`ErrorCode`], never on messages.

use serde::{Deserialize, Serialize};

/// A typed error on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, machine-readable.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

/// Machine-readable error codes. Clients match on these, never on messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame is not a JSON object with a string `op` (the connection stays open).
    BadFrame,
    /// The frame's length exceeds the server's limit (the connection is closed after this).
    FrameTooLarge,
    /// The `op` is not one this server knows.
    UnknownRequest,
    /// The request's fields do not match its `op`.
    BadRequest,
    /// `hello` was missing or the client's version is not supported.
    UnsupportedVersion,
    /// The model name is not a plain repository name (a path, `..`, empty, control chars).
    BadName,
    /// No such model, version, profile or backend in the repository.
    NotFound,
    /// The artifact is not ready and the client did not wait.
    NotReady,
    /// The build failed (and is memoised until the model or its config changes).
    BuildFailed,
    /// The build was cancelled (model replaced or removed, or daemon shutting down).
    Cancelled,
    /// The wait exceeded the timeout.
    Timeout,
    /// The request needs root or the daemon's user.
    PermissionDenied,
    /// Too many connections.
    Busy,
    /// The connection was idle longer than the server allows.
    /// Also sent when a request frame was not completed in time, or when an idle connection
    /// is closed to make room at the connection limit.
    IdleTimeout,
    /// The daemon is shutting down.
    ShuttingDown,
    /// The request named a runtime (`AcquireRequest::runtime`) the daemon has no library
    /// for, so it can neither serve nor build an artifact for it.
    RuntimeUnavailable,
    /// Anything else (I/O on the daemon's side, a bug).
    Internal,
}

impl ErrorCode {
    /// Every code, in declaration order (clients map each to their own error type).
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::BadFrame,
        ErrorCode::FrameTooLarge,
        ErrorCode::UnknownRequest,
        ErrorCode::BadRequest,
        ErrorCode::UnsupportedVersion,
        ErrorCode::BadName,
        ErrorCode::NotFound,
        ErrorCode::NotReady,
        ErrorCode::BuildFailed,
        ErrorCode::Cancelled,
        ErrorCode::Timeout,
        ErrorCode::PermissionDenied,
        ErrorCode::Busy,
        ErrorCode::IdleTimeout,
        ErrorCode::ShuttingDown,
        ErrorCode::RuntimeUnavailable,
        ErrorCode::Internal,
    ];

    /// The snake_case name used on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::UnknownRequest => "unknown_request",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::BadName => "bad_name",
            ErrorCode::NotFound => "not_found",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::BuildFailed => "build_failed",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Timeout => "timeout",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::Busy => "busy",
            ErrorCode::IdleTimeout => "idle_timeout",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::RuntimeUnavailable => "runtime_unavailable",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
