//! A request's typed failure: the wire's [`ErrorCode`] and a reason bounded as the daemon keeps
//! and sends reasons ([`bounded_reason`]). The service, the queue's jobs, the watch stream
//! and dispatch all speak it; it imports nothing of theirs.

use trtcache_client::protocol::ErrorCode;

use super::build_cache::bounded_reason;

/// A typed failure of a request.
pub type Failure = (ErrorCode, String);

/// A failure with `msg` bounded ([`bounded_reason`]).
pub fn fail(code: ErrorCode, msg: impl Into<String>) -> Failure {
    (code, bounded_reason(&msg.into()))
}
