//! [`Retrying`]: the wrapper every remote backend runs under. Its clients already retry a
//! failed request a few times within seconds (so a wrong endpoint fails fast); once the store
//! has answered this process, or was reached by the failing request itself (it answered 5xx
//! or cut its answer off), a request that still fails in transit
//! ([`StoreError::Unavailable`]: refused, reset, stalled, 5xx) is tried again with growing
//! pauses for up to [`Patience::retry_for`], riding out a server restart or a short outage
//! instead of failing a long restore or push near its end.

use super::{ListEntry, Objects, Put, Version};
use crate::environment;
use crate::error::{Result, StoreError};
use crate::format::key::ObjectKey;
use bytes::Bytes;
use object_store::PutPayload;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long remote requests wait, from the environment.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    /// A request that receives nothing for this long is dropped and retried
    /// (`GSTORE_IO_TIMEOUT`, default 30 s).
    pub stall: Duration,
    /// How long a request that fails in transit keeps being retried once the store has
    /// answered (`GSTORE_RETRY_TIMEOUT`, default 60 s; 0 turns the waiting off).
    pub retry_for: Duration,
}

impl Patience {
    /// The settings from `GSTORE_IO_TIMEOUT` and `GSTORE_RETRY_TIMEOUT` (durations such as
    /// `30s`, `2m`, `500ms`).
    pub fn from_env() -> Result<Patience> {
        Ok(Patience {
            stall: environment::duration(environment::GSTORE_IO_TIMEOUT, Duration::from_secs(30))?,
            retry_for: environment::duration(environment::GSTORE_RETRY_TIMEOUT, Duration::from_secs(60))?,
        })
    }
}

/// Longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// A remote backend whose requests are tried again while the store is unavailable.
pub(super) struct Retrying {
    inner: Arc<dyn Objects>,
    retry_for: Duration,
    /// Set once any request got an answer: from then on the store is known to exist, and a
    /// failure in transit is an outage to wait out, not a wrong address.
    answered: AtomicBool,
}

impl Retrying {
    /// Wraps `inner`.
    pub(super) fn new(inner: Arc<dyn Objects>, patience: Patience) -> Retrying {
        Retrying { inner, retry_for: patience.retry_for, answered: AtomicBool::new(false) }
    }

    fn call<T>(&self, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(200);
        loop {
            match op() {
                Err(e) if e.is_transient() => {
                    let waited = started.elapsed();
                    let known = self.answered.load(Ordering::Relaxed)
                        || matches!(e, StoreError::Unavailable { reached: true, .. });
                    if !known || waited + pause > self.retry_for {
                        return Err(if waited.is_zero() || !known { e } else { still_unavailable(e, waited) });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                other => {
                    // Anything but a failure in transit is an answer.
                    self.answered.store(true, Ordering::Relaxed);
                    return other;
                }
            }
        }
    }
}

/// Adds how long the store was waited for to its last failure.
fn still_unavailable(e: StoreError, waited: Duration) -> StoreError {
    match e {
        StoreError::Unavailable { action, key, message, reached } => StoreError::Unavailable {
            action,
            key,
            reached,
            message: format!("{message}; still failing after {} s of retries (GSTORE_RETRY_TIMEOUT)", waited.as_secs()),
        },
        other => other,
    }
}

impl Objects for Retrying {
    fn put(&self, key: &ObjectKey, bytes: PutPayload, mode: Put<'_>) -> Result<()> {
        self.call(|| self.inner.put(key, bytes.clone(), mode))
    }

    fn put_large(&self, key: &ObjectKey, bytes: PutPayload) -> Result<()> {
        self.call(|| self.inner.put_large(key, bytes.clone()))
    }

    fn get(&self, key: &ObjectKey) -> Result<Option<(Bytes, Version)>> {
        self.call(|| self.inner.get(key))
    }

    fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes> {
        self.call(|| self.inner.get_range(key, range.clone()))
    }

    fn get_range_into(&self, key: &ObjectKey, range: Range<u64>, out: &mut [u8]) -> Result<()> {
        self.call(|| self.inner.get_range_into(key, range.clone(), out))
    }

    fn size(&self, key: &ObjectKey) -> Result<Option<u64>> {
        self.call(|| self.inner.size(key))
    }

    fn list(&self, prefix: &str) -> Result<Vec<ListEntry>> {
        self.call(|| self.inner.list(prefix))
    }

    fn delete(&self, key: &ObjectKey) -> Result<()> {
        self.call(|| self.inner.delete(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::{Arc, Mutex};

    /// Objects whose reads fail in transit `failures` times, then succeed.
    struct Flaky {
        failures: AtomicU32,
        tries: Arc<AtomicU32>,
        answer_first: Mutex<bool>,
        /// Whether the failures reached the store (as a 5xx does).
        reached: bool,
    }

    impl Objects for Flaky {
        fn put(&self, _: &ObjectKey, _: PutPayload, _: Put<'_>) -> Result<()> {
            Ok(())
        }
        fn get(&self, key: &ObjectKey) -> Result<Option<(Bytes, Version)>> {
            self.tries.fetch_add(1, Ordering::SeqCst);
            if std::mem::take(&mut *self.answer_first.lock().unwrap()) {
                return Ok(None);
            }
            if self.failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                return Err(StoreError::Unavailable {
                    action: "reading",
                    key: key.to_string(),
                    message: "reset".into(),
                    reached: self.reached,
                });
            }
            Ok(None)
        }
        fn get_range(&self, key: &ObjectKey, _: Range<u64>) -> Result<Bytes> {
            Err(StoreError::corrupt(crate::ObjectKind::Object, key.to_string(), "short"))
        }
        fn size(&self, _: &ObjectKey) -> Result<Option<u64>> {
            Ok(None)
        }
        fn list(&self, _: &str) -> Result<Vec<ListEntry>> {
            Ok(Vec::new())
        }
        fn delete(&self, _: &ObjectKey) -> Result<()> {
            Ok(())
        }
    }

    /// A wrapped [`Flaky`] and its count of tries.
    fn flaky(failures: u32, answer_first: bool, retry_for: Duration) -> (Retrying, Arc<AtomicU32>) {
        flaky_reaching(failures, answer_first, false, retry_for)
    }

    /// As [`flaky`], with failures that reached the store if `reached`.
    fn flaky_reaching(
        failures: u32,
        answer_first: bool,
        reached: bool,
        retry_for: Duration,
    ) -> (Retrying, Arc<AtomicU32>) {
        let tries = Arc::new(AtomicU32::new(0));
        let inner = Flaky {
            failures: AtomicU32::new(failures),
            tries: tries.clone(),
            answer_first: Mutex::new(answer_first),
            reached,
        };
        (Retrying::new(Arc::new(inner), Patience { stall: Duration::from_secs(1), retry_for }), tries)
    }

    #[test]
    fn a_store_that_answered_is_waited_for() {
        let (r, tries) = flaky(3, true, Duration::from_secs(10));
        r.get(&ObjectKey::Probe("a".into())).unwrap();
        assert!(r.get(&ObjectKey::Probe("b".into())).unwrap().is_none());
        assert_eq!(tries.load(Ordering::SeqCst), 5, "one answer, three failures, one success");
    }

    #[test]
    fn a_store_that_never_answered_fails_at_once() {
        let (r, tries) = flaky(3, false, Duration::from_secs(10));
        let e = r.get(&ObjectKey::Probe("a".into())).unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_store_that_answered_with_server_errors_is_waited_for() {
        let (r, tries) = flaky_reaching(2, false, true, Duration::from_secs(10));
        assert!(r.get(&ObjectKey::Probe("a".into())).unwrap().is_none());
        assert_eq!(tries.load(Ordering::SeqCst), 3, "two 5xx, one success");
    }

    #[test]
    fn waiting_ends_and_says_how_long_it_waited() {
        let (r, _) = flaky(100, true, Duration::from_millis(700));
        r.get(&ObjectKey::Probe("a".into())).unwrap();
        let e = r.get(&ObjectKey::Probe("b".into())).unwrap_err().to_string();
        assert!(e.contains("still failing after") && e.contains("GSTORE_RETRY_TIMEOUT"), "{e}");
    }

    #[test]
    fn other_failures_are_not_retried() {
        let (r, _) = flaky(0, false, Duration::from_secs(10));
        assert!(r.get_range(&ObjectKey::Probe("k".into()), 0..1).unwrap_err().is_damage());
    }
}
