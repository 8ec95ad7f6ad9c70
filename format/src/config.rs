//! Per-store settings, kept in the backend as `config.json` and fixed at `gstore init`.

use crate::error::{FormatError, Result};
use crate::ObjectKind;
use serde::{Deserialize, Serialize};

/// The store format version of an unencrypted store.
pub const FORMAT_VERSION: u32 = 1;
/// The store format version of an encrypted store (gstore before encryption refuses it).
pub const FORMAT_ENCRYPTED: u32 = 2;
/// How an encrypted store seals its objects (docs/FORMAT.md, "Encrypted stores").
pub const SEALING: &str = "aes-256-gcm-16k";
/// How an encrypted store names chunks: their keyed BLAKE3 ([`crate::ChunkIds::Keyed`]).
pub const CHUNK_IDS: &str = "blake3-keyed";

/// How an encrypted store is encrypted (docs/FORMAT.md, "Encrypted stores").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encryption {
    /// How objects are sealed: [`SEALING`].
    pub objects: String,
    /// How chunks are named: [`CHUNK_IDS`].
    pub chunk_ids: String,
    /// The keyed BLAKE3 (hex) of this config, serialized with an empty check, under a key
    /// derived from the master key: only a holder of the master key can make it, so a config
    /// changed in the bucket is refused.
    pub check: String,
}

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
    /// Whether the float codec's compressible lanes are Huffman-coded (lane codec 2, which a
    /// GPU decodes) rather than zstd frames (lane codec 1). Absent in stores made before
    /// Huffman lanes existed: on. Written only when off, so that configs written before it
    /// serialize as they did (an encrypted store's config check covers those bytes).
    #[serde(default = "float_codec_default", skip_serializing_if = "is_on")]
    pub huffman_lanes: bool,
    /// How packs are named. Absent in stores made before [`PackIds::HeaderFooter`]: whole
    /// (and so not written then, like `huffman_lanes`).
    #[serde(default = "PackIds::whole", skip_serializing_if = "PackIds::is_whole")]
    pub pack_ids: PackIds,
    /// A chunk is kept compressed only when its encoding saves at least this percentage of its
    /// bytes (`gstore init --min-saving`), else stored raw: restores and lazy fills copy raw
    /// chunks instead of decoding them. Absent: [`MIN_SAVING_DEFAULT`] (and written only when
    /// another value, like `huffman_lanes`).
    #[serde(default = "min_saving_default", skip_serializing_if = "is_min_saving_default")]
    pub min_saving: u8,
    /// How the store is encrypted (format 2); absent in an unencrypted store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
}

/// The percentage of its bytes a chunk's encoding must save to be kept, unless a store says
/// otherwise.
pub const MIN_SAVING_DEFAULT: u8 = 3;

fn min_saving_default() -> u8 {
    MIN_SAVING_DEFAULT
}

fn is_min_saving_default(percent: &u8) -> bool {
    *percent == MIN_SAVING_DEFAULT
}

fn float_codec_default() -> bool {
    true
}

fn is_on(setting: &bool) -> bool {
    *setting
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
            huffman_lanes: true,
            pack_ids: PackIds::HeaderFooter,
            min_saving: MIN_SAVING_DEFAULT,
            encryption: None,
        }
    }
}

impl StoreConfig {
    /// Checks the parameters against FastCDC's limits and each other.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(FormatError::Invalid(m));
        if self.min_saving > 100 {
            return bad(format!("min_saving is {} %: at most 100", self.min_saving));
        }
        match (self.format, &self.encryption) {
            (FORMAT_VERSION, None) => {}
            (FORMAT_ENCRYPTED, Some(e)) if e.objects == SEALING && e.chunk_ids == CHUNK_IDS => {}
            (FORMAT_ENCRYPTED, Some(e)) => {
                return bad(format!(
                    "this gstore cannot read an encrypted store sealed with {:?} and naming chunks by {:?} (it knows {SEALING:?} and {CHUNK_IDS:?})",
                    e.objects, e.chunk_ids
                ))
            }
            (FORMAT_ENCRYPTED, None) | (FORMAT_VERSION, Some(_)) => {
                return bad(format!("store format {} does not go with its encryption settings", self.format))
            }
            (f, _) => {
                return bad(format!(
                    "store format {f} is not supported by this gstore (it reads formats {FORMAT_VERSION} and {FORMAT_ENCRYPTED})"
                ))
            }
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

    /// This config as an encrypted store's, with the check `check` (the master key's keyed
    /// hash of a config) makes of it.
    pub fn encrypted(mut self, check: impl Fn(&[u8]) -> blake3::Hash) -> StoreConfig {
        self.format = FORMAT_ENCRYPTED;
        self.encryption =
            Some(Encryption { objects: SEALING.into(), chunk_ids: CHUNK_IDS.into(), check: String::new() });
        let made = check(&serde_json::to_vec(&self).expect("config serializes")).to_hex().to_string();
        self.encryption.as_mut().expect("just set").check = made;
        self
    }

    /// Checks that an encrypted store's config carries the check `check` (the master key's
    /// keyed hash of a config) makes of it.
    pub fn check_sealed(&self, check: impl Fn(&[u8]) -> blake3::Hash, store: &str) -> Result<()> {
        let Some(e) = &self.encryption else { return Ok(()) };
        let mut blank = self.clone();
        blank.encryption.as_mut().expect("encrypted").check = String::new();
        let want = check(&serde_json::to_vec(&blank).expect("config serializes"));
        // blake3::Hash compares in constant time.
        if blake3::Hash::from_hex(&e.check).ok() != Some(want) {
            return Err(FormatError::corrupt(
                ObjectKind::Config,
                store,
                "its check does not match the store's key: config.json was changed by someone without the key",
            ));
        }
        Ok(())
    }

    /// Parses and validates `config.json`.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let cfg: StoreConfig = serde_json::from_slice(bytes)
            .map_err(|e| FormatError::corrupt(ObjectKind::Config, "config.json", e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }
}

/// How a store names its packs (docs/FORMAT.md, "Pack names"). Readers check a pack's name only
/// for a tail that came through a caching tier (the store's `read_tail`): every reader checks each chunk
/// it decodes against the chunk's id, but nothing else covers a footer's entries. An HTTP
/// server checks an uploaded pack's name either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PackIds {
    /// BLAKE3 of all the pack's bytes: every stored byte hashed a second time, after its
    /// chunk's id (stores made before `HeaderFooter`).
    Whole,
    /// BLAKE3 of the pack's header (magic and salt) followed by its footer and trailer: the
    /// footer names every chunk's id, offset, lengths and codec, and each chunk's id is the
    /// hash of its plain bytes, which every reader checks.
    HeaderFooter,
}

impl PackIds {
    pub(crate) fn whole() -> PackIds {
        PackIds::Whole
    }

    pub(crate) fn is_whole(&self) -> bool {
        *self == PackIds::Whole
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

    #[test]
    fn a_config_written_before_huffman_lanes_serializes_as_it_did() {
        // An encrypted store's config check covers these bytes: reading and writing such a
        // config back must give them unchanged.
        let old = r#"{"format":1,"chunk_min":16384,"chunk_avg":65536,"chunk_max":262144,"segment_size":16777216,"zstd_level":1,"pack_target":50331648,"float_codec":true}"#;
        let cfg: StoreConfig = serde_json::from_str(old).unwrap();
        assert!(cfg.huffman_lanes);
        assert_eq!(cfg.pack_ids, PackIds::Whole, "packs of stores before are named by all their bytes");
        assert_eq!(serde_json::to_string(&cfg).unwrap(), old);
        let zstd_lanes = StoreConfig { huffman_lanes: false, ..StoreConfig::default() };
        let text = serde_json::to_string(&zstd_lanes).unwrap();
        assert!(text.contains(r#""float_codec":true,"huffman_lanes":false"#), "{text}");
        assert_eq!(serde_json::from_str::<StoreConfig>(&text).unwrap(), zstd_lanes);
        assert!(text.ends_with(r#""pack_ids":"header_footer"}"#), "a new store says how it names packs: {text}");
    }
}
