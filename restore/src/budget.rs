//! The memory a restore may use, and every rule that sizes a restore's buffers from it.

/// The memory budget of a restore: what its fetched ranges, decoded bytes and a sink's staging
/// hold together. Each worker thread holds one fetched range and its decoded bytes (three
/// quarters of the budget between them); sinks stage in the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget(u64);

/// Largest range read, whatever the budget.
const MAX_READ_CEILING: u64 = 16 << 20;
/// Smallest range read (a chunk may be up to 16 MiB in a custom store; reads never split one).
const MAX_READ_FLOOR: u64 = 1 << 20;

impl Budget {
    /// The default: 1 GiB.
    pub const DEFAULT: Budget = Budget(1 << 30);

    /// A budget of `bytes`.
    pub fn of(bytes: u64) -> Budget {
        Budget(bytes)
    }

    /// An equal share of it for each of `parts` restores that run at once.
    pub fn share(self, parts: usize) -> Budget {
        Budget(self.0 / parts.max(1) as u64)
    }

    /// The largest range read it allows, for the current thread pool.
    pub fn max_read(self) -> u64 {
        let threads = rayon::current_num_threads().max(1) as u64;
        (self.0 * 3 / 4 / (2 * threads)).clamp(MAX_READ_FLOOR, MAX_READ_CEILING)
    }

    /// Pinned staging slots of [`Budget::max_read`] bytes for a load into VRAM: checked on the
    /// GPU, two slots' worth of half the budget per slot (device staging beside the pinned
    /// range, no decoded copies on the host); checked on the host, a quarter of the budget.
    pub fn staging_slots(self, checked_on_gpu: bool) -> u64 {
        let (threads, max_read) = (rayon::current_num_threads().max(2) as u64, self.max_read());
        if checked_on_gpu {
            ((self.0 / 2) / (2 * max_read)).clamp(2, threads + 4)
        } else {
            ((self.0 / 4) / max_read).clamp(2, 2 * threads)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stay_between_floor_and_ceiling_and_shares_split_the_budget() {
        assert_eq!(Budget::of(1).max_read(), MAX_READ_FLOOR);
        assert_eq!(Budget::of(1 << 40).max_read(), MAX_READ_CEILING);
        assert_eq!(Budget::of(1 << 30).share(4), Budget::of(1 << 28));
        assert_eq!(Budget::of(1 << 30).share(0), Budget::of(1 << 30));
        assert!(Budget::of(1).staging_slots(true) >= 2 && Budget::of(1).staging_slots(false) >= 2);
    }
}
