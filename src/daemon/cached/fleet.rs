//! The fleet tier's step of [`DiskBuildCache`] (its [`BuildCache::prefetch`]): asked by the
//! queue before a job may take a build slot. Fetches (checked in the build worker), or says
//! another host holds the key's build lease; the request and key parts of a waiting key are
//! kept between polls.

use trtcache_client::protocol::Origin;

use super::super::build_cache::{Planned, Prefetch};
use super::DiskBuildCache;
use crate::cache::{Lookup, Store};

impl DiskBuildCache {
    /// [`BuildCache::prefetch`]: one step of the fleet tier for `planned`, on the repository's
    /// file (no snapshot: the tier's key check compares the parts with the planned key).
    pub(super) fn remote_step(&self, planned: &Planned) -> Prefetch {
        let Some(tier) = self.remote.as_ref() else {
            return Prefetch::Build;
        };
        let o = self.cache.opened();
        let known = self
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&planned.key);
        let Ok(builders) = self.builders(&o, planned.selection.runtime.as_deref()) else {
            return Prefetch::Build;
        };
        let (req, parts) = match known {
            Some(k) => k,
            None => {
                let Ok((req, _)) = self.request(&planned.model, &planned.selection) else {
                    return Prefetch::Build;
                };
                let Ok(parts) = builders.key().key_parts(&req) else {
                    return Prefetch::Build;
                };
                (req, parts)
            }
        };
        if parts.key() != planned.key {
            return Prefetch::Build;
        }
        // In the bounded worker, like every build: the daemon opens no session itself.
        let revalidate = tier.config().revalidate;
        let check = |a: &crate::cache::StagedArtifact, _: &crate::remote::Manifest| {
            builders
                .build()
                .check_fetched(&req, a, revalidate)
                .map_err(|e| e.to_string())
        };
        let model = planned.model.path.display().to_string();
        match tier.before_build(&parts, &model, &*o.store, &check) {
            crate::remote::Before::Fetched(_) => match o.store.peek(&planned.key) {
                Ok(Lookup::Hit { record, served }) => {
                    match self.artifact(planned, &record, &served, Origin::Remote) {
                        Ok(h) => Prefetch::Ready(h),
                        Err(_) => Prefetch::Build,
                    }
                }
                _ => Prefetch::Build,
            },
            crate::remote::Before::Wait { lease, left } => {
                self.waiting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(planned.key, (req.clone(), parts.clone()));
                Prefetch::Wait {
                    poll: tier.lease_poll(),
                    left,
                    holder: lease.holder,
                }
            }
            crate::remote::Before::Build => Prefetch::Build,
        }
    }
}
