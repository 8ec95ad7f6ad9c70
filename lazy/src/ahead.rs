//! Read-ahead behind faults. A fault on a missing segment says where the process reads now;
//! the segments after it are filled next, in a window that doubles each time the reader
//! faults in the second half of its window or right after it (it streams, and the fill is
//! to stay ahead of it), like the kernel's read-ahead for files. A GPU driver restoring VRAM
//! walks its host copy this way.

/// Segments read ahead after a first fault.
pub const WINDOW_MIN: usize = 8;
/// The largest window.
pub const WINDOW_MAX: usize = 512;
/// Streams followed at once; a new one replaces the oldest.
const STREAMS: usize = 16;

/// One reader being followed through a task's segments.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stream {
    task: usize,
    /// The faulted segment that opened the window.
    start: usize,
    /// The next segment to read ahead.
    next: usize,
    /// One past the window's last segment.
    end: usize,
}

/// The streams being followed, newest last.
#[derive(Debug, Default)]
pub struct Readahead {
    streams: Vec<Stream>,
}

impl Readahead {
    /// A fault on segment `seg` of task `task`, which has `count` segments.
    pub fn fault(&mut self, task: usize, seg: usize, count: usize) {
        let prev = self.streams.iter().rposition(|s| s.task == task && s.start <= seg && seg <= s.end);
        let len = match prev.map(|i| self.streams.remove(i)) {
            Some(s) if 2 * (seg - s.start) >= s.end - s.start => (2 * (s.end - s.start)).min(WINDOW_MAX),
            Some(s) => (s.end - s.start).max(WINDOW_MIN),
            None => WINDOW_MIN,
        };
        if self.streams.len() == STREAMS {
            self.streams.remove(0);
        }
        self.streams.push(Stream { task, start: seg, next: seg + 1, end: (seg + len).min(count) });
    }

    /// The next (task, segment) to read ahead that `claim` takes, newest stream first.
    pub fn next(&mut self, mut claim: impl FnMut(usize, usize) -> bool) -> Option<(usize, usize)> {
        for s in self.streams.iter_mut().rev() {
            while s.next < s.end {
                let seg = s.next;
                s.next += 1;
                if claim(s.task, seg) {
                    return Some((s.task, seg));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(r: &mut Readahead) -> Vec<(usize, usize)> {
        std::iter::from_fn(|| r.next(|_, _| true)).collect()
    }

    #[test]
    fn a_streaming_reader_gets_a_growing_window() {
        let mut r = Readahead::default();
        r.fault(0, 100, 10_000);
        let first = drain(&mut r);
        assert_eq!(first, (101..100 + WINDOW_MIN).map(|s| (0, s)).collect::<Vec<_>>());
        // The reader went through the window and faults right after it: twice as far ahead.
        r.fault(0, 100 + WINDOW_MIN, 10_000);
        assert_eq!(drain(&mut r).len(), 2 * WINDOW_MIN - 1);
        let mut at = 100 + 3 * WINDOW_MIN;
        let mut len = 2 * WINDOW_MIN;
        for _ in 0..10 {
            r.fault(0, at, 10_000);
            len = (2 * len).min(WINDOW_MAX);
            assert_eq!(drain(&mut r).len(), len - 1, "window at {at}");
            at += len;
        }
        assert_eq!(len, WINDOW_MAX);
    }

    #[test]
    fn a_fault_early_in_the_window_keeps_its_size_and_the_newest_stream_goes_first() {
        let mut r = Readahead::default();
        r.fault(0, 0, 1000);
        r.fault(0, 1, 1000);
        assert_eq!(drain(&mut r).len(), WINDOW_MIN - 1, "same size, moved on by one");
        r.fault(1, 50, 1000);
        r.fault(2, 7, 1000);
        assert_eq!(r.next(|_, _| true), Some((2, 8)));
        // Segments the claim refuses (already filled) are skipped.
        assert_eq!(r.next(|_, s| s > 10), Some((2, 11)));
        assert_eq!(drain(&mut r).last(), Some(&(1, 50 + WINDOW_MIN - 1)));
        r.fault(3, 998, 1000);
        assert_eq!(drain(&mut r), vec![(3, 999)], "ends with the task's segments");
    }
}
