//! Per-store settings, kept in the backend as `config.json` and fixed at `gstore init`.

use crate::error::{Result, StoreError};
use serde::{Deserialize, Serialize};

/// The store format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Chunking, compression and packing parameters of one store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreConfig {
    /// Store format version (see docs/FORMAT.md).
    pub format: u32,
    /// FastCDC minimum chunk size in bytes.
    pub chunk_min: u32,
    /// FastCDC average (target) chunk size in bytes.
    pub chunk_avg: u32,
    /// FastCDC maximum chunk size in bytes.
    pub chunk_max: u32,
    /// Large files are cut in independent segments of this many bytes, one per core; a
    /// segment edge is always a chunk edge.
    pub segment_size: u64,
    /// zstd level for chunks that compress.
    pub zstd_level: i32,
    /// A pack is closed once it holds at least this many stored bytes.
    pub pack_target: u64,
    /// Whether chunks that look like 2- or 4-byte floats are tried with the byte-grouped float
    /// codec (codec 3) before zstd. Absent in stores made before it existed: on.
    #[serde(default = "float_codec_default")]
    pub float_codec: bool,
}

fn float_codec_default() -> bool {
    true
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            format: FORMAT_VERSION,
            chunk_min: 16 * 1024,
            chunk_avg: 64 * 1024,
            chunk_max: 256 * 1024,
            segment_size: 16 * 1024 * 1024,
            zstd_level: 1,
            pack_target: 48 * 1024 * 1024,
            float_codec: true,
        }
    }
}

impl StoreConfig {
    /// Checks the parameters against FastCDC's limits and each other.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(StoreError::Invalid(m));
        if self.format != FORMAT_VERSION {
            return bad(format!(
                "store format {} is not supported by this gstore (it reads format {FORMAT_VERSION})",
                self.format
            ));
        }
        let (min, avg, max) = (self.chunk_min as usize, self.chunk_avg as usize, self.chunk_max as usize);
        use fastcdc::v2020 as f;
        let in_range = (f::MINIMUM_MIN..=f::MINIMUM_MAX).contains(&min)
            && (f::AVERAGE_MIN..=f::AVERAGE_MAX).contains(&avg)
            && (f::MAXIMUM_MIN..=f::MAXIMUM_MAX).contains(&max)
            && min <= avg
            && avg <= max;
        if !in_range {
            return bad(format!(
                "chunk sizes min/avg/max {min}/{avg}/{max} are out of range: need {}..={} / {}..={} / {}..={} and min <= avg <= max",
                f::MINIMUM_MIN, f::MINIMUM_MAX, f::AVERAGE_MIN, f::AVERAGE_MAX, f::MAXIMUM_MIN, f::MAXIMUM_MAX
            ));
        }
        if self.segment_size < 4 * self.chunk_max as u64 {
            return bad(format!("segment size {} must be at least 4 x chunk max", self.segment_size));
        }
        if !(1..=19).contains(&self.zstd_level) {
            return bad(format!("zstd level {} is out of range 1..=19", self.zstd_level));
        }
        if self.pack_target < self.chunk_max as u64 {
            return bad(format!("pack target {} must be at least the chunk max", self.pack_target));
        }
        Ok(())
    }

    /// Parses and validates `config.json`.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let cfg: StoreConfig =
            serde_json::from_slice(bytes).map_err(|e| StoreError::corrupt("config", "config.json", e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_bad_sizes_are_refused() {
        StoreConfig::default().validate().unwrap();
        let c = StoreConfig { chunk_min: 1 << 20, chunk_avg: 1 << 16, ..StoreConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("out of range"));
        let c = StoreConfig { zstd_level: 0, ..StoreConfig::default() };
        assert!(c.validate().is_err());
    }
}
