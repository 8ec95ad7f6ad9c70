//! A bounded set of open files, for sinks and seeds that reach many files by number: a file is
//! opened when it is first needed and kept open for the next access, and once more files are
//! open than [`open_limit`] allows the one opened earliest is closed (a writer still holding
//! it keeps it until it is done). So a restore of an image of a million files holds a few
//! hundred descriptors, however many files there are.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::{Arc, Mutex};

/// Most files one [`Handles`] keeps open: an eighth of the soft `RLIMIT_NOFILE` (which the
/// store's own files, a second set of handles and the threads' files in use must share), at
/// least 8 and at most 512.
pub(crate) fn open_limit() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 1024 };
    usize::try_from(soft / 8).unwrap_or(usize::MAX).clamp(8, 512)
}

/// Open files by number (a manifest entry, a seed file), at most `limit` of them at once.
pub(crate) struct Handles {
    limit: usize,
    open: Mutex<Open>,
}

/// The files open now, and their numbers in the order they were opened.
#[derive(Default)]
struct Open {
    files: HashMap<usize, Arc<File>>,
    order: VecDeque<usize>,
}

impl Handles {
    /// Keeps at most `limit` files open.
    pub(crate) fn new(limit: usize) -> Handles {
        Handles { limit: limit.max(1), open: Mutex::new(Open::default()) }
    }

    /// File `key`: the one kept open, else opened by `open` (outside the lock, so threads open
    /// different files side by side) and kept, closing the earliest opened beyond the limit.
    pub(crate) fn get(&self, key: usize, open: impl FnOnce() -> std::io::Result<File>) -> std::io::Result<Arc<File>> {
        if let Some(f) = self.lock().files.get(&key) {
            return Ok(f.clone());
        }
        let opened = Arc::new(open()?);
        let mut o = self.lock();
        if let Some(f) = o.files.get(&key) {
            // Another thread opened it meanwhile: theirs is kept, this one closed.
            return Ok(f.clone());
        }
        o.files.insert(key, opened.clone());
        o.order.push_back(key);
        while o.files.len() > self.limit {
            let Some(oldest) = o.order.pop_front() else { break };
            o.files.remove(&oldest);
        }
        Ok(opened)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn at_most_the_limit_stays_open_and_every_file_is_still_reached() {
        let dir = tempfile::tempdir().unwrap();
        let path = |i: usize| dir.path().join(format!("f{i}"));
        (0..40).for_each(|i| std::fs::write(path(i), [i as u8]).unwrap());
        let handles = Handles::new(5);
        let opened = std::sync::atomic::AtomicUsize::new(0);
        for round in 0..2 {
            for i in 0..40 {
                let f = handles
                    .get(i, || {
                        opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        File::open(path(i))
                    })
                    .unwrap();
                let mut b = [0u8];
                f.read_exact_at(&mut b, 0).unwrap();
                assert_eq!(b[0], i as u8, "round {round}");
                assert!(handles.lock().files.len() <= 5);
            }
        }
        assert_eq!(opened.into_inner(), 80, "each file is reopened once it was closed");
        // Kept open: a file asked for again at once is not reopened.
        let again = handles.get(39, || panic!("39 is open")).unwrap();
        assert_eq!(Arc::strong_count(&again), 2);
        assert!(handles.get(99, || File::open(path(99))).is_err(), "a failed open is returned, not kept");
        assert!(!handles.lock().files.contains_key(&99));
    }
}
