//! Cache maintenance while the daemon runs: `cache_list`, `cache_remove`, `cache_gc` and
//! `cache_verify` against the daemon's own open store (it holds the cache's lock, so
//! `trtcache ls/rm/gc/verify` come here through the socket). Every change to the store is
//! also applied to the daemon's memory: an artifact removed, evicted or quarantined leaves
//! the ready map, so the next acquire looks it up (and rebuilds it) instead of handing out
//! files that are gone.
//!
//! Enters: the request's fields. Leaves: protocol reports, or a typed failure.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use trtcache_client::protocol::{CacheGcReport, CacheVerifyReport, ErrorCode};

use super::Service;
use crate::cache::{KeyPrefixError, Store};
use crate::daemon::failure::{fail, Failure};
use crate::daemon::watch_stream::Change;
use crate::spec::CacheKey;

impl Service {
    fn store(&self) -> Result<Arc<dyn Store>, Failure> {
        self.build_cache.store().ok_or_else(|| {
            fail(
                ErrorCode::Internal,
                "this daemon's build cache has no store",
            )
        })
    }

    fn cache_dir(&self) -> String {
        self.cfg.cache_dir.display().to_string()
    }

    /// Runs a store operation on the blocking pool.
    async fn on_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Store) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, Failure> {
        let store = self.store()?;
        tokio::task::spawn_blocking(move || f(&*store))
            .await
            .map_err(|e| fail(ErrorCode::Internal, e.to_string()))?
    }

    /// Forgets artifacts the store no longer serves.
    fn forget_ready(&self, keys: impl IntoIterator<Item = CacheKey>) {
        let mut st = self.lock();
        for k in keys {
            st.forget_ready(&k);
        }
        drop(st);
        self.ready_changed();
    }

    /// Evicts a model's artifacts (every plan of every version) or one key.
    pub async fn evict(&self, model: Option<&str>, key: Option<&str>) -> Result<u64, Failure> {
        let mut keys = Vec::new();
        if let Some(k) = key {
            keys.push(CacheKey::parse(k).map_err(|e| fail(ErrorCode::BadRequest, e.to_string()))?);
        }
        if let Some(m) = model {
            self.entry(m, None)?;
            let st = self.lock();
            if let Some(ms) = st.models.get(m) {
                keys.extend(
                    ms.plans
                        .values()
                        .filter_map(|p| p.as_ref().ok().map(|p| p.key)),
                );
            }
        }
        let mut removed = 0;
        for k in keys {
            let was_ready = self.lock().forget_ready(&k);
            self.ready_changed();
            self.queue.forget_failure(&k);
            let cache = self.build_cache.clone();
            let gone = tokio::task::spawn_blocking(move || cache.evict(&k))
                .await
                .map_err(|e| fail(ErrorCode::Internal, e.to_string()))?
                .map_err(|e| fail(ErrorCode::Internal, e.to_string()))?;
            if was_ready || gone {
                // After the store forgot it: a watcher that acquires on this event gets a
                // fresh build, not the evicted files.
                self.announce(&mut self.lock(), k, Change::Evicted);
            }
            if gone {
                tracing::info!(key = %k, model = ?model, "evicted by request");
            }
            removed += gone as u64;
        }
        self.counters
            .evictions_requested
            .fetch_add(removed, Ordering::Relaxed);
        Ok(removed)
    }

    /// Every record, as `trtcache ls --json` prints it.
    pub async fn cache_list(&self) -> Result<(String, Vec<serde_json::Value>), Failure> {
        let records = self
            .on_store(|s| {
                let records = s.list().map_err(internal)?;
                records
                    .iter()
                    .map(|r| serde_json::to_value(r).map_err(internal))
                    .collect()
            })
            .await?;
        Ok((self.cache_dir(), records))
    }

    /// Removes one entry by key or unique prefix; the full key.
    pub async fn cache_remove(&self, key: &str) -> Result<(String, String), Failure> {
        let k = key.to_string();
        let key = self
            .on_store(move |s| {
                crate::cache::resolve_key(s, &k).map_err(|e| match e {
                    KeyPrefixError::NotAKey(_) => fail(ErrorCode::BadRequest, e.to_string()),
                    KeyPrefixError::NoEntry(_) | KeyPrefixError::Ambiguous { .. } => {
                        fail(ErrorCode::NotFound, e.to_string())
                    }
                    KeyPrefixError::Store(e) => internal(e),
                })
            })
            .await?;
        let removed = self.evict(None, Some(&key.hex())).await?;
        if removed == 0 {
            return Err(fail(
                ErrorCode::NotFound,
                format!("no cache entry with key {key}"),
            ));
        }
        Ok((self.cache_dir(), key.hex()))
    }

    /// Evicts least-recently-used entries down to `max_bytes` (or says which it would).
    pub async fn cache_gc(&self, max_bytes: u64, dry_run: bool) -> Result<CacheGcReport, Failure> {
        let cache = self.build_cache.clone();
        let r = self
            .on_store(move |s| {
                // The runtimes in use now (current, incoming, recently used) are evicted last.
                cache.refresh_keep();
                s.gc(max_bytes, dry_run).map_err(internal)
            })
            .await?;
        if !dry_run {
            self.forget_ready(r.evicted.iter().filter_map(|k| CacheKey::parse(k).ok()));
        }
        Ok(CacheGcReport {
            cache_dir: self.cache_dir(),
            dry_run: r.dry_run,
            max_bytes: r.max_bytes,
            bytes_before: r.bytes_before,
            bytes_after: r.bytes_after,
            evicted: r.evicted,
        })
    }

    /// Re-hashes every artifact; the ones quarantined leave the daemon's memory too.
    pub async fn cache_verify(&self) -> Result<CacheVerifyReport, Failure> {
        let r = self.on_store(|s| s.verify().map_err(internal)).await?;
        self.forget_ready(
            r.quarantined
                .iter()
                .filter_map(|(k, _)| CacheKey::parse(k).ok()),
        );
        Ok(CacheVerifyReport {
            cache_dir: self.cache_dir(),
            checked: r.checked as u64,
            ok: r.ok as u64,
            quarantined: r.quarantined,
        })
    }
}

fn internal(e: impl std::fmt::Display) -> Failure {
    fail(ErrorCode::Internal, e.to_string())
}
