//! Pack reads through caching tiers (`gstore serve --cache`, docs/HTTP.md) with the store
//! behind them: a restore node given tiers (`GSTORE_TIERS`) reads every pack range from the
//! first tier that answers, and from the store itself when none does, so a tier that is down
//! or dies mid-restore costs time, never the restore. A tier that fails is left alone for
//! [`REST`], and so is one that served bytes failing their check: the store reads that pack
//! again itself. Everything else (tags, manifests, listings, writes) goes to the store: tiers
//! keep only packs, which never change.
//!
//! Nothing a tier serves is used unless it is checked against an id the store gave: chunk
//! bytes against their chunk ids, by whoever decodes them, and a pack's tail (footer and
//! trailer) against the pack's name, by [`crate::repo::packs::read_tail`], which reads it from
//! the store itself ([`super::Backend::past_tiers`]) when it is not covered.

use super::http::HttpObjects;
use super::{ListEntry, Objects, Patience, Put, Version};
use crate::error::{Result, StoreError};
use crate::format::key::ObjectKey;
use crate::ObjectKind;
use bytes::Bytes;
use object_store::PutPayload;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a tier that failed is not asked again.
const REST: Duration = Duration::from_secs(30);
/// The longest a tier may stay silent on a request before the store is asked instead.
const TIER_STALL: Duration = Duration::from_secs(10);

/// The tiers named in `GSTORE_TIERS` (comma-separated `http://HOST:PORT` or `https://…`
/// URLs, nearest first); none when it is unset or empty.
pub fn tiers_from_env() -> Result<Vec<String>> {
    let Some(list) = crate::environment::tiers() else { return Ok(Vec::new()) };
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            if u.starts_with("http://") || u.starts_with("https://") {
                Ok(u.trim_end_matches('/').to_string())
            } else {
                Err(StoreError::Setting {
                    name: "GSTORE_TIERS".into(),
                    why: format!("{u:?} is not a tier's URL (http://HOST:PORT or https://HOST:PORT)"),
                })
            }
        })
        .collect()
}

/// One tier and when it may be asked again.
struct Tier {
    url: String,
    objects: HttpObjects,
    resting_until: Mutex<Option<Instant>>,
}

impl Tier {
    fn resting(&self) -> bool {
        self.resting_until.lock().expect("tier lock").is_some_and(|t| Instant::now() < t)
    }

    /// Leaves the tier alone for [`REST`], saying so the first time it fails.
    fn rest(&self, why: &StoreError) {
        let mut until = self.resting_until.lock().expect("tier lock");
        if until.is_none_or(|t| Instant::now() >= t) {
            eprintln!("gstore: tier {} failed ({why}); reading packs past it for {} s", self.url, REST.as_secs());
        }
        *until = Some(Instant::now() + REST);
    }
}

/// A store's objects with its pack reads going through tiers first.
pub(super) struct Tiered {
    origin: Arc<dyn Objects>,
    tiers: Vec<Tier>,
    /// Which tier served each pack read last (so a pack whose bytes failed their check names
    /// the tier that served them); forgotten past [`SERVED_KEPT`] packs.
    served: Mutex<HashMap<ObjectKey, usize>>,
    /// Packs read from the store itself from now on: bytes a tier served of them failed their
    /// check.
    distrusted: Mutex<HashSet<ObjectKey>>,
}

/// Packs whose serving tier is remembered, at most.
const SERVED_KEPT: usize = 100_000;

impl Tiered {
    /// `origin` behind the tiers at `urls`, nearest first.
    pub(super) fn new(origin: Arc<dyn Objects>, urls: &[String], patience: Patience) -> Result<Tiered> {
        let patience = Patience { stall: patience.stall.min(TIER_STALL), retry_for: Duration::ZERO };
        let tiers = urls
            .iter()
            .map(|url| {
                let objects = HttpObjects::new(url, patience)?;
                Ok(Tier { url: url.clone(), objects, resting_until: Mutex::new(None) })
            })
            .collect::<Result<_>>()?;
        Ok(Tiered { origin, tiers, served: Mutex::default(), distrusted: Mutex::default() })
    }

    /// `read` on the first tier that answers, for a pack; else (and for any other object) on
    /// the store.
    fn read<T>(&self, key: &ObjectKey, mut read: impl FnMut(&dyn Objects) -> Result<T>) -> Result<T> {
        if key.pack().is_some() {
            if !self.distrusted.lock().expect("tier lock").contains(key) {
                for (i, t) in self.tiers.iter().enumerate().filter(|(_, t)| !t.resting()) {
                    match read(&t.objects) {
                        Ok(v) => {
                            let mut served = self.served.lock().expect("tier lock");
                            if served.len() >= SERVED_KEPT {
                                served.clear();
                            }
                            served.insert(key.clone(), i);
                            return Ok(v);
                        }
                        Err(e) => t.rest(&e),
                    }
                }
            }
            // Read from the store: no tier is to blame for these bytes.
            self.served.lock().expect("tier lock").remove(key);
        }
        read(&*self.origin)
    }
}

impl Objects for Tiered {
    fn put(&self, key: &ObjectKey, bytes: PutPayload, mode: Put<'_>) -> Result<()> {
        self.origin.put(key, bytes, mode)
    }

    fn put_large(&self, key: &ObjectKey, bytes: PutPayload) -> Result<()> {
        self.origin.put_large(key, bytes)
    }

    fn get(&self, key: &ObjectKey) -> Result<Option<(Bytes, Version)>> {
        self.origin.get(key)
    }

    fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes> {
        self.read(key, |o| o.get_range(key, range.clone()))
    }

    fn get_range_into(&self, key: &ObjectKey, range: Range<u64>, out: &mut [u8]) -> Result<()> {
        self.read(key, |o| o.get_range_into(key, range.clone(), out))
    }

    fn size(&self, key: &ObjectKey) -> Result<Option<u64>> {
        self.origin.size(key)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ListEntry>> {
        self.origin.list(prefix)
    }

    fn delete(&self, key: &ObjectKey) -> Result<()> {
        self.origin.delete(key)
    }
}

impl Tiered {
    /// Says that the bytes of `key` just read failed their check: the tier that served them
    /// rests, and `key` is read from the store from now on (the damage may be in every tier,
    /// each reading through the next). False when no tier served `key`.
    pub(super) fn distrust(&self, key: &ObjectKey) -> bool {
        let Some(i) = self.served.lock().expect("tier lock").remove(key) else { return false };
        let why = StoreError::corrupt(ObjectKind::Pack, key.to_string(), "its bytes from this tier failed their check");
        self.tiers[i].rest(&why);
        self.distrusted.lock().expect("tier lock").insert(key.clone());
        true
    }
}
