//! How a failed command reports its error: a short, stable code for its class (the daemon's
//! wire code when the daemon refused the request, else the first typed cause found in the
//! chain: the store's, the commands' own, ONNX, the configuration, the repository) and the
//! message: one line on stderr, or with `--json` one JSON object on stdout. It sits above the
//! commands whose error types it knows; none of them imports it.

/// A short, stable, machine-readable name for why a command failed: the daemon's wire code
/// when the daemon refused the request, else a class of the first typed cause found.
pub fn error_code(e: &anyhow::Error) -> &'static str {
    use crate::cache::StoreError;
    use trtcache_client::ClientError;
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<ClientError>() {
            return match c {
                ClientError::Server { code, .. } => code.as_str(),
                ClientError::Connect { .. } => "no_daemon",
                ClientError::Timeout { .. } => "timeout",
                _ => "daemon_connection",
            };
        }
        if let Some(s) = cause.downcast_ref::<StoreError>() {
            return match s {
                StoreError::InUse { .. } => "cache_in_use",
                StoreError::IndexDamaged { .. } => "index_damaged",
                StoreError::Full { .. } => "no_space",
                _ => "cache_error",
            };
        }
        if cause.is::<super::cache::NoSuchCache>() || cause.is::<super::cache::NoCacheParent>() {
            return "no_such_cache";
        }
        if cause.is::<crate::cache::KeyPrefixError>() {
            return "not_found";
        }
        if cause.is::<super::warm::EmptyRepository>() {
            return "empty_repository";
        }
        if let Some(o) = cause.downcast_ref::<crate::onnx::OnnxError>() {
            return match o {
                crate::onnx::OnnxError::Open { err, .. }
                    if err.kind() == std::io::ErrorKind::NotFound =>
                {
                    "not_found"
                }
                crate::onnx::OnnxError::Open { err, .. }
                    if err.kind() == std::io::ErrorKind::PermissionDenied =>
                {
                    "permission_denied"
                }
                _ => "bad_model",
            };
        }
        if cause.is::<crate::config::ConfigError>() {
            return "bad_config";
        }
        if cause.is::<crate::daemon::repo::ScanError>() {
            return "bad_repository";
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::NotFound => return "not_found",
                std::io::ErrorKind::PermissionDenied => return "permission_denied",
                _ => {}
            }
        }
    }
    "failed"
}

/// Reports a command's error: `error: …` (every cause, one line) on stderr; with `--json`
/// also `{"error":{"code":…,"message":…}}` on stdout, where the command's JSON output would
/// have gone.
pub fn report_error(e: &anyhow::Error, json: bool) {
    if json {
        let v = serde_json::json!({
            "error": { "code": error_code(e), "message": format!("{e:#}") }
        });
        println!("{v}");
    }
    super::log::report_error(e);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_get_the_code_of_their_first_typed_cause() {
        let e = anyhow::Error::new(super::super::cache::NoSuchCache("/x".into())).context("ls");
        assert_eq!(error_code(&e), "no_such_cache");
        let e = anyhow::Error::new(trtcache_client::ClientError::Server {
            code: trtcache_client::protocol::ErrorCode::PermissionDenied,
            message: "no".into(),
        });
        assert_eq!(error_code(&e), "permission_denied");
        assert_eq!(error_code(&anyhow::anyhow!("plain")), "failed");
    }
}
