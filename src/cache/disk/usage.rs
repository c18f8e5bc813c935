//! What the store holds, kept in memory beside the index so that a put costs O(log n)
//! instead of a pass over every record: the bytes of the distinct servable blobs (what the
//! size limit compares with), how many records name each blob (whether a blob can go), and
//! the records that hold an artifact in least-recently-used order (what eviction takes
//! first). Built from the index when the store opens; every index write and removal updates
//! it ([`Usage::set`]).

use std::collections::{BTreeSet, HashMap};

use crate::cache::record::{Record, Status};
use crate::cache::store::RuntimeKeep;
use crate::key::CacheKey;

/// A key's contribution, as last set.
#[derive(Clone, Debug)]
struct KeyUse {
    digest: Option<String>,
    ready: bool,
    /// `(kept, last_used, created)`: the eviction order of [`super::maintain`]'s gc:
    /// artifacts of runtimes not kept ([`RuntimeKeep`]) first, then least recently used.
    when: (bool, u64, u64),
    /// The artifact's runtime versions, to place it again when the kept runtimes change.
    versions: std::collections::BTreeMap<String, String>,
    /// Whether it is in the eviction order (an artifact that is not quarantined).
    in_lru: bool,
}

#[derive(Clone, Debug, Default)]
struct BlobUse {
    bytes: u64,
    /// Records naming the blob, whatever their status.
    named: usize,
    /// Ready records naming it: the blob counts in [`Usage::total`] while this is non-zero.
    ready: usize,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct Usage {
    keys: HashMap<CacheKey, KeyUse>,
    blobs: HashMap<String, BlobUse>,
    total: u64,
    /// Records with an artifact that are not quarantined, in eviction order.
    lru: BTreeSet<((bool, u64, u64), CacheKey)>,
    keep: RuntimeKeep,
}

impl Usage {
    /// The accounting of `records` (the whole index).
    pub(super) fn of<'a>(records: impl IntoIterator<Item = &'a Record>) -> Usage {
        Self::keeping(records, RuntimeKeep::default())
    }

    /// [`Usage::of`] with `keep`'s runtimes evicted last.
    pub(super) fn keeping<'a>(
        records: impl IntoIterator<Item = &'a Record>,
        keep: RuntimeKeep,
    ) -> Usage {
        let mut u = Usage {
            keep,
            ..Usage::default()
        };
        for r in records {
            u.set(r.key, Some(r));
        }
        u
    }

    /// Replaces `key`'s contribution by `record`'s (`None`: the record was removed).
    pub(super) fn set(&mut self, key: CacheKey, record: Option<&Record>) {
        if let Some(old) = self.keys.remove(&key) {
            self.lru.remove(&(old.when, key));
            if let Some(d) = &old.digest {
                if let Some(b) = self.blobs.get_mut(d) {
                    b.named -= 1;
                    if old.ready {
                        b.ready -= 1;
                        if b.ready == 0 {
                            self.total -= b.bytes;
                        }
                    }
                    if b.named == 0 {
                        self.blobs.remove(d);
                    }
                }
            }
        }
        let Some(r) = record else { return };
        let ready = matches!(r.status, Status::Ready);
        let digest = r.artifact.as_ref().map(|a| {
            let b = self.blobs.entry(a.digest.clone()).or_insert(BlobUse {
                bytes: a.bytes,
                ..BlobUse::default()
            });
            b.named += 1;
            if ready {
                if b.ready == 0 {
                    self.total += b.bytes;
                }
                b.ready += 1;
            }
            a.digest.clone()
        });
        let versions = r.parts.backend.versions.clone();
        let when = (self.keep.keeps(&versions), r.last_used, r.created);
        let in_lru = digest.is_some() && !matches!(r.status, Status::Quarantined { .. });
        if in_lru {
            self.lru.insert((when, key));
        }
        self.keys.insert(
            key,
            KeyUse {
                digest,
                ready,
                when,
                versions,
                in_lru,
            },
        );
    }

    /// Bytes of the distinct blobs ready records name.
    pub(super) fn total(&self) -> u64 {
        self.total
    }

    /// Whether a record other than `except` names `digest`.
    pub(super) fn named_by_other(&self, digest: &str, except: &CacheKey) -> bool {
        let Some(b) = self.blobs.get(digest) else {
            return false;
        };
        let mine = self
            .keys
            .get(except)
            .is_some_and(|k| k.digest.as_deref() == Some(digest));
        b.named > usize::from(mine)
    }

    /// Evicts the artifacts of runtimes not in `keep` first from now on.
    pub(super) fn set_keep(&mut self, keep: RuntimeKeep) {
        if keep == self.keep {
            return;
        }
        self.keep = keep;
        self.lru.clear();
        for (key, k) in self.keys.iter_mut() {
            k.when.0 = self.keep.keeps(&k.versions);
            if k.in_lru {
                self.lru.insert((k.when, *key));
            }
        }
    }

    /// The runtimes evicted last.
    pub(super) fn keep(&self) -> &RuntimeKeep {
        &self.keep
    }

    /// The least recently used record holding an artifact.
    pub(super) fn oldest(&self) -> Option<CacheKey> {
        self.lru.first().map(|(_, k)| *k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::record::StoredArtifact;

    fn rec(n: u8, digest: &str, bytes: u64, used: u64) -> Record {
        let mut r = super::super::tests::record(n, used);
        r.artifact = Some(StoredArtifact {
            digest: digest.into(),
            entry: "m".into(),
            files: vec![],
            bytes,
        });
        r
    }

    #[test]
    fn shared_blobs_count_once_and_lru_follows_use() {
        let (a, b, c) = (
            rec(1, "d1", 100, 5),
            rec(2, "d1", 100, 3),
            rec(3, "d2", 50, 9),
        );
        let mut u = Usage::of([&a, &b, &c]);
        assert_eq!(u.total(), 150);
        assert_eq!(u.oldest(), Some(b.key));
        assert!(u.named_by_other("d1", &a.key));
        u.set(b.key, None);
        assert!(!u.named_by_other("d1", &a.key));
        assert_eq!(u.total(), 150, "a still names d1");
        let mut a2 = a.clone();
        a2.last_used = 10;
        u.set(a.key, Some(&a2));
        assert_eq!(u.oldest(), Some(c.key));
        let mut q = c.clone();
        q.status = Status::Quarantined { reason: "x".into() };
        u.set(c.key, Some(&q));
        assert_eq!(u.total(), 100);
        assert_eq!(u.oldest(), Some(a.key));
    }
}
