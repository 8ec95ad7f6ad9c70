//! Leases: objects a push (or a tag copy) holds while it relies on packs and manifests that no
//! tag names yet, so that gc keeps them. docs/GC.md gives the protocol; docs/FORMAT.md the
//! record layout.
//!
//! A lease names its owner by machine boot, pid namespace, pid and process start time (the
//! store tells from these whether the owner died).

use crate::error::Result;
use crate::id::ObjectId;
use crate::record;
use crate::ObjectKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Which process holds a lease (or the gc lock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// Host name, for messages.
    pub host: String,
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// The pid namespace (`/proc/self/ns/pid` link text).
    pub pid_ns: String,
    /// Process id.
    pub pid: u32,
    /// Process start time in clock ticks after boot (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
}

impl Owner {
    /// `pid P on HOST`, for messages.
    pub fn describe(&self) -> String {
        format!("pid {} on {}", self.pid, self.host)
    }
}

/// The stored form of a lease (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Format version (1).
    pub format: u32,
    /// Who holds it.
    pub owner: Owner,
    /// What it is for, e.g. `push app:latest`.
    pub purpose: String,
    /// Packs gc must keep whole (hex ids): those the holder wrote or deduplicated against.
    #[serde(default)]
    pub packs: BTreeSet<String>,
    /// Manifests gc must keep, with every chunk they name (hex ids).
    #[serde(default)]
    pub manifests: BTreeSet<String>,
}

impl record::Versioned for LeaseRecord {
    const FORMAT: u32 = 1;
    fn format(&self) -> u32 {
        self.format
    }
}

impl LeaseRecord {
    /// Parses a stored lease.
    pub fn from_json(bytes: &[u8], key: &str) -> Result<LeaseRecord> {
        record::decode(bytes, ObjectKind::Lease, key)
    }

    /// The packs it protects.
    pub fn pack_ids(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.packs.iter().filter_map(|h| ObjectId::from_hex(h).ok())
    }

    /// The manifests it protects.
    pub fn manifest_ids(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.manifests.iter().filter_map(|h| ObjectId::from_hex(h).ok())
    }
}

/// The first 16 hex digits of the name of every lease a client holding `token` writes
/// through a `gstore serve` with tokens: the server lets a token that is not an admin's
/// write and delete only leases named so (docs/SECURITY.md), so that one token cannot remove
/// another's leases. Derived by BLAKE3 in key-derivation mode, so it reveals nothing of the token.
pub fn owner_prefix(token: &[u8]) -> String {
    hex::encode(&blake3::derive_key("gstore 2026-11 lease owner", token)[..8])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::ObjectKey;

    #[test]
    fn lease_names_carry_the_owner_prefix_of_the_token() {
        let p = owner_prefix(b"some-token-0123456789");
        assert_eq!(p.len(), 16);
        assert_ne!(p, owner_prefix(b"other-token-0123456789"));
        assert!(ObjectKey::parse(&ObjectKey::Lease(format!("{p}{}", "0".repeat(16))).to_string()).is_ok());
    }

    #[test]
    fn a_record_round_trips_and_a_cut_one_is_damage() {
        let owner = Owner { host: "h".into(), boot_id: "b".into(), pid_ns: "n".into(), pid: 7, start_ticks: 9 };
        let r = LeaseRecord {
            format: 1,
            owner,
            purpose: "push t:1".into(),
            packs: [ObjectId::of(b"p").to_hex()].into(),
            manifests: Default::default(),
        };
        let bytes = serde_json::to_vec(&r).unwrap();
        assert_eq!(LeaseRecord::from_json(&bytes, "k").unwrap(), r);
        assert_eq!(r.pack_ids().collect::<Vec<_>>(), vec![ObjectId::of(b"p")]);
        assert!(matches!(
            LeaseRecord::from_json(&bytes[..bytes.len() - 1], "k"),
            Err(crate::FormatError::Corrupt { .. })
        ));
    }
}
