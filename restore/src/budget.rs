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
/// Range reads of a load into VRAM that checks its chunks on the GPU. Reading the page cache
/// into pinned staging and the DMA out of it share the host's memory: on the H200 machine 16
/// threads moved 49.5 GB/s through 4 MiB buffers, 43-44 through 16 MiB and 15-17 through 1 MiB;
/// with one kernel launch per read, 3 MiB reads loaded fastest until the kernel got shorter;
/// since, 4 MiB reads load 16 GiB sooner (docs/BENCHMARKS.md, issue #62).
const DEVICE_READ: u64 = 4 << 20;
/// Pinned staging of such a load, all slots together: the DMA reads what the workers just
/// wrote. On the H200 machine 96 MiB loaded 16 GiB of random bits 4 % sooner than 72 MiB and
/// bf16 as soon; 128 MiB was no faster (docs/BENCHMARKS.md, issue #62).
const DEVICE_STAGING: u64 = 96 << 20;

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

    /// The range reads of a load into VRAM checked on the GPU, in a store whose chunks are at
    /// most `chunk_max` bytes: [`DEVICE_READ`], or less where the budget is smaller, or one
    /// whole chunk where chunks are larger.
    pub fn device_read(self, chunk_max: u64) -> u64 {
        self.max_read().min(DEVICE_READ).max(chunk_max)
    }

    /// Pinned staging slots of `read` bytes for a load into VRAM: checked on the GPU, two
    /// slots' worth of half the budget per slot (device staging beside the pinned range, no
    /// decoded copies on the host), and no more than [`DEVICE_STAGING`] in all; checked on the
    /// host, a quarter of the budget. Two per worker thread at most: a worker reads into one
    /// while the GPU works on its other.
    pub fn staging_slots(self, checked_on_gpu: bool, read: u64) -> u64 {
        let threads = rayon::current_num_threads().max(2) as u64;
        let share =
            if checked_on_gpu { ((self.0 / 2) / (2 * read)).min(DEVICE_STAGING / read) } else { (self.0 / 4) / read };
        share.clamp(2, 2 * threads)
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
        assert!(Budget::of(1).staging_slots(true, 1 << 20) >= 2 && Budget::of(1).staging_slots(false, 1 << 20) >= 2);
        assert_eq!(Budget::DEFAULT.device_read(256 << 10), DEVICE_READ);
        assert!(Budget::DEFAULT.staging_slots(true, DEVICE_READ) * DEVICE_READ <= DEVICE_STAGING);
        assert_eq!(Budget::of(1).device_read(256 << 10), MAX_READ_FLOOR);
        assert_eq!(Budget::DEFAULT.device_read(16 << 20), 16 << 20);
    }
}
